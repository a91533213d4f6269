// The CUDA backend as the model sees it (model/transformer.h): parameter storage, the ops the
// model calls (bindings to backend/cuda/ops.h and cuBLASLt GEMMs, on the Context's stream, no
// host syncs) and the optimizer. Buffers:
//   master (P, f32)   the weights AdamW updates (HF layout, the model's ParamTable)
//   work   (P, dt)    what the kernels read: a bf16 (f16) copy in bf16 (f16) mode, the master
//                     itself in fp32
//   grads  (P, f32)   accumulated by every backward; m, v (P, f32) Adam's moments
// Activations are dt (void*), statistics f32.
//
// LoRA (model/lora.h): set_adapter() adds the adapters' buffers, the same scheme as the base's:
// an f32 master (A), a dt working copy in 16-bit modes, f32 gradients, and m, v, which from then
// on are the adapters' Adam state (the optimizer updates the adapters alone). The base is frozen:
// its gradient buffer and Adam state are released and, in 16-bit modes, its f32 master too (the
// working copy is the base; weights_host() reads it back). CudaModelOptions::frozen_base never
// allocates them in the first place.
//
// Fused where the GPU gains: GELU in cuBLASLt's epilogues in 16-bit modes (fp32, the CPU-parity
// mode, keeps separate GELU kernels: cuBLASLt's tanh differs in the last bits), the flash
// attention kernels reading GPT-2's q/k/v in place, the row-chunked LM head + loss. Linear layers
// of a few rows (decoding, N ≤ cuda::kSmallLinearMaxRows) run on the small-N kernels
// (small_gemm.h) instead of cuBLASLt, the Llama gate/up projection + SwiGLU as one kernel.
//
// f16 mode: the same kernels on __half, plus dynamic loss scaling (ops/loss_scale.h): the state
// sits in device memory (loss_scale()), scale_dloss() multiplies dloss by its scale on the
// device, optimizer_step() unscales before clipping, skips the update when Σ g² is not finite,
// and then updates the state — all inside the step a CUDA graph captures.
//
// Every precision: the numerical guard (ops/step_guard.h) in device memory (step_guard()):
// optimizer_step() checks the step's losses and Σ g² on the device and skips the update of a
// step where either is not finite, without a host sync.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "forge/backend/cuda/allocator.h"
#include "forge/backend/cuda/context.h"
#include "forge/backend/cuda/ops.h"
#include "forge/core/dtype.h"
#include "forge/core/fp8_recipe.h"
#include "forge/model/config.h"
#include "forge/model/params.h"
#include "forge/ops/adamw.h"
#include "forge/ops/attention.h"
#include "forge/ops/linear.h"
#include "forge/ops/loss_scale.h"
#include "forge/ops/decode.h"
#include "forge/ops/sample.h"

namespace forge::cuda {
class Graph;
struct GemmArgs;
}

namespace forge {

// What a CUDA model is built with (settings of the run; nothing is read from the environment).
struct CudaModelOptions {
  DType dtype = DType::kBF16;  // kF32 (parity with the CPU), kBF16, or kF16 (with loss scaling)
  LossScaleOptions loss_scale;  // kF16 only
  AttentionPath attention = AttentionPath::kAuto;
  // LoRA's frozen base: no base gradients, no base Adam state and, in 16-bit modes, no f32 master
  // are allocated (set_adapter() must follow before an optimizer step).
  bool frozen_base = false;
  // false: no base Adam state (m, v) is allocated; the data-parallel runner keeps its own shard
  // of it (train/zero1_cuda.h) and runs the optimizer over the buffers below itself.
  bool adam_state = true;
  // How cuBLASLt's algorithm is chosen per product shape (core/gemm_algo.h; cuda::Context).
  GemmAlgo gemm_algo = GemmAlgo::kHeuristic;
  // The Llama family's q|k|v as one (N, (NH + 2·NKV)·HS) product in training and prefill; false:
  // three products (the A/B comparison; LoRA targets always take three).
  bool fuse_qkv = true;
  // FP8 products (core/fp8_recipe.h; backend_fp8.cpp): bf16 only, compute capability 9.0.
  Fp8Recipe fp8 = Fp8Recipe::kOff;
};

class CudaBackend {
 public:
  static constexpr bool kHost = false;
  using Real = float;
  using Act = void*;  // dt elements
  using Stat = float*;
  using Grad = float*;
  using ActBuf = cuda::DeviceBuffer<uint8_t>;
  using StatBuf = cuda::DeviceBuffer<float>;
  struct AttnSaved {
    cuda::DeviceBuffer<float> lse;    // flash: (B, NH, T) log-sum-exp
    cuda::DeviceBuffer<uint8_t> att;  // unfused: (B, NH, T, T) probabilities in dt
  };

