// The whole model on the CUDA backend: the same forward and backward as Transformer<T> (the CPU
// reference), op for op, on the Context's stream. Buffers:
//   master (P, f32)   the weights AdamW updates (HF layout, same ParamTable as the CPU model)
//   work   (P, dt)    what the kernels read: a bf16 (f16) copy in bf16 (f16) mode, the master
//                     itself in fp32
//   grads  (P, f32)   accumulated by every backward; m, v (P, f32) Adam's moments
// Activations are dt (f32 statistics), planned once per (B, T) shape.
//
// The LM head and cross-entropy are fused (cuda::lm_head_cross_entropy): with a device dloss
// given, forward() already produces the head's gradients, as llm.c does, and backward() carries
// on from the final norm. Nothing here synchronises the host.
//
// f16 mode: the same kernels on __half, plus dynamic loss scaling (ops/loss_scale.h): the
// state sits in device memory (loss_scale()), forward() multiplies dloss by its scale on the
// device, optimizer_step() unscales before clipping, skips the update when Σ g² is not finite,
// and then updates the state — all inside the step a CUDA graph captures.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "forge/backend/cuda/allocator.h"
#include "forge/backend/cuda/context.h"
#include "forge/backend/cuda/ops.h"
#include "forge/core/dtype.h"
#include "forge/model/config.h"
#include "forge/model/params.h"
#include "forge/ops/adamw.h"
#include "forge/ops/loss_scale.h"

namespace forge {

class CudaTransformer {
 public:
  // dt: kF32 (fp32 mode, for parity with the CPU), kBF16 or kF16 (with loss scaling, `ls`).
  CudaTransformer(cuda::Context& ctx, const ModelConfig& cfg, DType dt, const LossScaleOptions& ls = {});

  const ModelConfig& config() const { return cfg_; }
  const ParamTable& table() const { return table_; }
  DType dtype() const { return dt_; }
  int64_t num_params() const { return table_.total(); }

  // Host f32 weights (P) → master and working copy.
  void set_weights(const std::vector<float>& host);
  std::vector<float> weights_host();
  std::vector<float> grads_host();
  // Adam's moments (P each), for checkpoints.
  std::vector<float> adam_m_host();
  std::vector<float> adam_v_host();
  void set_adam_state(const std::vector<float>& m, const std::vector<float>& v);
  void zero_grad();

  // tokens, targets: device (B, T) int32; targets may be null (logits-free inference is not
  // supported yet: the head is fused with the loss). dloss: device f32 holding the gradient of
  // the summed per-position losses (scale / count); null = forward only.
  void forward(const int32_t* tokens, const int32_t* targets, const float* dloss, int B, int T_);
  // Per-position losses of the last forward, device (B·T) f32; 0 at ignored targets.
  const float* losses() const { return losses_.data(); }
  // Continues the backward from the final norm; needs a forward with dloss.
  void backward();

  // Global-norm clipping + AdamW over every tensor (weight decay on >= 2-D tensors only); the
  // norm is computed and applied on the device. Returns nothing: the norm stays on the device
  // (grad_norm_sq()) until the caller reads it. The step's scalars are read from device memory,
  // factors (2): [0] for tensors with weight decay, [1] for the others (optimizer_factors()), so
  // a captured CUDA graph of this call replays with each step's lr and t.
  void optimizer_step(const AdamWFactors* factors, float max_norm);
  // The same from host parameters: uploads optimizer_factors(p, sr_seed) first (not capturable).
  void optimizer_step(const AdamWParams& p, float max_norm, uint64_t sr_seed);
  // p.weight_decay for decaying tensors; sr_seed != 0: stochastic rounding of the bf16 copy,
  // keyed per tensor by sr_seed + the tensor's offset.
  static std::array<AdamWFactors, 2> optimizer_factors(const AdamWParams& p, uint64_t sr_seed);
  const float* grad_norm_sq() const { return norm_sq_.data(); }
  // f16 mode: the device loss-scale state (null otherwise). After an optimizer_step(), its
  // step_scale is what that step's gradients (and grad_norm_sq()) were scaled by.
  const LossScaleState* loss_scale() const { return loss_scale_.size() > 0 ? loss_scale_.data() : nullptr; }
  LossScaleState loss_scale_host();

