#include <cstdio>
#include <filesystem>
#include <limits>
#include <optional>

#include <nlohmann/json.hpp>

#include "args.h"
#include "commands.h"
#include "forge/core/dtype.h"
#include "forge/core/error.h"
#include "forge/data/corpus.h"
#include "forge/generate/sampler.h"
#include "forge/tokenizer/tokenizer.h"
#include "forge/model/model_dir.h"

namespace forge::cli {

namespace {

const Command kGenerate = {
    "generate",
    "sample token ids from a model",
    {{"model", "DIR", "model directory"},
     {"prompt", "TEXT", "prompt text (encoded with the model directory's tokenizer.json)"},
     {"ids", "1,2,3", "prompt token ids"},
     {"max-new-tokens", "N", "tokens to generate (default 64)"},
     {"temperature", "T", "0 = greedy (default 1.0)"},
     {"top-k", "K", "keep the K most likely tokens (default: all)"},
     {"top-p", "P", "nucleus sampling threshold (default 1.0 = off)"},
     {"seed", "S", "sampling seed, 0 to 2^64-1 (default 0)"},
     {"device", "D", "cpu (default) or cuda"},
     {"json", "", "print one JSON object with the new ids"}},
    false,
    "",
    "At temperature 0 the most likely token is taken (greedy)."};

}  // namespace

int cmd_generate(const Argv& argv) {
  const Args a = parse_args(kGenerate, argv);
  if (a.help()) {
    print_help(kGenerate);
    return 0;
  }
  if (parse_device(a.get("device", "cpu")) != Device::kCpu)
    throw Error("--device cuda: this build generates on the CPU only");
  if (a.has("prompt") == a.has("ids")) throw Error("give exactly one of --prompt TEXT and --ids 1,2,3");
  const int int_max = std::numeric_limits<int>::max();
  SampleOptions opt;
  opt.max_new_tokens = a.get_int("max-new-tokens", 64, 0, int_max);
  // The sampler holds these two as floats; the ranges keep them finite there.
  opt.temperature =
      static_cast<float>(a.get_double("temperature", 1.0, {0, std::numeric_limits<float>::max()}));
  opt.top_p = static_cast<float>(a.get_double("top-p", 1.0, {0, 1, true, false}));
  opt.top_k = a.get_int("top-k", 0, 0, int_max);  // 0: all
  opt.seed = a.get_uint64("seed", 0);             // all 64 bits key the sampler's Philox stream
  const std::string dir = a.require("model");
  Transformer<float> model = load_model_dir(dir);
  std::optional<tok::Tokenizer> tokenizer;
  if (std::filesystem::exists(dir + "/tokenizer.json")) tokenizer = tok::Tokenizer::load(dir + "/tokenizer.json");
  std::vector<int> ids;
  if (a.has("prompt")) {
    if (!tokenizer) throw Error(str(dir, ": no tokenizer.json, so --prompt cannot be encoded; use --ids"));
    for (int32_t id : tokenizer->encode(a.get("prompt"))) ids.push_back(id);
    if (ids.empty()) throw Error("--prompt is empty");
  } else {
    ids = parse_id_list(a.get("ids"));
  }
  for (int id : ids)
    if (id >= model.config().vocab_size)
      throw Error(str("--ids: token id ", id, " is out of range for vocabulary size ", model.config().vocab_size));
  const auto out = generate(model, std::vector<int32_t>(ids.begin(), ids.end()), opt);
  const std::string text = tokenizer ? sanitize_utf8(tokenizer->decode(out)) : "";
  if (a.has("json")) {
    nlohmann::json j = {{"ids", out}};
    if (tokenizer) j["text"] = text;
    std::printf("%s\n", j.dump().c_str());
  } else if (tokenizer) {
    std::printf("%s\n", text.c_str());
  } else {
    for (size_t i = 0; i < out.size(); ++i) std::printf("%s%d", i ? "," : "", out[i]);
    std::printf("\n");
  }
  return 0;
}

}  // namespace forge::cli
