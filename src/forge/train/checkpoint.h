// Checkpoints: RUNDIR/checkpoints/step_NNNNNN/, a Hugging Face model directory (config.json,
// model.safetensors or its shards, the run's tokenizer files and generation_config.json) plus
//   optimizer.safetensors  Adam's m and v as F32 tensors "m.<name>" and "v.<name>", shaped like
//                          the parameters in model.safetensors (the f32 weights there are the
//                          master weights: nothing else to store; so a checkpoint's weights
//                          are always F32, whatever save_dtype the final model gets)
//   trainer_state.json     {"format", "version": 2, "step", "seed",
//                          "rng": {"loader": {"seed", "stream", "offset"}}, "data_loader":
//                          {"rng_offset"}, "config": the full run configuration, and for f16
//                          runs "loss_scale": {"scale", "good_steps", "skipped_total",
//                          "growth_interval", "step_scale", "skipped"}, and "skipped_steps":
//                          the updates the numerical guard skipped (ops/step_guard.h; Adam's t
//                          lags the step by it; absent in older files: 0)}
//                          rng.loader is TrainLoader's Philox state: its stream must be
//                          TrainLoader::kRngStream (1) and seed/offset must agree with "seed"
//                          and data_loader.rng_offset, or loading fails. Version 1 files (which
//                          wrote stream 0, wrongly: the loader always drew from stream 1) still
//                          load; their rng entry is ignored.
// "step" counts the optimizer steps completed: resuming runs step `step` next. Everything a step
// depends on is here exactly (f32 bits, integer counters; the LR is a function of the step), so
// a resumed run is bit-identical to one that never stopped.
//
// Atomicity (io::AtomicDir): a checkpoint is written under checkpoints/.tmp-step_NNNNNN, every
// file fsync'd, then the directory is renamed and the parent fsync'd. A crash at any moment
// leaves either the complete checkpoint or a .tmp- directory that readers ignore and the next
// save removes; a save that fails with an error (a full disk, an unwritable directory) removes
// its .tmp- directory itself and leaves every earlier checkpoint as it was. Files are never
// replaced one by one inside a checkpoint directory, so no mix of an old model.safetensors with
// a new optimizer.safetensors or trainer_state.json can exist under a step_ name: a directory
// of that name holds the files of one save. Old checkpoints are pruned (keep) only after the
// new one is in place.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "forge/io/model_files.h"
#include "forge/model/model_dir.h"
#include "forge/model/transformer.h"
#include "forge/ops/loss_scale.h"

namespace forge {

struct TrainerState {
  int step = 0;                    // optimizer steps completed
  uint64_t seed = 0;               // the run's seed (initialisation and data order)
  uint64_t loader_rng_offset = 0;  // TrainLoader's Philox offset: its whole position
  nlohmann::json config;           // {"model": config.json, "train": {...}, "data": ..., ...}
  // f16 runs: the dynamic loss scale after `step` (StepRunner::loss_scale_state()).
  std::optional<LossScaleState> loss_scale = std::nullopt;
  int skipped_steps = 0;  // updates the numerical guard skipped (StepRunner::set_skipped_updates)
};

// What a checkpoint holds, in memory (the model without gradient buffers: the runner trains its
// own copy). m and v are flat buffers like model.weights() (padding
// rows of the embedding zero).
struct Checkpoint {
  Transformer<float> model;
  std::vector<float> m, v;
  TrainerState state;
};

// "step_000042".
std::string checkpoint_name(int step);

// Writes RUNDIR/checkpoints/step_NNNNNN (replacing one of the same step) atomically, then
// deletes the oldest complete checkpoints until `keep` remain (keep <= 0: keep all). `files`
// (tokenizer files, generation_config.json) are written beside the weights, which are sharded
// above `shard_size` bytes (model_dir.h). Returns the checkpoint's path.
std::string save_checkpoint(const std::string& run_dir, const Transformer<float>& model,
                            const std::vector<float>& m, const std::vector<float>& v,
                            const TrainerState& state, int keep, const io::FileSet& files = {},
                            int64_t shard_size = kDefaultShardSize);

// Complete checkpoints of a run, oldest first: (step, path).
std::vector<std::pair<int, std::string>> list_checkpoints(const std::string& run_dir);

// Reads a checkpoint directory; throws forge::Error naming the file and the problem.
Checkpoint load_checkpoint(const std::string& dir);

}  // namespace forge
