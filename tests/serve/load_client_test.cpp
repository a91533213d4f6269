// The load client (serve/load_client.h) against the in-process server: it counts answers that
// differ from the expected text and requests that fail (here: 401 without the key) instead of
// passing them, sums the usage counts, and mixes streamed and whole requests; its quantile.
#include "forge/serve/load_client.h"

#include <gtest/gtest.h>

#include "serve/serve_test_model.h"

namespace forge {
namespace {

using nlohmann::json;
using testing::ServeTest;

TEST(LoadClientQuantile, NearestRank) {
  std::vector<double> v;
  for (int i = 100; i >= 1; --i) v.push_back(i);
  EXPECT_EQ(serve::quantile(v, 0.5), 50);
  EXPECT_EQ(serve::quantile(v, 0.99), 99);
  EXPECT_EQ(serve::quantile(v, 1.0), 100);
  EXPECT_EQ(serve::quantile({7}, 0.99), 7);
  EXPECT_EQ(serve::quantile({}, 0.5), 0);
}

TEST_F(ServeTest, LoadClientChecksEveryAnswer) {
  start();
  auto r = post("/v1/completions",
                json{{"prompt", "hello world"}, {"max_tokens", 6}, {"temperature", 0}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  const json j = json::parse(r->body);
  const std::string right = j["choices"][0]["text"];
  const int64_t n = j["usage"]["completion_tokens"];
  auto c = post("/v1/chat/completions", json{{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                                             {"max_tokens", 6},
                                             {"temperature", 0}});
  ASSERT_TRUE(c);
  const int64_t n_chat = json::parse(c->body)["usage"]["completion_tokens"];

  serve::LoadOptions o;
  o.port = port_;
  o.clients = 3;
  o.requests = 8;  // 4 per case: 2 whole, 2 streamed
  o.max_tokens = 6;
  const serve::LoadResult res =
      serve::run_load(o, {{false, "hello world", right}, {true, "hi", "not the answer"}});
  EXPECT_EQ(res.ok, 4);
  EXPECT_EQ(res.failed, 4);
  EXPECT_EQ(res.mismatched, 4);
  ASSERT_EQ(res.failures.size(), 4u);
  for (const std::string& f : res.failures)
    EXPECT_NE(f.find("is not the expected \"not the answer\""), std::string::npos) << f;
  EXPECT_EQ(res.completion_tokens, 4 * n + 4 * n_chat);
  EXPECT_GT(res.ttft_p50_ms, 0);  // streams were among them
  EXPECT_GE(res.latency_p99_ms, res.latency_p50_ms);
  EXPECT_GT(res.tokens_per_s, 0);
}

TEST_F(ServeTest, LoadClientCountsFailedRequests) {
  serve::ServeOptions so;
  so.api_key = "k";
  start(so);
  serve::LoadOptions o;
  o.port = port_;
  o.clients = 2;
  o.requests = 4;
  o.max_failures = 2;
  serve::LoadResult res = serve::run_load(o, {{false, "hello", {}}});
  EXPECT_EQ(res.ok, 0);
  EXPECT_EQ(res.failed, 4);
  EXPECT_EQ(res.mismatched, 0);
  ASSERT_EQ(res.failures.size(), 2u);
  EXPECT_NE(res.failures[0].find("HTTP 401"), std::string::npos) << res.failures[0];
  o.api_key = "k";
  res = serve::run_load(o, {{false, "hello", {}}});
  EXPECT_EQ(res.ok, 4);
  EXPECT_THROW(serve::run_load(o, {}), Error);
}

}  // namespace
}  // namespace forge
