#include <cstdio>

#include <nlohmann/json.hpp>

#include "args.h"
#include "commands.h"
#include "forge/core/dtype.h"
#include "forge/core/error.h"
#include "forge/generate/sampler.h"
#include "forge/model/model_dir.h"

namespace forge::cli {

namespace {

const Command kGenerate = {
    "generate",
    "sample token ids from a model",
    {{"model", "DIR", "model directory"},
     {"prompt", "TEXT", "prompt text (needs a tokenizer: not in this version)"},
     {"ids", "1,2,3", "prompt token ids"},
     {"max-new-tokens", "N", "tokens to generate (default 64)"},
     {"temperature", "T", "0 = greedy (default 1.0)"},
     {"top-k", "K", "keep the K most likely tokens (default: all)"},
     {"top-p", "P", "nucleus sampling threshold (default 1.0 = off)"},
     {"seed", "S", "sampling seed (default 0)"},
     {"device", "D", "cpu (default) or cuda"},
     {"json", "", "print one JSON object with the new ids"}},
    false};

}  // namespace

int cmd_generate(const Argv& argv) {
  const Args a = parse_args(kGenerate, argv);
  if (a.help()) {
    print_help(kGenerate);
    return 0;
  }
  if (parse_device(a.get("device", "cpu")) != Device::kCpu)
    throw Error("--device cuda: this build generates on the CPU only");
  if (a.has("prompt")) throw Error("--prompt needs a tokenizer, which this version does not have yet; use --ids");
  const std::vector<int> ids = parse_id_list(a.require("ids"));
  Transformer<float> model = load_model_dir(a.require("model"));
  for (int id : ids)
    if (id >= model.config().vocab_size)
      throw Error(str("--ids: token id ", id, " is out of range for vocabulary size ", model.config().vocab_size));
  SampleOptions opt;
  opt.max_new_tokens = a.get_int("max-new-tokens", 64);
  opt.temperature = static_cast<float>(a.get_double("temperature", 1.0));
  opt.top_k = a.get_int("top-k", 0);
  opt.top_p = static_cast<float>(a.get_double("top-p", 1.0));
  opt.seed = static_cast<uint64_t>(a.get_int("seed", 0));
  if (opt.max_new_tokens < 0) throw Error("--max-new-tokens must be >= 0");
  if (opt.top_p <= 0 || opt.top_p > 1) throw Error("--top-p must be in (0, 1]");
  const auto out = generate(model, std::vector<int32_t>(ids.begin(), ids.end()), opt);
  if (a.has("json")) {
    std::printf("%s\n", nlohmann::json{{"ids", out}}.dump().c_str());
  } else {
    for (size_t i = 0; i < out.size(); ++i) std::printf("%s%d", i ? "," : "", out[i]);
    std::printf("\n");
  }
  return 0;
}

}  // namespace forge::cli
