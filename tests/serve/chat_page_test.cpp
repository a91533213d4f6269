// The chat page at GET /: served without the API key and self-contained; and, in headless
// Chromium (Debian's `chromium`; the tests skip without it), driven over the DevTools pipe: the
// page submitting a prompt on load (autorun=1) and streaming the answer into the DOM — the same
// text as the server's greedy answer over the API, in more than one chunk, with tokens/s shown
// — in prompt and chat mode; the API-key field sent as the Bearer token (401 without it); Stop
// aborting a request, and the page answering the next. A screenshot is kept in the build tree.
// The Chromium tests carry the ctest label `browser` (tests/CMakeLists.txt).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "serve/headless_chromium.h"
#include "serve/serve_test_model.h"
#include "forge_bin.h"

namespace forge {
namespace {

using nlohmann::json;
using testing::ServeTest;

std::string find_chromium() {
  for (const char* dir : {"/usr/bin/", "/usr/local/bin/", "/bin/"}) {
    const std::string path = std::string(dir) + "chromium";
    if (::access(path.c_str(), X_OK) == 0) return path;
  }
  return "";
}

TEST_F(ServeTest, ChatPageIsServedWithoutTheKeyAndSelfContained) {
  serve::ServeOptions o;
  o.api_key = "page-secret";
  start(o);
  auto r = client_->Get("/");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/html; charset=utf-8");
  const std::string& page = r->body;
  EXPECT_EQ(page.rfind("<!doctype html>", 0), 0u);
  for (const char* s :
       {"/v1/chat/completions", "/v1/completions", "getReader", "autorun", "Authorization",
        "temperature", "top_p", "max_tokens", "seed", "tokens/s", "id=\"stop\""})
    EXPECT_NE(page.find(s), std::string::npos) << s;
  for (const char* s : {"http://", "https://", "<link", "<script src", "<img", "page-secret"})
    EXPECT_EQ(page.find(s), std::string::npos) << s;  // no external assets, no secret
  // The API the page calls still needs the key.
  auto denied = post("/v1/completions", json{{"prompt", "hi"}, {"max_tokens", 2}});
  ASSERT_TRUE(denied);
  EXPECT_EQ(denied->status, 401);
}

class ChatPageBrowserTest : public ServeTest {
 protected:
  void SetUp() override {
    ServeTest::SetUp();
    chromium_ = find_chromium();
    if (chromium_.empty())
      GTEST_SKIP() << "chromium is not installed (scripts/setup.sh installs it)";
  }
  std::unique_ptr<testing::HeadlessChromium> browser() {
    return std::make_unique<testing::HeadlessChromium>(
        chromium_, p("profile"), p("chromium.log"),
        std::vector<std::string>{"--window-size=1100,700"});
  }
  std::string url(const std::string& query) const {
    return "http://127.0.0.1:" + std::to_string(port_) + "/?" + query;
  }
  // Opens the page and waits until it has loaded (30 s at most).
  static void open(testing::HeadlessChromium& b, const std::string& url) {
    b.open(url);
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (
        b.eval("document.readyState === 'complete' && document.getElementById('send') !== null") !=
        true) {
      ASSERT_LT(std::chrono::steady_clock::now(), end) << "the page did not load in 30 s";
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  // What the page shows once it has finished (data-state done, stopped or error; 30 s at most).
  static json wait_page(testing::HeadlessChromium& b) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    for (;;) {
      const json st = b.eval(
          "(() => { const e = (id) => document.getElementById(id);"
          " const a = e('answer'), stats = e('stats'), err = e('error');"
          " return {state: document.body ? document.body.dataset.state : '',"
          " text: a ? a.textContent : null, chunks: a ? Number(a.dataset.chunks) : -1,"
          " stats: stats ? stats.textContent : '', error: err ? err.textContent : ''}; })()");
      const std::string s = st.value("state", "");
      if (s == "done" || s == "stopped" || s == "error" || std::chrono::steady_clock::now() > end)
        return st;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  std::string log() const { return testing::slurp(p("chromium.log")); }

  std::string chromium_;
};

TEST_F(ChatPageBrowserTest, PromptModeStreamsTheGreedyAnswer) {
  start();
  auto r = post("/v1/completions",
                json{{"prompt", "hello world"}, {"max_tokens", 24}, {"temperature", 0}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const std::string want = json::parse(r->body)["choices"][0]["text"];
  ASSERT_FALSE(want.empty());
  auto b = browser();
  open(*b, url("mode=prompt&prompt=hello%20world&max_tokens=24&temperature=0&autorun=1"));
  const json st = wait_page(*b);
  ASSERT_EQ(st["state"], "done") << st.dump() << log();
  EXPECT_EQ(st["text"], want);
  EXPECT_GT(st["chunks"].get<int>(), 1);
  EXPECT_NE(st["stats"].get<std::string>().find("24 tokens in "), std::string::npos) << st["stats"];
  EXPECT_NE(st["stats"].get<std::string>().find(" tokens/s"), std::string::npos) << st["stats"];
}

TEST_F(ChatPageBrowserTest, ChatModeStreamsTheGreedyAnswerAndKeepsAScreenshot) {
  start();
  auto r =
      post("/v1/chat/completions", json{{"messages", {{{"role", "user"}, {"content", "hi there"}}}},
                                        {"max_tokens", 24},
                                        {"temperature", 0}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const std::string want = json::parse(r->body)["choices"][0]["message"]["content"];
  ASSERT_FALSE(want.empty());
  auto b = browser();
  open(*b, url("mode=chat&prompt=hi%20there&max_tokens=24&temperature=0&autorun=1"));
  const json st = wait_page(*b);
  ASSERT_EQ(st["state"], "done") << st.dump() << log();
  EXPECT_EQ(st["text"], want);
  EXPECT_GT(st["chunks"].get<int>(), 1);

  const json shot = b->call("Page.captureScreenshot", {{"format", "png"}});
  const std::string png = testing::base64_decode(shot.at("data").get<std::string>());
  ASSERT_GT(png.size(), 1000u);
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  const std::filesystem::path path =
      std::filesystem::path(FORGE_BIN).parent_path() / "test-artifacts" / "chat_page.png";
  std::filesystem::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << png;
  std::printf("chat page screenshot: %s\n", path.c_str());
}

TEST_F(ChatPageBrowserTest, TheApiKeyFieldIsSentAsTheBearerToken) {
  serve::ServeOptions o;
  o.api_key = "sesame";
  start(o);
  auto r = post("/v1/completions",
                json{{"prompt", "open"}, {"max_tokens", 6}, {"temperature", 0}}.dump(),
                {{"Authorization", "Bearer sesame"}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const std::string want = json::parse(r->body)["choices"][0]["text"];
  auto b = browser();
  open(*b, url("mode=prompt&max_tokens=6&temperature=0"));  // the page itself needs no key
  const std::string submit =
      "document.getElementById('input').value = 'open';"
      " document.getElementById('send').click(); true";
  b->eval(submit);
  json st = wait_page(*b);
  ASSERT_EQ(st["state"], "error") << st.dump();
  EXPECT_NE(st["error"].get<std::string>().find("HTTP 401"), std::string::npos) << st["error"];
  b->eval("document.getElementById('key').value = 'sesame'; " + submit);
  st = wait_page(*b);
  ASSERT_EQ(st["state"], "done") << st.dump();
  EXPECT_EQ(st["text"], want);
}

TEST_F(ChatPageBrowserTest, StopAbortsTheRequestAndThePageGoesOn) {
  start();
  auto b = browser();
  open(*b, url("mode=chat&max_tokens=100&temperature=0"));
  // send() runs up to its fetch synchronously, so Stop right after Send aborts that fetch.
  b->eval(
      "document.getElementById('input').value = 'hello';"
      " document.getElementById('send').click(); document.getElementById('stop').click(); true");
  json st = wait_page(*b);
  EXPECT_EQ(st["state"], "stopped") << st.dump();
  EXPECT_EQ(b->eval("document.getElementById('send').disabled"), false);
  b->eval(
      "document.getElementById('input').value = 'again';"
      " document.getElementById('send').click(); true");
  st = wait_page(*b);
  ASSERT_EQ(st["state"], "done") << st.dump();
  EXPECT_GT(st["chunks"].get<int>(), 1);
}

}  // namespace
}  // namespace forge
