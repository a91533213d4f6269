// forge serve's continuous batching over HTTP (serve/scheduler.h): concurrent clients decoded in
// one batch get the answers they get one at a time; a full queue answers 503 with an error object
// and the rest are served; a streaming client that hangs up frees its slot; /metrics parses as
// Prometheus text and counts what was asked. Server::hold keeps the scheduler from admitting, so
// the queue holds a known set of requests when it matters.
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <regex>
#include <sstream>
#include <thread>

#include "forge/core/error.h"
#include "serve/serve_test_model.h"

namespace forge {
namespace {

using nlohmann::json;
using testing::ServeTest;

// The samples of a Prometheus text page, `name{labels}` → value; every line must be a "# HELP",
// a "# TYPE name counter|gauge" before its samples, or a sample `name{label="v",...} number`.
std::map<std::string, double> parse_metrics(const std::string& text) {
  static const std::regex help(R"(# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) .+)");
  static const std::regex type(R"(# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge))");
  static const std::regex sample(
      R"(([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[a-zA-Z_][a-zA-Z0-9_]*="[^"]*"(,[a-zA-Z_][a-zA-Z0-9_]*="[^"]*")*\})? ([-+0-9.eE]+|NaN))");
  std::map<std::string, double> out;
  std::map<std::string, std::string> types;
  std::istringstream in(text);
  std::string line;
  std::smatch m;
  while (std::getline(in, line)) {
    if (std::regex_match(line, m, help)) continue;
    if (std::regex_match(line, m, type)) {
      types[m[1]] = m[2];
      continue;
    }
    EXPECT_TRUE(std::regex_match(line, m, sample)) << "not a sample line: '" << line << "'";
    if (m.empty()) continue;
    EXPECT_EQ(types.count(m[1]), 1u) << m[1] << " has no # TYPE line before it";
    out[m[1].str() + m[2].str()] = std::stod(m[4]);
  }
  return out;
}

class BatchingTest : public ServeTest {
 protected:
  std::map<std::string, double> metrics(const httplib::Headers& h = {}) {
    auto r = client_->Get("/metrics", h);
    EXPECT_TRUE(r);
    if (!r) return {};
    EXPECT_EQ(r->status, 200) << r->body;
    return parse_metrics(r->body);
  }
  // Polls /metrics until `name` reads `value` (10 s at most).
  bool wait_metric(const std::string& name, double value) {
    for (int i = 0; i < 1000; ++i) {
      if (metrics()[name] == value) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
  static json greedy(const std::string& prompt, int max_tokens) {
    return {{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}};
  }
  // POSTs `body` from its own connection.
  httplib::Result post_alone(const json& body) {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(30, 0);
    return c.Post("/v1/completions", body.dump(), "application/json");
  }
};

TEST_F(BatchingTest, ConcurrentClientsGetTheirOneAtATimeAnswers) {
  serve::ServeOptions o;
  o.max_batch = 4;
  start(o);
  // More clients than httplib's default thread pool on a machine of up to 16 cores: the server's
  // pool must hold every request it takes, or some would wait outside the queue.
  std::vector<std::string> prompts = {"hello world", "a", "the cat sat", "xyz xyz", "forge", "12345 678"};
  for (int i = 0; i < 11; ++i) prompts.push_back(str("prompt ", i, " of many"));
  std::vector<json> want;
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto r = post("/v1/completions", greedy(prompts[i], 6 + 3 * static_cast<int>(i % 6)));
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    want.push_back(json::parse(r->body)["choices"][0]);
  }
  server_->hold(true);  // all 17 queue up, then four decode together and the rest join as slots free
  std::vector<json> got(prompts.size());
  std::vector<std::thread> clients;
  for (size_t i = 0; i < prompts.size(); ++i)
    clients.emplace_back([&, i] {
      auto r = post_alone(greedy(prompts[i], 6 + 3 * static_cast<int>(i % 6)));
      if (r && r->status == 200) got[i] = json::parse(r->body)["choices"][0];
    });
  EXPECT_TRUE(wait_metric("forge_queue_depth", static_cast<double>(prompts.size())));
  server_->hold(false);
  for (auto& t : clients) t.join();
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_FALSE(got[i].is_null()) << "request " << i << " failed";
    EXPECT_EQ(got[i]["text"], want[i]["text"]) << prompts[i];
    EXPECT_EQ(got[i]["finish_reason"], want[i]["finish_reason"]);
  }
  EXPECT_TRUE(wait_metric("forge_active_slots", 0));
  EXPECT_EQ(metrics()["forge_queue_depth"], 0);
}

TEST_F(BatchingTest, AFullQueueAnswers503AndTheRestAreServed) {
  serve::ServeOptions o;
  o.max_batch = 2;
  o.max_queue = 1;
  start(o);
  auto first = post("/v1/completions", greedy("hello world", 10));
  ASSERT_TRUE(first);
  ASSERT_EQ(first->status, 200);
  const json want = json::parse(first->body)["choices"][0]["text"];
  server_->hold(true);  // 2 slots + 1 waiting = 3 requests in the server; the other 3 get 503
  constexpr int kBurst = 6;
  std::vector<int> status(kBurst, 0);
  std::vector<json> body(kBurst);
  std::atomic<int> answered{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < kBurst; ++i)
    clients.emplace_back([&, i] {
      auto r = post_alone(greedy("hello world", 10));
      if (r) {
        status[i] = r->status;
        body[i] = json::parse(r->body, nullptr, false);
      }
      ++answered;
    });
  for (int i = 0; i < 1000 && answered < 3; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(answered, 3);  // the refused ones, at once
  EXPECT_EQ(metrics()["forge_queue_depth"], 3);
  server_->hold(false);
  for (auto& t : clients) t.join();
  int ok = 0, busy = 0;
  for (int i = 0; i < kBurst; ++i) {
    if (status[i] == 200) {
      ++ok;
      EXPECT_EQ(body[i]["choices"][0]["text"], want);
    } else {
      ASSERT_EQ(status[i], 503) << body[i];
      ++busy;
      EXPECT_EQ(body[i]["error"]["type"], "server_error");
      EXPECT_EQ(body[i]["error"]["code"], "server_overloaded");
      EXPECT_FALSE(body[i]["error"]["message"].get<std::string>().empty());
    }
  }
  EXPECT_EQ(ok, 3);
  EXPECT_EQ(busy, 3);
  auto after = post("/v1/completions", greedy("hello world", 10));  // served again
  ASSERT_TRUE(after);
  EXPECT_EQ(after->status, 200);
  auto m = metrics();
  EXPECT_EQ(m["forge_requests_total{status=\"200\"}"], 5);
  EXPECT_EQ(m["forge_requests_total{status=\"503\"}"], 3);
}

// A model with a long context, so that a request can run long enough to be cut short.
TEST_F(BatchingTest, AStreamingClientHangingUpFreesItsSlot) {
  ModelConfig cfg = preset_config("tiny");
  cfg.vocab_size = 300;
  cfg.max_seq_len = 8192;
  cfg.n_layer = 1;
  cfg.n_embd = 16;
  cfg.n_head = cfg.n_kv_head = 2;
  cfg.ffn_hidden = 32;
  Transformer<float> model(cfg);
  model.init_weights(5);
  const std::string tok = std::string(FORGE_SOURCE_DIR) + "/tests/data/tokenizer/post_processor/byte_level.json";
  save_model_dir(p("long-model"), model, {.files = {{"tokenizer.json", io::read_file(tok)}}});
  serve::ServeOptions o;
  o.port = 0;
  o.log = false;
  o.max_batch = 1;
  server_ = std::make_unique<serve::Server>(p("long-model"), o);
  port_ = server_->start();
  client_ = std::make_unique<httplib::Client>("127.0.0.1", port_);
  client_->set_read_timeout(30, 0);

  json body = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 8000}, {"temperature", 0}};
  auto full = post("/v1/chat/completions", body);  // how long it runs when nobody hangs up
  ASSERT_TRUE(full);
  ASSERT_EQ(full->status, 200) << full->body;
  const int64_t n_full = json::parse(full->body)["usage"]["completion_tokens"];
  ASSERT_GT(n_full, 1000);
  const double generated0 = metrics()["forge_generated_tokens_total"];

  server_->hold(true);  // the first chunk (the role) goes out before any token: hang up on it
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/chat/completions";
  body["stream"] = true;
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  int received = 0;
  req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) {
    ++received;
    return false;
  };
  httplib::Client gone_client("127.0.0.1", port_);
  EXPECT_FALSE(gone_client.send(req));
  EXPECT_EQ(received, 1);
  server_->hold(false);  // now it decodes, and the server finds the client gone on writing
  EXPECT_TRUE(wait_metric("forge_requests_cancelled_total", 1));
  EXPECT_TRUE(wait_metric("forge_active_slots", 0));
  // Cut short (a few ids: the server sees the client gone on its second write), not run to the end.
  EXPECT_LT(metrics()["forge_generated_tokens_total"] - generated0, n_full / 2);
  auto r = post("/v1/completions", greedy("hello", 5));  // the one slot serves the next request
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["usage"]["completion_tokens"], 5);
}