  CudaBackend(const ModelConfig& cfg, const ParamTable& table, cuda::Context& ctx, const CudaModelOptions& o);
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  cuda::Context& context() const { return ctx_; }
  DType dtype() const { return dt_; }
  // Whether attention runs as the fused flash kernels or as the unfused path (fp32's, or forced).
  bool flash_attention() const { return flash_; }

  // ---- parameters (host copies are f32 in the table's layout) -------------------------------
  void set_weights(const std::vector<float>& host);
  std::vector<float> weights_host() const;
  std::vector<float> grads_host() const;
  std::vector<float> adam_m_host() const;
  std::vector<float> adam_v_host() const;
  void set_adam_state(const std::vector<float>& m, const std::vector<float>& v);
  void zero_grad();
  Act w(int64_t off) const;
  Grad g(int64_t off) const { return grads_.data() + off; }

  // ---- LoRA adapters (the CPU backend's contract; see the header): `params` is the adapter
  // table's (offsets, sizes, decay flags), what optimizer_step() then updates.
  void set_adapter(const std::vector<float>& a, const std::vector<ParamInfo>& params);
  bool has_adapter() const { return a_master_.size() > 0; }
  void set_adapter_weights(const std::vector<float>& a);
  std::vector<float> adapter_weights_host() const;  // the f32 master
  std::vector<float> adapter_grads_host() const;
  Act aw(int64_t off) const;
  Grad ag(int64_t off) const { return a_grads_.data() + off; }

  // ---- optimizer ----------------------------------------------------------------------------
  // With adapters (set_adapter) everything below is over the adapter buffer instead of the
  // base's: Σ g², clipping, the guard, AdamW, adam_m_host() / adam_v_host() / set_adam_state().
  // Global-norm clipping + AdamW over every tensor (weight decay on >= 2-D tensors only); the
  // norm is computed and applied on the device and stays there (grad_norm_sq()). The step's
  // scalars are read from device memory, factors (2): [0] for tensors with weight decay, [1] for
  // the others (optimizer_factors()), so a captured CUDA graph replays with each step's lr and t.
  // loss_sums (device, n_losses doubles; may be null): the step's per-micro-batch loss sums,
  // which the guard checks along with Σ g².
  void optimizer_step(const AdamWFactors* factors, float max_norm,
                      const double* loss_sums = nullptr, int n_losses = 0);
  // The same from host parameters: uploads optimizer_factors(p, sr_seed) first (not capturable).
  void optimizer_step(const AdamWParams& p, float max_norm, uint64_t sr_seed);
  // p.weight_decay for decaying tensors; sr_seed != 0: stochastic rounding of the bf16 copy.
  static std::array<AdamWFactors, 2> optimizer_factors(const AdamWParams& p, uint64_t sr_seed);
  const float* grad_norm_sq() const { return norm_sq_.data(); }
  // f16 mode: the device loss-scale state (null otherwise). After an optimizer_step(), its
  // step_scale is what that step's gradients (and grad_norm_sq()) were scaled by.
  const LossScaleState* loss_scale() const { return loss_scale_.size() > 0 ? loss_scale_.data() : nullptr; }
  LossScaleState loss_scale_host() const;
  void set_loss_scale(const LossScaleState& s);
  // The numerical guard's device state (ops/step_guard.h); the host copy waits for the stream.
  const StepGuardState* step_guard() const { return guard_.data(); }
  StepGuardState step_guard_host() const;
  void set_step_guard(const StepGuardState& s);

