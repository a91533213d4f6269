// forge serve on the command line: --help, and bad arguments as one-line errors.
#include <gtest/gtest.h>

#include "asan.h"
#include "cli_runner.h"
#include "forge/io/model_files.h"
#include "forge/model/config.h"
#include "forge/model/model_dir.h"

namespace forge {
namespace {

using testing::CmdResult;

class ServeCliTest : public testing::CliTest {};

TEST_F(ServeCliTest, HelpListsTheRoutesAndFlags) {
  const CmdResult r = forge("serve --help");
  EXPECT_EQ(r.code, 0) << r.err;
  for (const char* s : {"--model", "--port", "--api-key", "--max-body", "/v1/chat/completions", "--max-batch",
                        "--max-queue", "--context", "/metrics", "503", "GET / is a chat page"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s;
}

TEST_F(ServeCliTest, BadArgumentsAreOneLineErrors) {
  expect_user_error(forge("serve --model " + p("missing")), "no such model directory");
  expect_user_error(forge("serve --bogus"), "--bogus");
  expect_user_error(forge("serve"), "--model");
  expect_user_error(forge("serve --model " + p("") + " --port 70000"), "--port");
  expect_user_error(forge("serve --model " + p("") + " --max-batch 0"), "--max-batch");
  expect_user_error(forge("serve --model " + p("") + " --max-queue -1"), "--max-queue");
  expect_user_error(forge("serve --model " + p("") + " --context 0"), "--context");
}

// A KV cache larger than the host can give (here: an address-space limit) is a one-line error
// naming the flags that size it, not a crash. Off under AddressSanitizer, whose shadow memory
// does not start under such a limit.
using testing::kAsan;  // tests/asan.h

TEST_F(ServeCliTest, ACacheTooLargeForTheHostIsAOneLineError) {
  if (kAsan) GTEST_SKIP() << "AddressSanitizer does not run under ulimit -v";
  // A small Llama with a context of 2^20 tokens: 2 layers x (k, v) x 2 KV heads x 8 channels x
  // 4 bytes = 256 MiB of cache a slot, 16 GiB for 64 slots, against a 3 GiB address space.
  ModelConfig cfg = preset_config("llama-10m");
  cfg.vocab_size = 300;
  cfg.max_seq_len = 1 << 20;
  cfg.n_layer = 2;
  cfg.n_embd = 32;
  cfg.n_head = 4;
  cfg.n_kv_head = 2;
  cfg.ffn_hidden = 48;
  Transformer<float> model(cfg);
  model.init_weights(3);
  const std::string tok = std::string(FORGE_SOURCE_DIR) + "/tests/data/tokenizer/post_processor/byte_level.json";
  save_model_dir(p("model"), model, {.files = {{"tokenizer.json", io::read_file(tok)}}});
  const CmdResult r = forge_env("ulimit -v 3000000; timeout 120", "serve --model " + p("model") + " --max-batch 64 --port 0");
  expect_user_error(r, "out of host memory (try a smaller --max-batch or --context");
}

}  // namespace
}  // namespace forge