TEST_F(BatchingTest, AContextLongerThanTheModelsIsAnError) {
  serve::ServeOptions o;
  o.context = 129;  // the test model's is 128
  try {
    serve::Server s(p("tiny-model"), o);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--context"), std::string::npos) << e.what();
  }
  o.context = 32;  // a shorter one bounds prompt + answer
  o.max_batch = 3;
  start(o);
  EXPECT_EQ(server_->context(), 32);
  EXPECT_EQ(server_->max_batch(), 3);
  auto r = post("/v1/completions", greedy("hello", 40));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_EQ(json::parse(r->body)["error"]["param"], "max_tokens");
}

TEST_F(BatchingTest, MetricsParseAndCountTheRequests) {
  serve::ServeOptions o;
  o.api_key = "k3y";
  start(o);
  const httplib::Headers auth = {{"Authorization", "Bearer k3y"}};
  auto denied = client_->Get("/metrics");
  ASSERT_TRUE(denied);
  EXPECT_EQ(denied->status, 401);
  const auto m0 = metrics(auth);
  EXPECT_EQ(m0.at("forge_generated_tokens_total"), 0);
  EXPECT_EQ(m0.at("forge_slots"), 8);  // the CPU default
  int64_t prompt = 0, generated = 0;
  for (bool stream : {false, true}) {
    json body = greedy("hello world", 7);
    body["stream"] = stream;
    body["stream_options"] = {{"include_usage", true}};
    auto r = post("/v1/completions", body.dump(), auth);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200);
    json usage;
    if (!stream) {
      usage = json::parse(r->body)["usage"];
    } else {  // the usage chunk is the last before [DONE]
      const size_t end = r->body.rfind("data: [DONE]");
      const size_t at = r->body.rfind("data: {", end);
      usage = json::parse(r->body.substr(at + 6, end - at - 8))["usage"];
    }
    prompt += usage["prompt_tokens"].get<int64_t>();
    generated += usage["completion_tokens"].get<int64_t>();
  }
  auto bad = post("/v1/completions", "{", auth);
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  auto m = metrics(auth);
  EXPECT_EQ(m["forge_requests_total{status=\"200\"}"], 2);
  EXPECT_EQ(m["forge_requests_total{status=\"400\"}"], 1);
  EXPECT_EQ(m.count("forge_requests_total{status=\"503\"}"), 0u);
  EXPECT_EQ(m["forge_prompt_tokens_total"], prompt);
  EXPECT_EQ(m["forge_generated_tokens_total"], generated);
  EXPECT_EQ(m["forge_queue_depth"], 0);
  EXPECT_EQ(m["forge_requests_cancelled_total"], 0);
  EXPECT_GT(m["forge_tokens_per_second"], 0);  // 14 ids in the last 10 s
  EXPECT_NEAR(m["forge_tokens_per_second"], generated / 10.0, 1e-9);
}

}  // namespace
}  // namespace forge
