// The request parser of `forge serve` (serve/openai_api.h) on the inputs fuzz_openai_request
// found (fuzz/regressions/openai_request-*) and on a nesting too deep for the fuzzer's input size:
// each is refused with ApiError 400, one short line naming the field, as every bad body is.
#include <gtest/gtest.h>

#include <initializer_list>
#include <string>

#include "forge/serve/openai_api.h"
#include "fuzz_regression.h"

namespace forge::serve {
namespace {

// parse_completion_request(body, chat) must throw ApiError 400 for `param` with a one-line
// message of at most 1 KB holding every one of `parts`.
void expect_refused(const std::string& body, bool chat, const std::string& param,
                    std::initializer_list<std::string> parts) {
  try {
    parse_completion_request(body, chat);
    ADD_FAILURE() << "no error";
  } catch (const ApiError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, param) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\r'), std::string::npos) << msg;
    EXPECT_LE(msg.size(), 1024u) << msg;
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << msg;
  }
}

// Was undefined behaviour: the float 1e19 converted to int64 before its range was checked.
TEST(OpenAiApiFuzzFinding, MaxTokensFloatOutOfInt64) {
  expect_refused(testing::fuzz_regression("openai_request-max_tokens_float_overflow"), false, "max_tokens",
                 {"max_tokens: expected an integer in [0, 2147483647], got 1e+19"});
}

// 2^63 as a float passed the old range check (int64's max converts to 2^63) and then overflowed.
TEST(OpenAiApiFuzzFinding, SeedFloatTwoToThe63) {
  expect_refused(testing::fuzz_regression("openai_request-seed_two_to_the_63"), false, "seed",
                 {"seed: expected an integer in [0, 9223372036854775807]"});
  // The largest float below 2^63 is an integer in range and is accepted as one.
  const CompletionRequest r = parse_completion_request(R"({"prompt": "a", "seed": 9223372036854774784.0})", false);
  EXPECT_EQ(r.sampling.seed, 9223372036854774784ull);
}

// Was a two-line message: the client's role printed raw.
TEST(OpenAiApiFuzzFinding, RoleWithNewline) {
  expect_refused(testing::fuzz_regression("openai_request-role_newline"), true, "messages[0].role",
                 {"expected system, developer, user or assistant, got 'x\\x0ay'"});
}

// Was a message echoing the whole rest of the body (nlohmann quotes the token it last read).
TEST(OpenAiApiFuzzFinding, UnterminatedStringIsNotEchoed) {
  expect_refused(testing::fuzz_regression("openai_request-unterminated_string_echo"), false, "",
                 {"the request body is not valid JSON: ", "..."});
}

// Seen in review (the fuzzer's inputs are 4 KB): a value nested 500,000 deep in a 1 MB body
// (forge serve's default --max-body) overflowed the stack when its error message dumped it.
TEST(OpenAiApiFuzzFinding, DeepNestingInAnErrorMessage) {
  const std::string deep = std::string(500000, '[') + std::string(500000, ']');
  expect_refused(R"({"prompt": "a", "max_tokens": )" + deep + "}", false, "max_tokens", {"got a list of 1 item"});
  expect_refused(R"({"messages": [{"role": )" + deep + R"(, "content": "a"}]})", true, "messages[0].role",
                 {"expected a string, got a list of 1 item"});
}

}  // namespace
}  // namespace forge::serve