  // ---- ZeRO-1 (train/zero1_cuda.h): the raw buffers of what trains, for a runner that reduces
  // the gradients over ranks and updates its shard of the master itself: the model's weights,
  // or with adapters (set_adapter) the adapter buffer. The master is the f32 weights (P); the
  // working copy is dt (P) in 16-bit modes and null in fp32 (the master is what kernels read);
  // the gradients f32 (P). Device-state pointers are the ones optimizer_step() updates.
  float* master_data() { return has_adapter() ? a_master_.data() : master_.data(); }
  uint8_t* work_data() {
    const auto& w = has_adapter() ? a_work_ : work_;
    return w.size() > 0 ? w.data() : nullptr;
  }
  float* grads_data() { return has_adapter() ? a_grads_.data() : grads_.data(); }
  const std::vector<ParamInfo>& params() const { return has_adapter() ? a_params_ : table_.params(); }
  int64_t num_params() const {
    return has_adapter() ? static_cast<int64_t>(a_master_.size()) : table_.total();
  }
  // The f32 master of what trains, on the host (weights_host() or adapter_weights_host()).
  std::vector<float> trained_weights_host() const {
    return has_adapter() ? adapter_weights_host() : weights_host();
  }
  LossScaleState* loss_scale_state_data() { return loss_scale_.size() > 0 ? loss_scale_.data() : nullptr; }
  StepGuardState* step_guard_data() { return guard_.data(); }

  // ---- buffers --------------------------------------------------------------------------------
  ActBuf act_buf(size_t n) { return ActBuf(ctx_.allocator(), n * es_); }
  StatBuf stat_buf(size_t n) { return StatBuf(ctx_.allocator(), n); }
  AttnSaved attention_saved(const AttentionShape& s);
  void plan_attention(const AttentionShape& s);
  Act at(Act p, int64_t n) const { return static_cast<uint8_t*>(p) + n * static_cast<int64_t>(es_); }
  void zero(Act p, size_t n);
  // n elements of −0 (the CPU backend's contract); uploads and waits: not for a captured step.
  void fill_negative_zero(Act p, size_t n);
  bool fuses_gelu() const { return dt_ != DType::kF32; }
  // The Llama family's gate and up projections as one (N, 2·FF) product (model/transformer_impl.h).
  // Measured on an H100 (docs/perf-notes.md, 2026-12-06 third session): +0.3–0.8% tokens/s.
  bool fuses_gate_up() const { return true; }
  // The Llama family's q|k|v as one product. An A/B setting while it is measured
  // (FORGE_QKV=separate: three products; the CPU backend always fuses).
  bool fuses_qkv() const { return fuse_qkv_; }
  // The FP8 recipe of the blocks' products (CudaModelOptions::fp8; backend_fp8.cpp).
  Fp8Recipe fp8() const { return fp8_; }
  const Real* scale_dloss(const Real* dloss);
  void synchronize() { ctx_.synchronize(); }

