// TrainConfig, the settings of a training run, and the one table that lists them. The table
// (kTrainFields in train_config.cpp) drives everything that names a field: the "train" object
// of RUNDIR/config.json (written by every run, read back by --resume), `key=value` overrides
// and --config files, and the listing in `forge train --help`. A new setting is a member here
// and a row there, nowhere else.
//
// config.json keeps the keys and the exactness it always had: integers as JSON integers, the
// seed as an unsigned 64-bit integer, doubles in nlohmann's round-trip form, so that old run
// directories resume and a resumed run trains with bit-identical settings. Reading goes through
// the same checked parser as the command line (core/parse.h), with the same ranges.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <span>
#include <string>
#include <string_view>
#include <variant>

#include "forge/core/parse.h"
#include "forge/dist/buckets.h"

namespace forge {

struct TrainConfig {
  int steps = 1000;           // optimizer steps
  int batch_size = 8;         // B: sequences per micro-batch
  int seq_len = 0;            // T: 0 means the model's max_seq_len
  int grad_accum = 1;         // micro-batches per optimizer step
  double lr = 6e-4;           // peak learning rate
  double min_lr_frac = 0.1;   // cosine floor as a fraction of lr
  int warmup_steps = -1;      // -1: 5% of steps
  double weight_decay = 0.1;  // AdamW, on tensors with >= 2 dims
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double grad_clip = 1.0;    // global norm; <= 0 disables
  int eval_every = 100;      // validation every N steps (and after the last)
  int eval_windows = 64;     // validation windows of T + 1 tokens per evaluation
  uint64_t seed = 1337;      // initialisation and data order
  int save_every = 0;        // checkpoint every K steps (and after the last); 0: never
  int keep_checkpoints = 3;  // newest checkpoints kept; <= 0 keeps all
  // The final model's weights: "f32" (exact) or "bf16" (half the bytes). Checkpoints stay f32:
  // their weights are the master weights a resumed run continues from.
  std::string save_dtype = "f32";
  // Largest safetensors file of a saved model, in bytes; above it the weights are sharded with
  // an index (model_dir.h; the default is its kDefaultShardSize, transformers 4's 5GB).
  int64_t save_shard_size = 5'000'000'000;
  // Numerical guards (train/trainer.h): this many steps in a row whose loss or gradient norm is
  // not finite (each skipped, nothing updated) stop the run with an error, without a checkpoint.
  int max_bad_steps = 5;
  // A loss more than this many standard deviations above the previous 128 steps' mean is a
  // spike: a warning line and "loss_spike": true in metrics.jsonl (train/loss_outliers.h).
  // 0: no warnings (loss_z is logged either way).
  double loss_spike_z = 5.0;
  // Supervised fine-tuning (forge train --sft, data/sft_data.h). epochs > 0 sets steps to
  // ceil(epochs · train examples / (batch_size · grad_accum)) when the run starts (packed: the
  // steps whose rows hold epochs · train examples).
  int epochs = 0;
  double sft_val_frac = 0.05;            // held-out share of the examples
  std::string sft_overlong = "truncate";  // or "skip": examples longer than seq_len + 1 tokens
  // "pad": one example a row; "pack": several (forge train --pack, data/sft_data.h).
  std::string sft_layout = "pad";
  // Activation recomputation (model/recompute.h): "none", "attn", "mlp" or "full".
  std::string recompute = "none";
  // Data parallel (ZeRO-1): the smallest bucket of f32 gradients that is reduce-scattered on
  // its own, as soon as the backward has finished its layers (dist/buckets.h; 16 MiB). Any
  // size trains the same (a sum of each element over ranks either way); it moves only how much
  // of the reduction overlaps the backward and how many collectives a step makes.
  int64_t dp_bucket = kDefaultBucketBytes;
  bool quiet = false;  // no per-step progress lines (not a setting: not in the table)

  // Applies one key=value override; returns false if the key is not a training field. A bad
  // value throws forge::Error naming the key and the accepted range.
  bool apply_override(const std::string& key, const std::string& value);
};

// A member of TrainConfig and the values it accepts (inclusive for integers).
struct IntMember {
  int TrainConfig::*ptr;
  int lo, hi;
};
struct Uint64Member {
  uint64_t TrainConfig::*ptr;  // any value: seeds use all 64 bits
};
struct DoubleMember {
  double TrainConfig::*ptr;
  Interval range;
};
// A size in bytes >= 1: an integer, optionally followed by K, M, G, T (or KB, MB, GB, TB:
// powers of 1000, as huggingface_hub reads max_shard_size) or KiB, MiB, GiB, TiB (powers of
// 1024), in any letter case. config.json holds the number of bytes.
struct ByteSizeMember {
  int64_t TrainConfig::*ptr;
};
// One of a few names, spelled exactly; config.json holds the name as a string.
struct ChoiceMember {
  std::string TrainConfig::*ptr;
  std::span<const char* const> choices;
};

struct TrainField {
  const char* name;     // the key in config.json's "train" object and of key=value overrides
  const char* metavar;  // N or X, for --help
  const char* help;     // one line
  std::variant<IntMember, Uint64Member, DoubleMember, ByteSizeMember, ChoiceMember> member;
};

// Every field of TrainConfig that is a setting, in the order --help lists them.
std::span<const TrainField> train_fields();
// nullptr if `name` is not a training setting.
const TrainField* find_train_field(std::string_view name);

// Parses `text` into cfg's field; `what` names the setting in errors ("--steps", "lr").
void set_train_field(TrainConfig& cfg, const TrainField& f, const std::string& what,
                     std::string_view text);
// The field's value as config.json and --help write it: "1000", "0.0006", "1337", "bf16"
// (a name without the quotes of its JSON string).
std::string train_field_text(const TrainConfig& cfg, const TrainField& f);
// What the field accepts, short, for --help: ">= 1", "[0, 1)", "0 to 2^64-1", "any",
// "f32 or bf16".
std::string train_field_range(const TrainField& f);

// The "train" object of config.json, and its exact inverse. Keys missing from `j` keep their
// defaults (a run written before the key existed); unknown keys are ignored. `where` names the
// file in errors.
nlohmann::json train_config_json(const TrainConfig& cfg);
TrainConfig train_config_from_json(const nlohmann::json& j, const std::string& where);

}  // namespace forge
