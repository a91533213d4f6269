// The fixture of the serve tests: a tiny random-weight GPT-2 in a model directory (the 300-token
// byte-level test tokenizer, context 128), and a forge::serve::Server on it started on a free
// loopback port, with an httplib client to talk to it.
#pragma once

#include <httplib.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_runner.h"
#include "forge/io/model_files.h"
#include "forge/model/config.h"
#include "forge/model/model_dir.h"
#include "forge/serve/server.h"

namespace forge::testing {

class ServeTest : public CliTest {
 protected:
  void SetUp() override {
    CliTest::SetUp();
    ModelConfig cfg = preset_config("tiny");
    cfg.vocab_size = 300;
    cfg.max_seq_len = 128;
    cfg.n_layer = 2;
    cfg.n_embd = 32;
    cfg.n_head = cfg.n_kv_head = 2;
    cfg.ffn_hidden = 64;
    Transformer<float> model(cfg);
    model.init_weights(11);
    const std::string tok = std::string(FORGE_SOURCE_DIR) + "/tests/data/tokenizer/post_processor/byte_level.json";
    save_model_dir(p("tiny-model"), model, {.files = {{"tokenizer.json", io::read_file(tok)}}});
  }
  void TearDown() override {
    client_.reset();
    if (server_) server_->stop();
    server_.reset();
    CliTest::TearDown();
  }
  // Starts the server on a free port with these options (log off unless asked).
  void start(serve::ServeOptions o = {}) {
    o.port = 0;
    if (o.max_body == serve::ServeOptions{}.max_body) o.max_body = 4096;
    o.log = false;
    server_ = std::make_unique<serve::Server>(p("tiny-model"), o);
    port_ = server_->start();
    ASSERT_GT(port_, 0);
    client_ = std::make_unique<httplib::Client>("127.0.0.1", port_);
    client_->set_read_timeout(30, 0);
  }
  httplib::Result post(const std::string& path, const std::string& body, const httplib::Headers& h = {}) {
    return client_->Post(path.c_str(), h, body, "application/json");
  }
  httplib::Result post(const std::string& path, const nlohmann::json& body) { return post(path, body.dump()); }
  // `forge generate --json` with these arguments against the same directory.
  nlohmann::json generate(const std::string& args) {
    const CmdResult r = forge("generate --model " + p("tiny-model") + " " + args + " --json");
    EXPECT_EQ(r.code, 0) << r.err;
    return nlohmann::json::parse(r.out);
  }

  std::unique_ptr<serve::Server> server_;
  std::unique_ptr<httplib::Client> client_;
  int port_ = 0;
};

}  // namespace forge::testing