  // ---- ops (the contracts of backend/cpu/backend.h) -------------------------------------------
  // pos / seg: packed rows (the CPU backend's contract), device (B, T) int32, null for none.
  void embedding_fwd(Act out, const int32_t* tokens, Act wte, Act wpe, int B, int T_, int C, const int32_t* pos);
  void embedding_bwd(Grad dwte, Grad dwpe, Act dout, const int32_t* tokens, int B, int T_, int C,
                     const int32_t* pos);
  void layernorm_fwd(Act out, Stat mean, Stat rstd, Act inp, Act w, Act b, int N, int C, float eps);
  void residual_layernorm_fwd(Act res, Act out, Stat mean, Stat rstd, Act a, Act b, Act w, Act bias, int N, int C,
                              float eps);
  // dres (may be null) += Σ_rows of the updated dinp (cuda::layernorm_bwd / rmsnorm_bwd).
  void layernorm_bwd(Act dinp, Grad dw, Grad db, Act dout, Act inp, Act w, Stat mean, Stat rstd, int N, int C,
                     Grad dres);
  void rmsnorm_fwd(Act out, Stat rstd, Act inp, Act w, int N, int C, float eps);
  void residual_rmsnorm_fwd(Act res, Act out, Stat rstd, Act a, Act b, Act w, int N, int C, float eps);
  void rmsnorm_bwd(Act dinp, Grad dw, Act dout, Act inp, Act w, Stat rstd, int N, int C, Grad dres);
  void head_rmsnorm(Act x, Act w, int N, int H, int HS, int64_t stride, float eps);
  void head_norm_rope_fwd(Act x, Stat rstd, Act x_raw, Act w, int B, int T_, int H, int HS, float eps,
                          const Rope* rope, const int32_t* pos, int64_t ld, int H0 = 0);
  void head_norm_rope_bwd(Act dx_raw, Grad dw, Act dx, Act x_raw, Act w, Stat rstd, int B, int T_, int H, int HS,
                          const Rope* rope, const int32_t* pos, int64_t ld, int H0 = 0);
  void linear_fwd(Act out, Act inp, Act w, Act bias, int N, int C, int OC, WeightLayout layout);
  void linear_gelu_fwd(Act hidden, Act fc, Act inp, Act w, Act bias, int N, int C, int OC, WeightLayout layout);
  // dw (and rmsnorm_bwd's dw) may be null: a frozen weight (LoRA's base), its product skipped.
  void linear_bwd(Act dinp, Grad dw, Grad db, Act dout, Act inp, Act w, int N, int C, int OC, WeightLayout layout,
                  bool accumulate);
  void linear_dgelu_bwd(Act dfc, Grad dw, Grad db, Act dout, Act inp, Act w, Act fc, Act scratch, int N, int C,
                        int OC, WeightLayout layout);
  // hidden (N, FF) = silu(inp · Wgᵀ) ∘ (inp · Wuᵀ), w_gate_up (2FF, C): gate rows, then up rows
  // (the parameter table stores gate_proj and up_proj contiguously). scratch: (N, 2FF).
  void linear_swiglu_fwd(Act hidden, Act scratch, Act inp, Act w_gate_up, int N, int C, int FF);
  // LoRA, A (r, C), B (OC, r) in dt, dA, dB f32: h (N, r) = inp · Aᵀ; out (N, OC) += scale · h · Bᵀ.
  void lora_fwd(Act out, Act h, Act inp, Act a, Act b, int N, int C, int OC, int r, double scale);
  // dB += scale · doutᵀ·h; dh (N, r) = scale · dout·B (scratch); dA += dhᵀ·inp; dinp += dh·A.
  void lora_bwd(Act dinp, Grad da, Grad db, Act dh, Act dout, Act inp, Act h, Act a, Act b, int N, int C, int OC,
                int r, double scale);
  void swiglu_fwd(Act out, Act gate, Act up, int64_t n);
  void swiglu_bwd(Act dgate, Act dup, Act dout, Act gate, Act up, int64_t n);
  void swiglu_fwd_rows(Act out, Act gate, Act up, int rows, int ff, int64_t ld);
  void swiglu_bwd_rows(Act dgate, Act dup, Act dout, Act gate, Act up, int rows, int ff, int64_t ld);
  void rope_fwd(Act x, int B, int T_, int H, int HS, const Rope& rope, const int32_t* pos, int64_t ld);
  void rope_bwd(Act dx, int B, int T_, int H, int HS, const Rope& rope, const int32_t* pos, int64_t ld);
  void rope_bias_bwd(Act dx, Grad db, int B, int T_, int H, int HS, const Rope& rope, const int32_t* pos,
                     int64_t ld);
  void bias_grad(Grad db, Act dout, int N, int OC, int64_t ld);
  void attention_fwd(Act out, AttnSaved& saved, Act q, Act k, Act v, const AttentionShape& s,
                     const AttentionStrides& st, const int32_t* seg);
  void attention_bwd(Act dq, Act dk, Act dv, Act dout, Act q, Act k, Act v, Act out, AttnSaved& saved,
                     const AttentionShape& s, const AttentionStrides& st, const int32_t* seg);
  void lm_head_cross_entropy(Stat losses, Act dx, Grad dw, Act x, Act w, const int32_t* targets, const Real* dloss,
                             int N, int C, int V, int Vp);

