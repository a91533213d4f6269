// A training backend as the trainer sees it: one model with its gradients and optimizer state,
// on the CPU (the reference) or a GPU. The trainer loop, metrics, evaluation and checkpoints are
// written once against this interface.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "forge/core/dtype.h"
#include "forge/core/error.h"
#include "forge/core/fp8_recipe.h"
#include "forge/core/gemm_algo.h"
#include "forge/dist/buckets.h"
#include "forge/model/config.h"
#include "forge/model/params.h"
#include "forge/model/recompute.h"
#include "forge/ops/adamw.h"
#include "forge/ops/attention.h"
#include "forge/ops/loss_scale.h"
#include "forge/ops/step_guard.h"

namespace forge {

// What one optimizer step measured: the trainer's metrics line.
struct StepReport {
  std::vector<double> micro_losses;  // mean loss of each micro-batch, in order
  // Data-parallel CPU runner (2 or more ranks): this rank's own micro_losses, before they were
  // averaged over ranks into micro_losses (the trainer weights them by this rank's share of the
  // step's trained tokens). Empty otherwise.
  std::vector<double> rank_micro_losses;
  double grad_norm = 0;              // global gradient norm before clipping (unscaled)
  // f16 loss scaling (CUDA --precision fp16; ops/loss_scale.h): the scale this step's gradients
  // carried, 0 when the precision uses none.
  double loss_scale = 0;
  // The update was not applied (weights and Adam state untouched): the loss or the gradient
  // norm was not finite (ops/step_guard.h), or, with `overflow`, f16's scaled gradients
  // overflowed and the loss scale halved.
  bool skipped = false;
  bool overflow = false;
};

// Testing hooks (the trainer's FaultPlan, train/fault_inject.h): what inject_fault() poisons in
// the step in progress, after its micro-batches and before its optimizer step.
enum class StepFault {
  kNanGrad,  // one gradient element becomes NaN (so does the global norm)
  kNanLoss,  // the first micro-batch's loss becomes NaN (the gradients stay as they are)
};

// One step is zero_grad(), micro_step() per micro-batch, optimizer_step(). A runner may only
// queue that work (the GPU one does: DESIGN.md's "the host reads the loss one step late"), so
// results come separately, from take_report(), up to report_lag() steps after the step ended.
class StepRunner {
 public:
  virtual ~StepRunner() = default;
  virtual const ParamTable& table() const = 0;
  virtual std::string describe() const = 0;  // "cpu fp32", "cuda bf16 on NVIDIA H200 ..."

  virtual void zero_grad() = 0;
  // Forward + backward of one micro-batch (host tokens and targets, (B, T), which may be reused
  // when this returns); gradients of scale · (mean loss) accumulate. Throws forge::Error for a
  // token or target id outside the vocabulary.
  virtual void micro_step(const int32_t* x, const int32_t* y, int B, int T_, double scale) = 0;
  // Ends the step: global-norm clipping to max_norm (<= 0: none) and AdamW with p
  // (p.weight_decay applies to >= 2-D tensors only; p.step is the step's 1-based number, from
  // which the updates skipped so far are subtracted to give Adam's t: ops/step_guard.h). A step
  // whose loss or gradient norm is not finite changes nothing and is reported skipped.
  virtual void optimizer_step(const AdamWParams& p, double max_norm) = 0;
  // Updates skipped by the guard so far (a checkpoint's count, before the first step of a
  // resumed run); the runner counts on from it.
  virtual void set_skipped_updates(int64_t n) = 0;
  // Poisons the step in progress (between its last micro_step() and optimizer_step()).
  virtual void inject_fault(StepFault f) = 0;
  // How many ended steps may still be unreported when the next one starts: 0 when every call
  // has finished its work on return (CPU), 1 when the host queues step s + 1 while step s runs.
  virtual int report_lag() const = 0;
  // The report of the oldest ended step not yet reported, waiting for that step to finish.
  virtual StepReport take_report() = 0;
  // Mean loss without gradients (waits for its result, so for every step queued before it).
  virtual double eval_loss(const int32_t* x, const int32_t* y, int B, int T_) = 0;
  // Packed rows (--pack): the positions and segment ids (host, (B, T), model/transformer.h's
  // TokenLayout) of the micro_step() calls that follow, until set again; null: none. They must
  // stay valid until those calls return. micro_step() throws forge::Error for a position outside
  // [0, max_seq_len).
  virtual void set_token_layout(const int32_t* pos, const int32_t* seg) = 0;

