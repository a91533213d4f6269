// The training loop: micro-batches with gradient accumulation, global-norm clipping, AdamW,
// the LR schedule, periodic validation, and what a run leaves in its directory:
//   metrics.jsonl   one JSON object per step (step, loss, lr, grad_norm, tokens_per_s, and
//                   val_loss on evaluation steps)
//   loss.svg        the loss curves, redrawn at every evaluation
//   config.json     the full run configuration (model, training, data, device, precision)
//   model/          the final weights as a Hugging Face model directory, in save_dtype (f32 or
//                   bf16), sharded above save_shard_size bytes (model/model_dir.h)
//   checkpoints/    step_NNNNNN/ every save_every steps and when stopped (checkpoint.h; f32)
//   tokenizer.json, tokenizer_config.json, special_tokens_map.json, chat_template.jinja
//                   the run's tokenizer files (those that exist), copied unchanged into every
//                   model it saves; config.json's "tokenizer_files" lists them for resume().
//                   They come from one place, the first of: an --init-from model that has a
//                   tokenizer.json; files already in the run directory before it began (forge
//                   quickstart puts its tokenizer there); the --data directory (forge data
//                   prepare writes them there); an --init-from model's files without one.
//                   The init model's win over the data's: its embedding rows are that
//                   tokenizer's ids, and a fine-tune keeps them. When the data directory's
//                   tokenizer.json differs, a one-line note says so (the shards may hold
//                   another tokenizer's ids; which side is wrong, Forge cannot tell).
//   generation_config.json  the same for generation settings: the --init-from model's file, or
//                   one naming the end-of-text token of the run's tokenizer (generate/
//                   generation_config.h); none when the run has no tokenizer
//
// Supervised fine-tuning (RunOptions::sft): the data is a JSONL file of chat examples, encoded
// with the run's tokenizer and chat template (data/sft_data.h), one example per row, targets -1
// outside assistant turns. Every step reads its grad_accum micro-batches first and weights each
// by its share of the step's trained targets, so the loss and its gradient are the mean over all
// trained tokens of the step (with token windows every share is exactly 1 / grad_accum).
// Validation is the held-out examples' mean over trained tokens; epochs > 0 sets steps.
//
// Three ways in: train() from fresh weights, train_from() from a Hugging Face model directory,
// resume() from a run's newest checkpoint. All three run the same loop, so a resumed run logs
// bit-identical losses: metrics.jsonl is cut back to the checkpoint's step and continued.
//
// Stopping: when *RunOptions::stop becomes non-zero (the CLI's SIGINT/SIGTERM handler sets
// it), the loop finishes the current step, writes a checkpoint and returns.
//
// Numerical guards: a step whose loss or global gradient norm is not finite updates nothing
// (ops/step_guard.h: weights and Adam state stay bit for bit, Adam's t counts only the updates
// taken, the step's data and LR position are spent as usual). Its metrics.jsonl line has
// "skipped": true and a null loss or grad_norm, every line from then on the running count
// "skipped_steps" (f16 loss-scale overflows included), and a warning goes to stderr. After
// max_bad_steps such steps in a row the run throws forge::Error (one line: which steps, and the
// last checkpoint, which no bad step touched) without writing a checkpoint or a model. An f16
// overflow skip is the loss scaler's business (the scale halves) and counts as bad only once
// the scale it ran at was <= 1: at that point the gradients are not finite unscaled either.
// The run of bad steps starts from zero when a run is resumed.
// Loss spikes (train/loss_outliers.h): every line after the first 128 finite losses has
// "loss_z", the loss's z-score against the previous 128; above loss_spike_z it is a spike:
// "loss_spike": true and a warning on stderr.
//
// Faults while saving: a checkpoint or model that cannot be written (a full disk, a file-size
// limit, an unwritable directory) throws forge::Error naming the file and the OS error; the
// save's temporary directory is removed and every earlier checkpoint is left as it was
// (checkpoint.h). A metrics.jsonl line that cannot be written stops the run the same way.
#pragma once

#include <csignal>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "forge/data/loader.h"
#include "forge/dist/communicator.h"
#include "forge/model/config.h"
#include "forge/model/lora.h"
#include "forge/train/fault_inject.h"
#include "forge/train/runner.h"
#include "forge/train/train_config.h"

