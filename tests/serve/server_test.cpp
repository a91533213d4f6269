// forge serve's HTTP API in-process on a loopback port: answers equal to `forge generate`'s
// (greedy), usage counts, streaming, stop strings, every bad request's status and error object
// (the server answering the next good request), and the API key.
#include <gtest/gtest.h>

#include <sstream>

#include "forge/core/error.h"
#include "forge/generate/text_prompt.h"
#include "forge/tokenizer/tokenizer.h"
#include "serve/serve_test_model.h"

namespace forge {
namespace {

using nlohmann::json;
using testing::ServeTest;

// The `data:` payloads of a server-sent event stream, in order.
std::vector<std::string> sse_events(const std::string& body) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < body.size()) {
    const size_t end = body.find("\n\n", at);
    const std::string ev = body.substr(at, end == std::string::npos ? std::string::npos : end - at);
    EXPECT_EQ(ev.rfind("data: ", 0), 0u) << ev;
    out.push_back(ev.substr(6));
    if (end == std::string::npos) break;
    at = end + 2;
  }
  return out;
}

int64_t prompt_tokens(const std::string& dir, const std::string& text) {
  return static_cast<int64_t>(encode_text_prompt(tok::Tokenizer::load(dir + "/tokenizer.json"), text, false).size());
}

TEST_F(ServeTest, HealthAndModels) {
  start();
  auto h = client_->Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  EXPECT_EQ(json::parse(h->body), (json{{"status", "ok"}}));
  auto m = client_->Get("/v1/models");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 200);
  const json j = json::parse(m->body);
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 1u);
  EXPECT_EQ(j["data"][0]["id"], "tiny-model");
  EXPECT_EQ(j["data"][0]["object"], "model");
}

