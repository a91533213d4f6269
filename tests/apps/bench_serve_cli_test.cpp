// `forge bench serve` on the CPU: on the serve tests' tiny model directory and on the tiny
// preset (random weights, synthetic tokenizer): the table, the JSON rows, bad arguments.
#include <gtest/gtest.h>

#include "serve/serve_test_model.h"

namespace forge {
namespace {

using nlohmann::json;
using testing::ServeTest;

TEST_F(ServeTest, BenchServeOnTheModelDirectoryAndOnTheTinyPreset) {
  const testing::CmdResult r =
      forge("bench serve --model " + p("tiny-model") +
            " --device cpu --streams 1,3 --requests 6 --max-tokens 4 --json-out " + p("b.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("| streams | requests | total tokens/s |"), std::string::npos) << r.out;
  const json j = json::parse(testing::slurp(p("b.json")));
  ASSERT_EQ(j["rows"].size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(j["rows"][i]["streams"], i == 0 ? 1 : 3);
    EXPECT_EQ(j["rows"][i]["requests"], 6);
    EXPECT_EQ(j["rows"][i]["equal_to_alone"], 6);  // one at a time in f32: the same answers
    EXPECT_GT(j["rows"][i]["tokens_per_s"].get<double>(), 0);
  }
  const testing::CmdResult t = forge(
      "bench serve --preset tiny --device cpu --streams 1,32 --requests 32 --max-tokens 2 "
      "--json-out " +
      p("t.json"));
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_NE(t.out.find("random bf16 weights"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("32 streams / 1 stream"), std::string::npos) << t.out;
  const json tj = json::parse(testing::slurp(p("t.json")));
  ASSERT_EQ(tj["rows"].size(), 2u);
  EXPECT_EQ(tj["rows"][1]["requests"], 32);

  expect_user_error(forge("bench serve --streams 1,0"),
                    "--streams: expected an integer in [1, 1024], got '0'");
  expect_user_error(forge("bench serve --device tpu"), "--device: expected cuda or cpu");
  expect_user_error(forge("bench serve --model " + p("tiny-model") + " --preset tiny"),
                    "give one of them");
  expect_user_error(forge("bench serve --model " + p("nope") + " --device cpu"),
                    "no such model directory");
}

}  // namespace
}  // namespace forge
