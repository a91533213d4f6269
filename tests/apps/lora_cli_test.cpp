// forge merge and forge train --lora from the command line: a merged model equals the base with
// the adapter folded in (merge_lora) and loads as a model directory with the adapter's tokenizer
// files; a mismatched adapter, --lora without --init-from and a bad --lora spec are one-line
// errors.
#include <filesystem>
#include <fstream>

#include "cli_runner.h"
#include "forge/model/lora_dir.h"
#include "forge/model/model_dir.h"
#include "testing.h"

namespace forge {
namespace {

namespace fs = std::filesystem;
using testing::CmdResult;
using testing::slurp;

class LoraCli : public testing::CliTest {};

ModelConfig small_llama() {
  ModelConfig c;
  c.family = Family::kLlama;
  c.vocab_size = 40;
  c.max_seq_len = 16;
  c.n_layer = 2;
  c.n_embd = 32;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.ffn_hidden = 48;
  return c;
}

TEST_F(LoraCli, MergeFoldsTheAdapterIntoTheBase) {
  Transformer<float> base(small_llama());
  base.init_weights(3);
  save_model_dir(p("base"), base);
  Transformer<float> lora(small_llama());
  lora.weights() = base.weights();
  lora.attach_lora(parse_lora_spec("r=4,alpha=8,targets=q,k,v,o,gate,up,down"), 4);
  const auto noise = testing::random_normal<float>(lora.adapter_weights().size(), 5, 0.1);
  lora.adapter_weights() = noise;
  save_adapter_dir(p("adapter"), *lora.adapter_table(), lora.adapter_weights(), p("base"),
                   {{"tokenizer.json", "{\"marker\": 1}"}});
  const CmdResult r = forge(str("merge --model ", p("base"), " --adapter ", p("adapter"), " --out ", p("merged")));
  ASSERT_EQ(r.code, 0) << r.err;
  std::vector<float> want = base.weights();
  merge_lora(base.table(), want, *lora.adapter_table(), lora.adapter_weights());
  EXPECT_EQ(load_model_dir(p("merged")).weights(), want);
  EXPECT_NE(want, base.weights());
  EXPECT_EQ(slurp(dir_ / "merged" / "tokenizer.json"), "{\"marker\": 1}");
  // forge generate --adapter merges in memory: the same greedy ids as the merged directory
  // (whose stand-in tokenizer.json goes: generate would read it).
  fs::remove(dir_ / "merged" / "tokenizer.json");
  const std::string gen = " --ids 1,2,3 --max-new-tokens 8 --temperature 0 --ignore-eos --json";
  const CmdResult g1 = forge(str("generate --model ", p("base"), " --adapter ", p("adapter"), gen));
  const CmdResult g2 = forge(str("generate --model ", p("merged"), gen));
  ASSERT_EQ(g1.code, 0) << g1.err;
  ASSERT_EQ(g2.code, 0) << g2.err;
  EXPECT_EQ(g1.out, g2.out);
  EXPECT_NE(g1.out.find("\"ids\""), std::string::npos) << g1.out;

  // An adapter for another base: one line naming the tensor.
  ModelConfig other = small_llama();
  other.ffn_hidden = 64;
  Transformer<float> wide(other);
  wide.init_weights(1);
  save_model_dir(p("wide"), wide);
  expect_user_error(forge(str("merge --model ", p("wide"), " --adapter ", p("adapter"), " --out ", p("m2"))),
                    "gate_proj");
  EXPECT_FALSE(fs::exists(dir_ / "m2"));
}

TEST_F(LoraCli, BadLoraFlagsAreOneLineErrors) {
  std::ofstream(p("ex.jsonl")) << "{\"prompt\": \"a\", \"response\": \"b\"}\n";
  expect_user_error(forge(str("train --sft ", p("ex.jsonl"), " --lora r=4 --out ", p("run"))), "--init-from");
  Transformer<float> base(small_llama());
  base.init_weights(3);
  save_model_dir(p("base"), base);
  expect_user_error(forge(str("train --init-from ", p("base"), " --sft ", p("ex.jsonl"), " --lora r=0 --out ", p("r"))),
                    "r must be > 0");
  expect_user_error(
      forge(str("train --init-from ", p("base"), " --sft ", p("ex.jsonl"), " --lora targets=q,x --out ", p("r"))),
      "unknown target");
  // A config file's "lora" entry, as an object, goes through the same checks.
  std::ofstream(p("cfg.json")) << "{\"lora\": {\"r\": 4, \"targets\": [\"q\", \"w\"]}}";
  expect_user_error(
      forge(str("train --config ", p("cfg.json"), " --init-from ", p("base"), " --sft ", p("ex.jsonl"), " --out ", p("r"))),
      "unknown target 'w'");
  EXPECT_FALSE(fs::exists(dir_ / "r"));
  const CmdResult help = forge("merge --help");
  EXPECT_EQ(help.code, 0);
  EXPECT_NE(help.out.find("--adapter"), std::string::npos);
  EXPECT_NE(forge("train --help").out.find("--lora"), std::string::npos);
}

}  // namespace
}  // namespace forge
