#include "forge/core/parse.h"

#include <bit>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>

#include "forge/core/error.h"
#include "testing.h"

namespace forge {
namespace {

// The message a bad value gets, or "" when it parses.
template <typename F>
std::string error_of(F&& parse) {
  try {
    parse();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Parse, IntegersTakeTheWholeTextInRange) {
  EXPECT_EQ(parse_int("--steps", "2147483647", 1, std::numeric_limits<int>::max()), 2147483647);
  EXPECT_EQ(parse_int("x", "-7", -10, 10), -7);
  EXPECT_EQ(parse_int64("x", "-9223372036854775808", std::numeric_limits<int64_t>::min(), 0),
            std::numeric_limits<int64_t>::min());
  EXPECT_EQ(parse_uint64("seed", "18446744073709551615"), UINT64_MAX);
  EXPECT_EQ(parse_uint64("seed", "9007199254740993"), 9007199254740993ull);  // 2^53 + 1
  EXPECT_EQ(parse_uint64("seed", "0"), 0u);
  for (const char* bad : {"", " 5", "5 ", "+5", "5x", "0x10", "1e3", "1.0", "-", "4294967297"})
    EXPECT_THROW(
        parse_int("x", bad, std::numeric_limits<int>::min(), std::numeric_limits<int>::max()),
        Error)
        << "'" << bad << "'";
  for (const char* bad : {"-1", "-0", "18446744073709551616", "1e19", " 1"})
    EXPECT_THROW(parse_uint64("seed", bad), Error) << "'" << bad << "'";
  EXPECT_EQ(error_of([] { parse_int("--steps", "4294967297", 1, 2147483647); }),
            "--steps: expected an integer in [1, 2147483647], got '4294967297'");
  EXPECT_EQ(error_of([] { parse_int("--steps", "0", 1, 2147483647); }),
            "--steps: expected an integer in [1, 2147483647], got '0'");
  EXPECT_EQ(error_of([] { parse_uint64("seed", "-1"); }),
            "seed: expected an integer in [0, 18446744073709551615], got '-1'");
}

TEST(Parse, DoublesAreFiniteAndInsideTheirInterval) {
  EXPECT_EQ(parse_double("lr", "6e-4"), 6e-4);
  EXPECT_EQ(parse_double("lr", ".5"), 0.5);
  EXPECT_EQ(parse_double("x", "-2.5"), -2.5);
  for (const char* bad : {"", "nan", "inf", "-inf", "1e400", " 1", "1 ", "+1", "1,5", "0x1p3"})
    EXPECT_THROW(parse_double("x", bad), Error) << "'" << bad << "'";
  const Interval beta{0, 1, false, true};
  EXPECT_EQ(parse_double("beta1", "0", beta), 0.0);
  EXPECT_THROW(parse_double("beta1", "1", beta), Error);
  EXPECT_EQ(error_of([&] { parse_double("beta1", "1", beta); }),
            "beta1: expected a number in [0, 1), got '1'");
  EXPECT_EQ(error_of([] {
              parse_double("eps", "0", {0, INFINITY, true});
            }),
            "eps: expected a number > 0, got '0'");
  EXPECT_EQ(error_of([] { parse_double("lr", "-1", {0}); }),
            "lr: expected a number >= 0, got '-1'");
  EXPECT_EQ(error_of([] { parse_double("x", "nan"); }), "x: expected a finite number, got 'nan'");
}

// config.json stores doubles as nlohmann::json writes them; reading that text back must give
// the same bits, or a resumed run would train with a different lr.
TEST(Parse, DoublesRoundTripBitExactThroughJsonText) {
  std::mt19937_64 gen(42);
  int checked = 0;
  for (int i = 0; i < 20000; ++i) {
    const double x = std::bit_cast<double>(gen());
    if (!std::isfinite(x) || (x != 0 && std::fabs(x) < std::numeric_limits<double>::min()))
      continue;  // subnormals: from_chars may report them out of range; no setting uses them
    const std::string text = nlohmann::json(x).dump();
    const double y = parse_double("x", text);
    ASSERT_EQ(std::bit_cast<uint64_t>(y), std::bit_cast<uint64_t>(x)) << text;
    ++checked;
  }
  EXPECT_GT(checked, 19000);
  for (double x : {6e-4, 0.1, 0.95, 1e-8, 1.0 / 3.0, 2e-3, 0.1 + 0.2})
    EXPECT_EQ(parse_double("x", nlohmann::json(x).dump()), x);
}

TEST(Parse, Bools) {
  EXPECT_TRUE(parse_bool("tie_embeddings", "true"));
  EXPECT_FALSE(parse_bool("tie_embeddings", "0"));
  EXPECT_EQ(error_of([] { parse_bool("tie_embeddings", "yes"); }),
            "tie_embeddings: expected true or false, got 'yes'");
}

}  // namespace
}  // namespace forge