  // Host copies for checkpoints and export (f32, the parameter table's layout).
  virtual std::vector<float> weights() = 0;
  virtual void set_weights(const std::vector<float>& w) = 0;
  virtual std::vector<float> adam_m() = 0;
  virtual std::vector<float> adam_v() = 0;
  // Both empty: zero moments (a fresh run), without the caller building P zeros twice.
  virtual void set_adam_state(const std::vector<float>& m, const std::vector<float>& v) = 0;

  // f16 dynamic loss scaling (ops/loss_scale.h), for checkpoints: the state after the last
  // ended step (waiting for every queued step first), or nullopt when the runner's precision
  // uses no loss scaling (the default: CPU, fp32, bf16).
  virtual std::optional<LossScaleState> loss_scale_state() { return std::nullopt; }
  // Replaces the state with one loss_scale_state() returned (a checkpoint's), before the first
  // step of a resumed run, so that its scale, clean-step count and skip count (which Adam's t
  // subtracts) continue where they stopped. Called only when loss_scale_state() is not nullopt;
  // the default, for runners without loss scaling, treats a call as a broken invariant.
  virtual void set_loss_scale_state(const LossScaleState&) {
    FORGE_CHECK(false, describe(), ": set_loss_scale_state() on a runner without loss scaling");
  }

  // Activation recomputation (model/recompute.h) from the next micro_step() on; losses and
  // gradients are bit-identical at every level, memory and time are not.
  virtual void set_recompute(Recompute r) = 0;

