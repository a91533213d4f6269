// The interpreter's own contract beyond jinja2's output (jinja_golden_test.cpp has that): errors
// are one line naming the template line, unsupported tags say so, and the lexer's corners.
#include "forge/chat/jinja.h"

#include <gtest/gtest.h>

#include "forge/core/error.h"
#include "fuzz_regression.h"

namespace forge::chat::jinja {
namespace {

std::string render(const std::string& tpl, RenderInput in = {}) {
  return Template::parse(tpl, "t").render(in).text();
}

std::string error_of(const std::string& tpl, RenderInput in = {}) {
  try {
    render(tpl, std::move(in));
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    return e.what();
  }
  return "(rendered)";
}

TEST(JinjaTest, ErrorsNameTheLine) {
  // Syntax, at parse time.
  EXPECT_EQ(error_of("a\nb\n{% if %}"),
            "t line 3: expected an expression, got end of statement block");
  EXPECT_EQ(error_of("{% for x in y %}\n\n"),
            "t line 1: unexpected end of template: the 'for' here is never closed (looking for "
            "'endfor' or 'else')");
  EXPECT_EQ(error_of("x\n{{ 'abc }}"), "t line 2: unterminated string literal");
  EXPECT_EQ(error_of("{#\n\n never closed"), "t line 1: missing end of comment tag");
  EXPECT_EQ(error_of("\n{% if true %}{% endfor %}"), "t line 2: unknown tag 'endfor'");
  EXPECT_EQ(error_of("{{ 1 ) }}"), "t line 1: unexpected ')'");
  // Unknown filters and tests, at parse time even in a branch never taken.
  EXPECT_EQ(error_of("{% if false %}\n{{ x | shout }}{% endif %}"),
            "t line 2: no filter named 'shout'");
  EXPECT_EQ(error_of("\n\n{{ x is shouting }}"), "t line 3: no test named 'shouting'");
  // While rendering: the template's own exception, undefined values, type errors.
  EXPECT_EQ(error_of("{% for m in [1, 2] %}\n{% if m == 2 %}\n{{ raise_exception('two\nlines') }}"
                     "{% endif %}{% endfor %}"),
            "t line 3: raise_exception: two lines");
  EXPECT_EQ(error_of("ok\n{{ missing.attr }}"), "t line 2: 'missing' is undefined");
  EXPECT_EQ(error_of("{{ 'a' +\n 1 }}"), "t line 1: can only concatenate str (not \"int\") to str");
  EXPECT_EQ(error_of("\n{{ [1] | tojson }}{{ u | tojson }}"),
            "t line 2: Object of type Undefined is not JSON serializable");
  EXPECT_EQ(error_of("{% set a, b = [1, 2, 3] %}"),
            "t line 1: too many values to unpack (expected 2)");
}

TEST(JinjaTest, RunawayNestingIsAnErrorNotACrash) {
  EXPECT_EQ(error_of("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}"),
            "t line 1: nested more than 200 levels deep");
  EXPECT_EQ(error_of("{{ " + std::string(5000, '-') + "1 }}"),
            "t line 1: nested more than 200 levels deep");
  std::string ifs;
  for (int i = 0; i < 3000; ++i) ifs += "{% if true %}";
  EXPECT_EQ(error_of(ifs), "t line 1: nested more than 200 levels deep");
  // A namespace that holds itself cannot be printed or serialised (Python would recurse too).
  EXPECT_EQ(error_of("{% set ns = namespace() %}{% set ns.me = [ns] %}\n{{ ns }}"),
            "t line 2: value nested more than 100 levels deep");
  EXPECT_EQ(error_of("{% set ns = namespace() %}{% set ns.me = [ns] %}{{ ns.me | tojson }}"),
            "t line 1: Object of type Namespace is not JSON serializable");
}

TEST(JinjaTest, RunawayTemplatesStopWithAnError) {
  EXPECT_EQ(error_of("{% set ns = namespace(s='ab') %}{% for i in range(40) %}"
                     "{% set ns.s = ns.s ~ ns.s %}{% endfor %}"),
            "t line 1: text longer than 64 MiB: a runaway template?");
  EXPECT_EQ(error_of("{{ 'x' * 100000000000 }}"), "t line 1: repeated string too long");
  EXPECT_EQ(error_of("\n{{ [0] * 100000000000 }}"), "t line 2: repeated list too long");
  EXPECT_EQ(
      error_of("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"),
      "t line 1: more than 1000000 loop iterations: a runaway template?");
  EXPECT_EQ(render("{{ 2 ** 62 }} {{ 3 ** 0 }} {{ (-2) ** 3 }}"), "4611686018427387904 1 -8");
  // Empty repeated 2**63 - 1 times: empty, at once (the fuzzer's timeout: the loop ran 2**63 times).
  EXPECT_EQ(render("[{{ '' * 9223372036854775807 }}][{{ ([] * 9223372036854775807) | length }}]"), "[][0]");
}

TEST(JinjaTest, UnsupportedTagsSaySo) {
  for (const char* tag : {"macro m()", "call foo()", "filter upper", "include 'x'", "raw"})
    EXPECT_NE(error_of(str("{% ", tag, " %}"))
                  .find("is not supported by Forge's chat-template interpreter"),
              std::string::npos)
        << tag;
  EXPECT_EQ(error_of("{% break %}"), "t line 1: 'break' outside a for loop");
}

// Found by fuzz/fuzz_chat_template: the lexer, which reads the whole template before the parser
// starts, threw std::out_of_range on the literal 1e23456.75 of this input. Lexed as inf now, the
// input gets as far as the parser, which refuses it with a one-line error.
TEST(JinjaTest, FuzzFindingFloatOverflowReachesTheParser) {
  const std::string in = testing::fuzz_regression("chat_template-float_overflow");
  ASSERT_NE(in.find("1e23456.75"), std::string::npos);
  EXPECT_EQ(error_of(in), "t line 1: unexpected end of template: missing '}}'");
}

// Template integers are 64-bit (Python's grow): every result outside int64 is an error, not a
// wrapped number or undefined behaviour. Found by fuzz/fuzz_chat_template (`34 *
// 9223372036814775808`); the other operations of the same kind were checked with it.
TEST(JinjaTest, IntegerOverflowIsAnError) {
  const std::string kMin = "(-9223372036854775807 - 1)";
  const std::string overflow = "t line 1: integer overflow (template integers are 64-bit)";
  for (const std::string& expr :
       {std::string("9223372036854775807 + 1"), std::string("-9223372036854775807 - 2"),
        std::string("34 * 9223372036814775808"), kMin + " // -1", "-" + kMin, kMin + " | abs",
        std::string("[9223372036854775807, 1] | sum"), std::string("1e300 | int"),
        std::string("'1e300' | int"), std::string("'99999999999999999999' | int")})
    EXPECT_EQ(error_of("{{ " + expr + " }}"), overflow) << expr;
  // At the edges, without overflowing.
  EXPECT_EQ(render("{{ 9223372036854775806 + 1 }} {{ " + kMin + " % -1 }} {{ " + kMin +
                   " // 1 }} {{ -9223372036854775807 | abs }} {{ 9.2e18 | int }}"),
            "9223372036854775807 0 -9223372036854775808 9223372036854775807 "
            "9200000000000000000");
  EXPECT_EQ(render("{{ range(9223372036854775806, 9223372036854775807, 10) | list }} "
                   "{{ range(" +
                   kMin + " + 1, " + kMin + ", -10) | list }}"),
            "[9223372036854775806] [-9223372036854775807]");
  const std::string in = testing::fuzz_regression("chat_template-int_overflow");
  ASSERT_NE(in.find("34*9223372036814775808"), std::string::npos);
  EXPECT_EQ(error_of(in), overflow);
}

TEST(JinjaTest, LexerCorners) {
  // "}}" and "%}" close brackets first (jinja2's balancing stack), and are text inside strings.
  EXPECT_EQ(render("{{ {'a': {'b': 1}}}}"), "{'a': {'b': 1}}");
  EXPECT_EQ(render("{{ '%}' ~ \"}}\" }}{% if '%}' %}!{% endif %}"), "%}}}!");
  // A lone brace is text; "{{" needs both.
  EXPECT_EQ(render("{ x } {%- if true %} y{% endif %}"), "{ x } y");
  // Numbers: underscores, floats with exponents, a dot after an integer is attribute access.
  EXPECT_EQ(render("{{ 1_000 + 1 }} {{ 2.5e1 }} {{ 1E2 }} {{ [7, 8].1 }}"), "1001 25.0 100.0 8");
  // Out-of-range literals are what Python makes of them (found by fuzz/fuzz_chat_template).
  EXPECT_EQ(render("{{ 1e999 }} {{ -1e999 }} {{ 1e-999 }}"), "inf -inf 0.0");
  EXPECT_EQ(error_of("{{ 99999999999999999999 }}"),
            "t line 1: integer literal 99999999999999999999 is out of range");
  // Comments take their trailing newline (trim_blocks) and the indentation before them.
  EXPECT_EQ(render("a\n    {# c #}\nb"), "a\nb");
  // The generation block (transformers' assistant-mask marker) renders its body.
  EXPECT_EQ(render("{% generation %}x{% endgeneration %}"), "x");
}

TEST(JinjaTest, VariablesAndTheClock) {
  RenderInput in;
  in.variables.emplace_back("who", Value::string("world"));
  std::tm tm{};
  tm.tm_year = 99;
  tm.tm_mon = 11;
  tm.tm_mday = 31;
  in.now = tm;
  EXPECT_EQ(render("Hello {{ who }} on {{ strftime_now('%Y-%m-%d') }}", in),
            "Hello world on 1999-12-31");
  // Assignments at the top level shadow a variable; inside a loop they stay in the loop.
  EXPECT_EQ(
      render(
          "{% set who = who | upper %}{% for i in [1] %}{% set who = 'x' %}{% endfor %}{{ who }}",
          in),
      "WORLD");
}

TEST(JinjaTest, FloatReprIsPythons) {
  EXPECT_EQ(float_repr(0.1), "0.1");
  EXPECT_EQ(float_repr(1e16), "1e+16");
  EXPECT_EQ(float_repr(123456789012345678.0), "1.2345678901234568e+17");
  EXPECT_EQ(float_repr(1e-5), "1e-05");
  EXPECT_EQ(float_repr(0.0001), "0.0001");
  EXPECT_EQ(float_repr(-0.0), "-0.0");
  EXPECT_EQ(float_repr(2.0), "2.0");
  EXPECT_EQ(float_repr(1.5e300), "1.5e+300");
}

}  // namespace
}  // namespace forge::chat::jinja