namespace forge {

struct TrainResult {
  double first_val_loss = 0, last_val_loss = 0;
  double last_train_loss = 0;
  double seconds = 0;
  int steps_done = 0;        // optimizer steps completed, counting those before a resume
  bool interrupted = false;  // stopped through RunOptions::stop (a checkpoint was written)
};

struct RunOptions {
  // Polled after every step; non-zero: checkpoint and return. A signal handler may set it.
  const volatile std::sig_atomic_t* stop = nullptr;
  bool quiet = false;  // no per-step progress lines (as TrainConfig::quiet, for resume())
  // Where the steps run (train/runner.h) and in what precision; both are recorded in the run
  // configuration. Empty means "not chosen": a new run takes cpu and the device's default
  // precision (cuda: bf16; cpu: fp32, its only one); resume() takes the run's own, and a device
  // chosen without a precision keeps the run's precision when the device is the run's.
  std::string device;     // "cpu" or "cuda"
  std::string precision;  // "fp32", "bf16" or "fp16" (f16 with dynamic loss scaling; cuda only)
  CudaSettings cuda;      // cuda: attention path, CUDA graphs, which GPU
  FaultPlan faults;       // testing hook: faults injected into chosen steps (fault_inject.h)
  // The data argument is a JSONL file of SFT examples (data/sft_data.h), encoded with the run's
  // tokenizer and chat template, not token shards; recorded in config.json ("sft": true), so
  // resume() takes it from the run.
  bool sft = false;
  // Data-parallel training over the ranks of this communicator (dist/communicator.h; the CLI
  // makes an MpiComm when mpirun or srun started 2 or more ranks); nullptr or a world of one: one
  // process. Every rank calls train() / train_from() / resume() with the same arguments and runs
  // the same loop. The split (below) is over micro-batch rows: batch_size must divide by the
  // rank count.
  Communicator* comm = nullptr;
  // LoRA (model/lora.h; train_from() only, CPU or CUDA, one process): adapters on the frozen --init-from model train
  // instead of its weights. The run's model/ and checkpoints are PEFT adapter directories
  // (model/lora_dir.h); the run configuration records "lora": {"r", "alpha", "targets",
  // "base_sha256"} (the SHA-256 of the base's f32 weights), so resume() re-reads the base from
  // init_from and refuses one that changed.
  std::optional<LoraConfig> lora;
  // With --device cuda and comm of 2 or more ranks: makes the NCCL communicator over the same
  // ranks on this rank's GPU (cuda.device), which the CUDA runner's ZeRO-1 uses for gradients
  // and weights (train/runner.h); comm (host memory) still carries the trainer's own few
  // numbers. Called once, on every rank, only when such a run starts; the result must outlive
  // the run (the caller owns it). Last, so that aggregate initializers of the fields above
  // (tests use them) keep their meaning.
  std::function<Communicator*()> device_comm;
};

// Data parallel (RunOptions::comm with W >= 2 ranks; the CPU runner's ZeRO-1, train/runner.h):
//  - Data: every rank draws the ids of the whole global step from the same source in the same
//    order (batch_size rows x grad_accum micro-batches, exactly what one process draws: token
//    windows or SFT examples), and trains on its disjoint slice of each micro-batch, rows
//    [r·B/W, (r+1)·B/W). The global batch sequence is therefore the same on 1, 2 or N ranks and
//    the data position a checkpoint records does not depend on W. Drawing costs ids only (no
//    compute); each rank runs forward and backward on its rows alone.
//  - Loss: each rank's micro-batch slice is weighted by its trained targets over the global
//    step's (every rank knows the global counts, having drawn the whole step), so the gradient
//    and the logged loss are the mean over every trained token of the global step, as on one
//    process, up to float rounding of the sums (tested: within 1e-6 relative).
//  - Files: rank 0 alone writes the run directory (config.json, metrics.jsonl, loss.svg,
//    checkpoints, model/, tokenizer files) and prints progress and warnings; the other ranks
//    only read (data, --init-from model, the checkpoint to resume). Validation runs on rank 0
//    alone (the same windows and numbers as one process; the others wait).
//  - Checkpoints hold the full (gathered) Adam state, so a run resumes on any rank count (each
//    rank takes its shard of the full buffers): bit for bit on the count it was saved with, and
//    on another as that count would have continued (float rounding of the sums differs).
//  - A stop request (RunOptions::stop) on any rank stops every rank after the same step.

// Trains from scratch (weights initialised from cfg.seed) on `data` (a --data argument),
// writing the run directory `out`. Throws forge::Error on bad input.
TrainResult train(const ModelConfig& model, const TrainConfig& cfg, const std::string& data,
                  const std::string& out, const RunOptions& opt = {});

// Like train(), starting from the weights (and shape) of the Hugging Face model directory
// `model_dir`; the optimizer starts fresh. Its tokenizer files, if it has a tokenizer.json,
// travel with the run (else the data directory's, as above).
TrainResult train_from(const std::string& model_dir, const TrainConfig& cfg,
                       const std::string& data, const std::string& out, const RunOptions& opt = {});

// Continues the run in `run_dir` from its newest checkpoint up to `steps` (0: the run's own
// total; another total stretches the LR schedule, so losses then differ from the original
// plan). `data` replaces the run's data path when not empty (the shards moved). The device,
// precision and (fp16) loss-scale state are the run's unless opt names a device or precision,
// which then wins and is reported in one line; a run whose device is not available here (a GPU
// run on a machine without CUDA) is an error, never a silent switch to the CPU.
TrainResult resume(const std::string& run_dir, int steps, const std::string& data = "",
                   const RunOptions& opt = {});

}  // namespace forge