  // Changes whenever the activation buffers are allocated anew (a forward with a new B or T):
  // a CUDA graph that captured forward/backward is stale when it has changed.
  int64_t plan_generation() const { return plan_generation_; }

  // Whether attention runs as the fused flash kernels (bf16 with head size 64 or 128, unless
  // FORGE_ATTENTION=unfused) or as v1's unfused path (fp32, kept for parity with the CPU).
  bool flash_attention() const { return flash_; }

 private:
  template <typename T>
  using Buf = cuda::DeviceBuffer<T>;
  struct LayerActs {
    Buf<uint8_t> x_in, ln1, q, k, v, att, atty, x_mid, ln2, fc, up, hidden;
    Buf<uint8_t> qkv;  // GPT-2 with flash attention: (N, 3C), read in place as q, k, v
    Buf<float> ln1_mean, ln1_rstd, ln2_mean, ln2_rstd;
    Buf<float> lse;    // flash attention: (B, NH, T) log-sum-exp for the backward
  };

  struct AttnInputs {
    void *q, *k, *v;
    cuda::AttentionStrides st;
  };
  AttnInputs attention_inputs(const LayerActs& a) const;
  void plan(int B, int T_);
  void* w(int64_t off) const;       // working-copy pointer to a tensor
  float* g(int64_t off) const { return grads_.data() + off; }
  void* act(const Buf<uint8_t>& b) const { return b.data(); }
  void linear_fwd(void* out, const void* inp, int64_t w_off, int64_t b_off, int N, int C, int OC, bool in_out);
  bool gelu_epilogues() const;
  void linear_gelu_fwd(void* hidden, void* fc, const void* inp, int64_t w_off, int64_t b_off, int N, int C, int OC);
  enum class DinpMode { kAccumulate, kOverwrite, kDGelu };
  void linear_bwd(void* dinp, int64_t w_off, int64_t b_off, const void* dout, const void* inp, int N, int C, int OC,
                  bool in_out, DinpMode mode = DinpMode::kAccumulate, const void* gelu_pre = nullptr);
  void norm_fwd(void* out, float* mean, float* rstd, const void* inp, int64_t w_off, int64_t b_off, int N);
  void residual_norm_fwd(void* res, void* out, float* mean, float* rstd, const void* a, const void* b, int64_t w_off,
                         int64_t b_off, int N);
  void norm_bwd(void* dinp, const void* dout, const void* inp, const float* mean, const float* rstd, int64_t w_off, int64_t b_off, int N);
  void zero(Buf<uint8_t>& b);

  cuda::Context& ctx_;
  ModelConfig cfg_;
  ParamTable table_;
  DType dt_;
  size_t es_;  // bytes per dt element
  Buf<float> master_, grads_, m_, v_;
  Buf<uint8_t> work_;  // bf16 working copy (empty in fp32 mode)
  Buf<float> norm_sq_;
  bool flash_ = false;
  cuda::FlashKernels flash_kernels_ = cuda::FlashKernels::kAuto;
  Buf<float> delta_;  // flash backward scratch (B, NH, T)
  Buf<AdamWFactors> factors_;  // (2) for optimizer_step(const AdamWParams&, ...)
  Buf<LossScaleState> loss_scale_;  // (1) f16 mode only
  Buf<float> scaled_dloss_;         // (1) f16 mode: dloss · scale, what the head reads

  int B_ = 0, T_ = 0;
  std::vector<LayerActs> acts_;
  Buf<uint8_t> x_out_, lnf_, tmp_, qkv_, d_res_, d_ln_, d_atty_, d_q_, d_k_, d_v_, d_qkv_, d_fc_, d_up_, d_hidden_;
  Buf<float> lnf_mean_, lnf_rstd_, losses_;
  const int32_t* tokens_ = nullptr;
  bool have_head_grad_ = false;
  int64_t step_ = 0;
  int64_t plan_generation_ = 0;
};

}  // namespace forge