TEST_F(ServeTest, GreedyCompletionEqualsForgeGenerate) {
  start();
  const json want = generate("--prompt 'hello world' --max-new-tokens 12 --temperature 0");
  ASSERT_FALSE(want["text"].get<std::string>().empty());
  auto r = post("/v1/completions", json{{"model", "tiny-model"}, {"prompt", "hello world"}, {"max_tokens", 12},
                                        {"temperature", 0}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["model"], "tiny-model");
  EXPECT_EQ(j["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  ASSERT_EQ(j["choices"].size(), 1u);
  EXPECT_EQ(j["choices"][0]["text"], want["text"]);
  EXPECT_EQ(j["choices"][0]["finish_reason"], want["finish_reason"] == "length" ? "length" : "stop");
  const int64_t n_prompt = prompt_tokens(p("tiny-model"), "hello world");
  const int64_t n_gen = static_cast<int64_t>(want["ids"].size());
  EXPECT_EQ(j["usage"]["prompt_tokens"], n_prompt);
  EXPECT_EQ(j["usage"]["completion_tokens"], n_gen);
  EXPECT_EQ(j["usage"]["total_tokens"], n_prompt + n_gen);
}

TEST_F(ServeTest, GreedyChatEqualsForgeGenerateChat) {
  start();
  const json want = generate("--chat --prompt 'hi there' --max-new-tokens 10 --temperature 0");
  ASSERT_FALSE(want["text"].get<std::string>().empty());
  auto r = post("/v1/chat/completions", json{{"messages", {{{"role", "user"}, {"content", "hi there"}}}},
                                             {"max_tokens", 10},
                                             {"temperature", 0}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], want["text"]);
  EXPECT_EQ(j["usage"]["completion_tokens"], static_cast<int64_t>(want["ids"].size()));
  EXPECT_GT(j["usage"]["prompt_tokens"].get<int64_t>(), prompt_tokens(p("tiny-model"), "hi there"));  // + template
}

TEST_F(ServeTest, StreamedChunksJoinToTheAnswer) {
  start();
  for (const bool chat : {false, true}) {
    json body = {{"max_tokens", 12}, {"temperature", 0}};
    if (chat)
      body["messages"] = {{{"role", "user"}, {"content", "hi there"}}};
    else
      body["prompt"] = "hello world";
    const std::string path = chat ? "/v1/chat/completions" : "/v1/completions";
    auto whole = post(path, body);
    ASSERT_TRUE(whole);
    ASSERT_EQ(whole->status, 200);
    const json w = json::parse(whole->body)["choices"][0];
    body["stream"] = true;
    auto r = post(path, body);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200);
    EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
    const std::vector<std::string> ev = sse_events(r->body);
    ASSERT_GE(ev.size(), 3u) << r->body;
    EXPECT_EQ(ev.back(), "[DONE]");
    std::string text;
    for (size_t i = 0; i + 1 < ev.size(); ++i) {
      const json c = json::parse(ev[i]);
      EXPECT_EQ(c["object"], chat ? "chat.completion.chunk" : "text_completion");
      const json& ch = c["choices"][0];
      if (chat)
        text += ch["delta"].value("content", "");
      else
        text += ch["text"].get<std::string>();
      if (i + 2 < ev.size()) {
        EXPECT_TRUE(ch["finish_reason"].is_null()) << ev[i];
      }
    }
    EXPECT_EQ(text, chat ? w["message"]["content"] : w["text"]);
    EXPECT_EQ(json::parse(ev[ev.size() - 2])["choices"][0]["finish_reason"], w["finish_reason"]);
    if (chat) {
      EXPECT_EQ(json::parse(ev[0])["choices"][0]["delta"]["role"], "assistant");
    }

    // stream_options.include_usage: one more chunk before [DONE], no choices, the usage.
    body["stream_options"] = {{"include_usage", true}};
    auto u = post(path, body);
    ASSERT_TRUE(u);
    ASSERT_EQ(u->status, 200);
    const std::vector<std::string> uev = sse_events(u->body);
    ASSERT_EQ(uev.size(), ev.size() + 1);
    EXPECT_EQ(uev.back(), "[DONE]");
    const json last = json::parse(uev[uev.size() - 2]);
    EXPECT_TRUE(last["choices"].empty());
    EXPECT_EQ(last["usage"], json::parse(whole->body)["usage"]);
  }
}

TEST_F(ServeTest, StopStringsCutTheText) {
  start();
  const json req = {{"prompt", "hello world"}, {"max_tokens", 24}, {"temperature", 0}};
  auto r = post("/v1/completions", req);
  ASSERT_TRUE(r);
  const std::string full = json::parse(r->body)["choices"][0]["text"];
  // A one-character ASCII stop string from the middle of the answer.
  size_t i = full.size() / 2;
  while (i < full.size() && static_cast<unsigned char>(full[i]) >= 0x80) ++i;
  ASSERT_LT(i, full.size()) << "no ASCII character in the second half of: " << full;
  const std::string stop = full.substr(i, 1);
  for (const json& s : {json(stop), json::array({"\x01never", stop})}) {
    json q = req;
    q["stop"] = s;
    auto c = post("/v1/completions", q);
    ASSERT_TRUE(c);
    ASSERT_EQ(c->status, 200) << c->body;
    const json j = json::parse(c->body)["choices"][0];
    EXPECT_EQ(j["text"], full.substr(0, full.find(stop)));
    EXPECT_EQ(j["finish_reason"], "stop");
  }
}

TEST_F(ServeTest, BadRequestsGetErrorObjectsAndTheServerGoesOn) {
  start();
  const json good = {{"prompt", "hi"}, {"max_tokens", 3}, {"temperature", 0}};
  struct Case {
    std::string path, body;
    int status;
    std::string param;
  };
  auto with = [&](const std::string& k, const json& v) {
    json j = good;
    j[k] = v;
    return j.dump();
  };
  const std::vector<Case> cases = {
      {"/v1/completions", "{\"prompt\": \"hi\"", 400, ""},
      {"/v1/completions", "[1, 2]", 400, ""},
      {"/v1/completions", "{\"prompt\": \"\xff\xfe", 400, ""},  // its error message quotes invalid UTF-8
      {"/v1/completions", with("prompt", 5), 400, "prompt"},
      {"/v1/completions", with("temperature", "hot"), 400, "temperature"},
      {"/v1/completions", with("top_p", 1.5), 400, "top_p"},
      {"/v1/completions", with("max_tokens", -1), 400, "max_tokens"},
      {"/v1/completions", with("max_tokens", 1000000), 400, "max_tokens"},
      {"/v1/completions", with("max_tokens", "12"), 400, "max_tokens"},
      {"/v1/completions", with("n", 2), 400, "n"},
      {"/v1/completions", with("stop", 5), 400, "stop"},
      {"/v1/completions", with("stop", ""), 400, "stop"},
      {"/v1/completions", with("stream", "yes"), 400, "stream"},
      {"/v1/completions", with("stream_options", {{"include_usage", 1}}), 400, "stream_options.include_usage"},
      {"/v1/completions", with("seed", -3), 400, "seed"},
      {"/v1/completions", with("model", "gpt-4"), 400, "model"},
      {"/v1/completions", with("model", "two\nlines " + std::string(3000, 'x')), 400, "model"},  // quoted, cut
      {"/v1/completions", with("prompt", std::string(1000, 'x')), 400, "prompt"},
      {"/v1/chat/completions", good.dump(), 400, "messages"},
      {"/v1/chat/completions", json{{"messages", {{{"role", "user"}, {"content", 3}}}}}.dump(), 400,
       "messages[0].content"},
      {"/v1/completions", with("prompt", std::string(5000, 'x')), 413, ""},  // over max_body (4096)
      {"/v1/nope", good.dump(), 404, ""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.body.substr(0, 80));
    auto r = post(c.path, c.body);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, c.status) << r->body;
    const json e = json::parse(r->body);
    ASSERT_TRUE(e.contains("error")) << r->body;
    const std::string message = e["error"]["message"].get<std::string>();
    EXPECT_FALSE(message.empty());
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;  // one line
    EXPECT_LT(message.size(), 1024u) << message;
    EXPECT_TRUE(e["error"]["type"].is_string());
    EXPECT_TRUE(e["error"].contains("code"));
    EXPECT_EQ(e["error"]["param"], c.param.empty() ? json(nullptr) : json(c.param));
    auto ok = post("/v1/completions", good);
    ASSERT_TRUE(ok);
    EXPECT_EQ(ok->status, 200) << ok->body;
  }
  auto g = client_->Get("/nope\xff");
  ASSERT_TRUE(g);
  EXPECT_EQ(g->status, 404);
  EXPECT_TRUE(json::parse(g->body).contains("error"));
}

TEST_F(ServeTest, AClientLeavingAStreamDoesNotStopTheServer) {
  start();
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = json{{"prompt", "hello"}, {"max_tokens", 120}, {"temperature", 0}, {"stream", true}}.dump();
  req.set_header("Content-Type", "application/json");
  int received = 0;
  req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) {
    ++received;
    return false;  // hang up after the first piece
  };
  auto gone = client_->send(req);
  EXPECT_FALSE(gone);  // the client cancelled
  EXPECT_EQ(received, 1);
  for (int i = 0; i < 2; ++i) {  // the server answers the next requests (no SIGPIPE, no stuck lock)
    auto r = post("/v1/completions", json{{"prompt", "hi"}, {"max_tokens", 3}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
  }
}

TEST_F(ServeTest, APortInUseIsAnError) {
  start();
  serve::ServeOptions o;
  o.port = port_;
  o.log = false;
  serve::Server second(p("tiny-model"), o);
  EXPECT_THROW(second.start(), Error);
  auto h = client_->Get("/health");  // the first still answers
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
}

TEST_F(ServeTest, ApiKeyIsRequiredOnV1) {
  serve::ServeOptions o;
  o.api_key = "sekret";
  start(o);
  const json body = {{"prompt", "hi"}, {"max_tokens", 2}};
  for (const httplib::Headers& h : {httplib::Headers{}, httplib::Headers{{"Authorization", "Bearer wrong"}}}) {
    auto r = post("/v1/completions", body.dump(), h);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401);
    EXPECT_EQ(json::parse(r->body)["error"]["type"], "authentication_error");
    auto m = client_->Get("/v1/models", h);
    ASSERT_TRUE(m);
    EXPECT_EQ(m->status, 401);
  }
  const httplib::Headers auth = {{"Authorization", "Bearer sekret"}};
  auto r = post("/v1/completions", body.dump(), auth);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  auto m = client_->Get("/v1/models", auth);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 200);
  auto h = client_->Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);  // health checks need no key
}

}  // namespace
}  // namespace forge