  // ---- inference: KV-cache decoding and sampling (backend_decode.cpp; CPU contracts in
  // backend/cpu/backend.h) -----------------------------------------------------------------------
  template <class U>
  using Buf = cuda::DeviceBuffer<U>;
  template <class U>
  Buf<U> buf(size_t n) {
    return Buf<U>(ctx_.allocator(), n);
  }
  // Host <-> device on the stream; both wait for the copy (between steps only, never captured).
  template <class U>
  void upload(U* dst, const U* host, size_t n) {
    upload_bytes(dst, host, n * sizeof(U));
  }
  template <class U>
  void download(U* host, const U* src, size_t n) {
    download_bytes(host, src, n * sizeof(U));
  }
  void copy_rows(Act dst, int64_t dst_stride, Act src, int64_t src_stride, int64_t rows, int64_t width);
  void embedding_at(Act out, const int32_t* tokens, const int32_t* pos, Act wte, Act wpe, int N, int C);
  void rope_at(Act x, const int32_t* pos, int N, int H, int HS, const Rope& rope, int64_t stride);
  void kv_append(Act ck, Act cv, Act k, Act v, const int32_t* pos, const DecodeShape& s, int64_t k_stride,
                 int64_t v_stride);
  void decode_attention(Act out, Act q, Act ck, Act cv, const int32_t* pos, const DecodeShape& s, int64_t q_stride);
  // Sizes the decode attention's scratch for every row count 1 .. s.S at once (Model::plan_decode),
  // so that steps of fewer rows (Model::set_decode_rows) never grow it: a captured step graph holds
  // its address.
  void reserve_decode(const DecodeShape& s);
  void rope_kv_append(Act qkv, int64_t stride, Act ck, Act cv, const int32_t* pos,
                      const DecodeShape& s, const Rope& rope);
  // The decode step's fused ops (contracts in backend/cpu/backend.h): one kernel each where the
  // small-N kernels take the shape (bf16 / f16, W (OC, C), few rows) and the attention kernel
  // the head size; otherwise the unfused ops.
  void rmsnorm_linear_fwd(Act out, Act ln, Stat rstd, Act x, Act norm_w, Act w, Act bias, int N, int C, int OC,
                          float eps);
  void rmsnorm_linear_swiglu_fwd(Act hidden, Act scratch, Act ln, Stat rstd, Act x, Act norm_w, Act w_gate_up,
                                 int N, int C, int FF, float eps);
  void linear_residual_fwd(Act res, Act scratch, Act inp, Act w, Act bias, int N, int C, int OC,
                           WeightLayout layout);
  void rope_decode_attention(Act out, Act qkv, int64_t stride, Act ck, Act cv, const int32_t* pos,
                             const DecodeShape& s, const Rope* rope);
  void advance_positions(int32_t* pos, int S, int32_t limit);
  void sample(int32_t* out, Act logits, const SamplerSettings* settings, uint8_t* seen, const int32_t* pos, int S,
              int V, int Vp);
  // A decode step captured once as a CUDA graph (cuda/graph.h) and replayed.
  struct StepGraph {
    StepGraph();
    ~StepGraph();
    std::unique_ptr<cuda::Graph> g;
  };
  void capture(StepGraph& g, const std::function<void()>& f);
  void launch(StepGraph& g);
  // Ids copied to the host behind the stream (decode_loop.h pipelines its steps on it):
  // readback_start enqueues the copy into pinned memory and records an event; readback_wait
  // waits for that event only, so the steps enqueued after it keep running.
  struct Readback {
    Readback();
    ~Readback();
    Readback(const Readback&) = delete;
    Readback& operator=(const Readback&) = delete;
    int32_t* host = nullptr;  // pinned
    size_t cap = 0;
    void* done = nullptr;  // cudaEvent_t
  };
  void readback_start(Readback& r, const int32_t* src, size_t n);
  const int32_t* readback_wait(Readback& r);

