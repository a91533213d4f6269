// forge merge --model BASE --adapter ADAPTERDIR --out OUTDIR: a LoRA adapter (a PEFT adapter
// directory, what forge train --lora saves) folded into its base, W += (alpha / r)·B·A, and
// saved as a Hugging Face model directory like every other saved model.
#include <cstdio>
#include <iterator>

#include "args.h"
#include "commands.h"
#include "forge/core/error.h"
#include "forge/io/model_files.h"
#include "forge/model/lora.h"
#include "forge/model/lora_dir.h"
#include "forge/model/model_dir.h"

namespace forge::cli {

namespace {

const Command kMerge = {
    "merge",
    "fold a LoRA adapter into its base model and save the full model",
    {{"model", "MODELDIR", "the base model (a Hugging Face model directory)"},
     {"adapter", "DIR", "the adapter: a PEFT LoRA directory (forge train --lora's RUNDIR/model)"},
     {"out", "OUTDIR", "where the merged model is written"},
     {"save-dtype", "f32|bf16", "dtype of the saved weights (default f32)"}},
    false,
    "",
    "W += (alpha/r)·B·A for every adapted projection, in f32 with each sum accumulated in double.\n"
    "The output carries the adapter directory's tokenizer files and generation_config.json, or\n"
    "the base model's where the adapter has none. An adapter whose shapes, layers or targets do\n"
    "not fit the base is refused, naming the tensor."};

}  // namespace

int cmd_merge(const Argv& argv) {
  const Args a = parse_args(kMerge, argv);
  if (a.help()) {
    print_help(kMerge);
    return 0;
  }
  const std::string base_dir = a.require("model"), adapter_dir = a.require("adapter"), out = a.require("out");
  const io::StDType dtype = save_dtype_from_name(a.get("save-dtype", "f32"));
  Transformer<float> model = load_model_dir(base_dir, GradBuffers::kNone);
  const LoadedAdapter adapter = load_adapter_dir(adapter_dir, model.config());
  const AdapterTable table(model.config(), adapter.lora);
  merge_lora(model.table(), model.weights(), table, adapter.weights);
  // Tokenizer files travel together from one place (io/model_files.h): the adapter's if it has a
  // tokenizer.json, else the base's.
  io::FileSet files = io::read_files(adapter_dir, io::kTokenizerFiles);
  if (!files.count("tokenizer.json")) files = io::read_files(base_dir, io::kTokenizerFiles);
  const char* gen[] = {io::kGenerationConfigFile};
  io::FileSet g = io::read_files(adapter_dir, gen);
  if (g.empty()) g = io::read_files(base_dir, gen);
  files.insert(g.begin(), g.end());
  save_model_dir(out, model, {dtype, kDefaultShardSize, files});
  std::printf("merged %s (r=%d, alpha=%g, %zu tensors) into %s: saved %s\n", adapter_dir.c_str(), adapter.lora.r,
              adapter.lora.alpha, table.params().size(), base_dir.c_str(), out.c_str());
  return 0;
}

}  // namespace forge::cli