  // Peak bytes of device memory held (0 on the CPU).
  virtual size_t peak_device_bytes() const { return 0; }
};

template <class Backend>
class Model;  // model/transformer.h
template <typename T>
class CpuBackend;
class Communicator;  // dist/communicator.h

// The CPU runner. With a communicator of 2 or more ranks it trains data-parallel with ZeRO-1
// (train/runner_cpu.cpp): each rank runs micro_step() on its own micro-batches; optimizer_step()
// averages the gradients over ranks (reduce-scatter, then ÷ ranks: the scale given to
// micro_step() stays 1 / grad_accum, as on one rank), keeps Adam's m and v for its shard of the
// flat buffer only, and all-gathers the updated weights; the report's losses and gradient norm
// are over all ranks, and a non-finite loss or norm on any rank skips the step on every rank.
// Then optimizer_step(), adam_m() and adam_v() are collective: every rank calls them, in the
// same order; set_weights() and set_adam_state() take the full buffers on every rank;
// eval_loss() is this rank's alone. comm must outlive the runner. nullptr or a world of one:
// the single-process runner, bit for bit. bucket_elems: the reduce-scatter's smallest bucket
// (dist/buckets.h, which also gives the shards' layout); on the CPU the buckets are reduced one
// after another after the backward.
std::unique_ptr<StepRunner> make_cpu_runner(const ModelConfig& cfg, Communicator* comm = nullptr,
                                            size_t bucket_elems = bucket_elems_of_bytes(kDefaultBucketBytes));

// The LoRA runner (the CPU runner of train/runner_cpu.cpp on adapters): `model` (which has
// adapters, model/lora.h) copied, its base frozen; weights(), set_weights(), adam_m() and
// adam_v() are the adapter buffer's (AdapterTable layout), and so are the gradient norm,
// clipping and the AdamW update. With a communicator of 2 or more ranks it trains data-parallel
// exactly as make_cpu_runner's does (ZeRO-1 over the adapter buffer; the same collective calls).
std::unique_ptr<StepRunner> make_lora_cpu_runner(
    const Model<CpuBackend<float>>& model, Communicator* comm = nullptr,
    size_t bucket_elems = bucket_elems_of_bytes(kDefaultBucketBytes));

// Settings of a CUDA run. Nothing in the library reads the environment: the CLI fills these from
// its flags and from FORGE_ATTENTION / FORGE_CUDA_GRAPH / FORGE_GEMM_ALGO
// (apps/forge/run_env.h).
struct CudaSettings {
  LossScaleOptions loss_scale;                     // fp16 only
  AttentionPath attention = AttentionPath::kAuto;  // ops/attention.h
  // How cuBLASLt's algorithm is chosen per product shape (core/gemm_algo.h;
  // CudaModelOptions::gemm_algo). kTimed: the fastest candidate with the heuristic's bits, so
  // the heuristic's results 1.4–2.2% faster (GPT-2 124M, SmolLM2-135M on an H100,
  // docs/decisions.md).
  GemmAlgo gemm_algo = GemmAlgo::kTimed;
  // The Llama family's q|k|v as one product in training and prefill (CudaModelOptions::fuse_qkv);
  // false: three, the A/B comparison.
  bool fuse_qkv = true;
  // FP8 forward and dX products of the blocks (core/fp8_recipe.h; CudaModelOptions::fp8).
  Fp8Recipe fp8 = Fp8Recipe::kOff;
  // The training step is captured as a CUDA graph once its shapes repeat and replayed from then
  // on; false runs every step eagerly (same kernels, same results).
  bool graphs = true;
  int device = 0;  // the GPU this runner uses (cudaGetDevice numbering)
  // Testing: with a communicator of ONE rank, run the data-parallel (ZeRO-1) step anyway, so
  // that a one-GPU machine tests the NCCL path against the plain runner.
  bool zero1_one_rank = false;
  // Data parallel: the smallest gradient bucket, in elements (dist/buckets.h); each bucket is
  // reduce-scattered on a stream of its own as soon as the backward has finished its layers.
  size_t bucket_elems = bucket_elems_of_bytes(kDefaultBucketBytes);
};

// precision: "fp32", "bf16" or "fp16" (f16 compute with dynamic loss scaling). Throws
// forge::Error when Forge was built without CUDA, there is no such GPU, or the precision is not
// supported.
//
// Data parallel: `comm` an NCCL communicator (dist/nccl_comm.h) of 2 or more ranks, made on
// GPU settings.device; the runner sends its collectives to its own stream (set_nccl_stream).
// ZeRO-1 as the CPU runner's (train/zero1_cuda.h says how on the GPU): gradients averaged over
// ranks by a reduce-scatter, AdamW with m and v of this rank's shard, the updated shard
// all-gathered; the report's losses, gradient norm and skip decision over all ranks, identical
// on every rank. optimizer_step(), weights(), adam_m() and adam_v() are then collective;
// set_weights() and set_adam_state() take the full buffers on every rank; eval_loss() is this
// rank's alone. comm must outlive the runner. nullptr or a world of one: the single-GPU runner,
// unchanged (unless settings.zero1_one_rank). Throws forge::Error for a communicator that is not
// NCCL's.
std::unique_ptr<StepRunner> make_cuda_runner(const ModelConfig& cfg, const std::string& precision,
                                             const CudaSettings& settings = {},
                                             Communicator* comm = nullptr);

// The CUDA runner on `model` (which has adapters, model/lora.h): its base uploaded and frozen in
// `precision` (no base gradients or Adam state; in 16-bit modes no f32 master), the adapters
// trained as make_lora_cpu_runner's are (same gradient norm, clipping, guard and AdamW, over the
// adapter buffer; weights(), set_weights(), adam_m() and adam_v() are the adapters'). Data
// parallel with `comm` exactly as make_cuda_runner (ZeRO-1 over the adapter buffer; the same
// collective calls, settings.zero1_one_rank included). Throws as make_cuda_runner does.
std::unique_ptr<StepRunner> make_lora_cuda_runner(const Model<CpuBackend<float>>& model, const std::string& precision,
                                                  const CudaSettings& settings = {},
                                                  Communicator* comm = nullptr);

// "auto" (or "flash"), "unfused", "flash-mma", "flash-wgmma", "flash-wgmma-split"; throws
// forge::Error otherwise.
AttentionPath parse_attention_path(const std::string& name);

}  // namespace forge