 private:
  void upload_bytes(void* dst, const void* host, size_t bytes);
  void download_bytes(void* host, const void* src, size_t bytes);
  void weight_grads(Grad dw, Grad db, Act dout, Act inp, int N, int C, int OC, WeightLayout layout);
  // FP8 (backend_fp8.cpp): the recipe's checks at construction; whether a product x (N, K) ·
  // Wᵀ -> (N, OUT) runs in FP8 (x's E4M3 rows written by a norm, or an output wide enough to
  // pay for casting x; bias_sum: the cast also takes the layer's bias gradient, a pass paid
  // anyway, so narrower outputs pay); whether a norm wrote x's rows; the product, g holding the
  // bf16 call's shape, epilogue and beta, w (OUT, K) or, w_transposed, (K, OUT); x_is_grad: x is
  // an output gradient (the dX product); dbias: += x's column sums, taken by x's cast.
  void init_fp8(Fp8Recipe r);
  bool fp8_eligible(Act w, Act x, int N, int K, int OUT, bool bias_sum = false) const;
  bool fp8_rows_written(Act x, int N, int K) const;
  void fp8_gemm(cuda::GemmArgs g, Act x, bool x_is_grad, Act w, bool w_transposed, Act out,
                Grad dbias = nullptr);
  // Where a norm forward writes its (N, C) output's E4M3 rows (null when FP8 is off or the
  // shape is not eligible), and, once it did (written), that they hold `out`: the next FP8
  // product reading `out` takes them instead of casting it.
  struct Fp8Rows {
    uint8_t* q = nullptr;
    float* descale = nullptr;
  };
  Fp8Rows fp8_norm_out(int N, int C);
  void fp8_norm_done(bool written, Act out, int N, int C);
  bool dense(const AttentionShape& s, const AttentionStrides& st) const;
  void* decode_scratch(const DecodeShape& s);
  void to_dense(Act dst, Act src, int64_t stride, int64_t width, int64_t rows, bool from_strided);

  cuda::Context& ctx_;
  ParamTable table_;
  DType dt_;
  size_t es_;  // bytes per dt element
  bool flash_ = false;
  bool fuse_qkv_ = true;  // fuses_qkv(); CudaModelOptions::fuse_qkv
  cuda::FlashKernels flash_kernels_ = cuda::FlashKernels::kAuto;
  Buf<float> master_, grads_, m_, v_;  // m_, v_: the adapters' once set_adapter() ran
  Buf<uint8_t> work_;  // bf16/f16 working copy (empty in fp32 mode)
  // LoRA: the adapters' f32 master, gradients and 16-bit working copy; their table's tensors.
  Buf<float> a_master_, a_grads_;
  Buf<uint8_t> a_work_;
  std::vector<ParamInfo> a_params_;
  Buf<float> norm_sq_;
  Buf<AdamWFactors> factors_;       // (2) for optimizer_step(const AdamWParams&, ...)
  Buf<LossScaleState> loss_scale_;  // (1) f16 mode only
  Buf<StepGuardState> guard_;       // (1)
  Buf<float> scaled_dloss_;         // (1) f16 mode: dloss · scale, what the head reads
  Buf<float> delta_;                // flash backward scratch (B, NH, T)
  // Unfused attention on strided q/k/v (GPT-2's fused projection): dense copies and gradients.
  Buf<uint8_t> dense_q_, dense_k_, dense_v_, dense_dq_, dense_dk_, dense_dv_;
  Buf<uint8_t> decode_scratch_;  // split-KV partials of decode_attention
  // FP8 products: the recipe, the cast operands and their row descales, grown as needed;
  // grown-out buffers are kept (a captured graph may hold them).
  Fp8Recipe fp8_ = Fp8Recipe::kOff;
  Buf<uint8_t> fp8_x_, fp8_w_;
  // Whose rows fp8_x_ holds, written by a norm forward and not yet read (fp8_norm_done).
  const void* fp8_x_of_ = nullptr;
  int fp8_x_rows_ = 0, fp8_x_cols_ = 0;
  Buf<float> fp8_xs_, fp8_ws_;
  std::vector<Buf<uint8_t>> fp8_retired_;
  std::vector<Buf<float>> fp8_retired_s_;
};

}  // namespace forge
