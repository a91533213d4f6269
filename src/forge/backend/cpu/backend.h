// The CPU backend as the model sees it (model/transformer.h): the parameter storage and every op
// the model calls, each a thin binding to the reference kernels of ops/*.h. The fused ops of the
// GPU (GEMM + GELU epilogue, the GELU backward fused into a product, the LM head fused with the
// loss, flash attention on strided q/k/v) are ops here too, composed from the unfused kernels, so
// the CPU runs the same sequence of calls as the GPU and the model's orchestration is tested in CI.
//
// T is float for training and double for the finite-difference checks of the whole model.
// Everything — activations, statistics, gradients — is T; pointers are host pointers.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "forge/model/config.h"
#include "forge/model/params.h"
#include "forge/ops/activation.h"
#include "forge/ops/attention.h"
#include "forge/ops/cross_entropy.h"
#include "forge/ops/decode.h"
#include "forge/ops/embedding.h"
#include "forge/ops/head_norm_rope.h"
#include "forge/ops/layernorm.h"
#include "forge/ops/linear.h"
#include "forge/ops/matmul.h"
#include "forge/ops/rmsnorm.h"
#include "forge/ops/rope.h"
#include "forge/ops/sample.h"

namespace forge {

// Whether a CPU model keeps a gradient buffer beside its weights. Inference (generate, serve,
// eval, merge, validate) has no use for one, and it is as large as the weights: a model made
// with kNone holds its weights only, and a forward with dloss refuses it (Model::forward).
enum class GradBuffers { kAllocate, kNone };

template <typename T>
class CpuBackend {
 public:
  static constexpr bool kHost = true;  // pointers are host memory: the model may read them
  using Real = T;                      // dloss, losses
  using Act = T*;                      // activations
  using Stat = T*;                     // norm statistics, log-sum-exp
  using Grad = T*;                     // parameter gradients
  using ActBuf = std::vector<T>;
  using StatBuf = std::vector<T>;
  struct AttnSaved {
    std::vector<T> lse;    // (B, NH, T)
    std::vector<T> probs;  // (B, NH, T, T) where small (kSavedProbsBytes), else empty
  };
  // Up to this size per layer the attention probabilities are kept for the backward, which then
  // skips recomputing them (cpu::flash_attention_bwd): the tiny preset's are 4 MiB a layer.
  static constexpr size_t kSavedProbsBytes = size_t{64} << 20;

  CpuBackend(const ModelConfig&, const ParamTable& table, GradBuffers grads = GradBuffers::kAllocate)
      : weights_(table.total()), grads_(grads == GradBuffers::kAllocate ? table.total() : 0) {}

  // ---- parameters ---------------------------------------------------------------------------
  std::vector<T>& weights() { return weights_; }
  const std::vector<T>& weights() const { return weights_; }
  bool has_grads() const { return !grads_.empty(); }
  std::vector<T>& grads() { return grads_; }
  const std::vector<T>& grads() const { return grads_; }
  void set_weights(const std::vector<float>& w) { weights_.assign(w.begin(), w.end()); }
  std::vector<float> weights_host() const { return {weights_.begin(), weights_.end()}; }
  std::vector<float> grads_host() const { return {grads_.begin(), grads_.end()}; }
  void zero_grad() {
    std::fill(grads_.begin(), grads_.end(), T(0));
    std::fill(adapter_g_.begin(), adapter_g_.end(), T(0));
  }
  Act w(int64_t off) { return weights_.data() + off; }
  Grad g(int64_t off) { return grads_.data() + off; }

  // ---- LoRA adapters (model/lora.h): their own flat buffer and gradients; the base's gradient
  // buffer is released (a frozen base has none).
  // params (the adapter table's) are for backends that run the optimizer; the CPU runners do.
  void set_adapter(const std::vector<float>& a, const std::vector<ParamInfo>& /*params*/) {
    adapter_w_.assign(a.begin(), a.end());
    adapter_g_.assign(a.size(), T(0));
    std::vector<T>().swap(grads_);
  }
  std::vector<T>& adapter_weights() { return adapter_w_; }
  const std::vector<T>& adapter_weights() const { return adapter_w_; }
  std::vector<T>& adapter_grads() { return adapter_g_; }
  Act aw(int64_t off) { return adapter_w_.data() + off; }
  Grad ag(int64_t off) { return adapter_g_.data() + off; }

  // ---- buffers --------------------------------------------------------------------------------
  ActBuf act_buf(size_t n) { return ActBuf(n); }
  StatBuf stat_buf(size_t n) { return StatBuf(n); }
  AttnSaved attention_saved(const AttentionShape& s) {
    const size_t rows = static_cast<size_t>(s.B) * s.NH * s.T;
    AttnSaved a{std::vector<T>(rows), {}};
    if (rows * s.T * sizeof(T) <= kSavedProbsBytes) a.probs.resize(rows * s.T);
    return a;
  }
  void plan_attention(const AttentionShape&) {}
  void synchronize() {}  // every op has finished when it returns
  static Act at(Act p, int64_t n) { return p + n; }
  void zero(Act p, size_t n) { std::fill_n(p, n, T(0)); }
  // n elements of −0, the exact identity of addition (x + (−0) is x for every x, −0 included).
  void fill_negative_zero(Act p, size_t n) { std::fill_n(p, n, -T(0)); }
  // The GELU of GPT-2's MLP is a separate pass here: linear_dgelu_bwd needs a (N, FF) scratch.
  bool fuses_gelu() const { return false; }
  // The Llama family's gate and up projections as one (N, 2·FF) product (model/transformer_impl.h).
  bool fuses_gate_up() const { return true; }
  bool fuses_qkv() const { return true; }  // the Llama family's q|k|v as one product
  const Real* scale_dloss(const Real* dloss) { return dloss; }

  // ---- ops ------------------------------------------------------------------------------------
  // pos (B, T) / seg (B, T) below: packed rows' per-token positions and segment ids, null for
  // none (model/transformer.h's TokenLayout).
  void embedding_fwd(Act out, const int32_t* tokens, Act wte, Act wpe, int B, int T_, int C, const int32_t* pos) {
    cpu::embedding_fwd<T>(out, tokens, wte, wpe, B, T_, C, pos);
  }
  void embedding_bwd(Grad dwte, Grad dwpe, Act dout, const int32_t* tokens, int B, int T_, int C,
                     const int32_t* pos) {
    cpu::embedding_bwd<T>(dwte, dwpe, dout, tokens, B, T_, C, pos);
  }
  void layernorm_fwd(Act out, Stat mean, Stat rstd, Act inp, Act w, Act b, int N, int C, float eps) {
    cpu::layernorm_fwd<T>(out, mean, rstd, inp, w, b, N, C, eps);
  }
  void residual_layernorm_fwd(Act res, Act out, Stat mean, Stat rstd, Act a, Act b, Act w, Act bias, int N,
                              int C, float eps) {
    cpu::residual_layernorm_fwd<T>(res, out, mean, rstd, a, b, w, bias, N, C, eps);
  }
  // dres (may be null) += Σ_rows of the updated dinp: the bias gradient of the linear layer whose
  // output the residual stream's gradient is, taken here so the GPU can sum it in the norm's pass.
  void layernorm_bwd(Act dinp, Grad dw, Grad db, Act dout, Act inp, Act w, Stat mean, Stat rstd, int N, int C,
                     Grad dres) {
    cpu::layernorm_bwd<T>(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
    if (dres) cpu::bias_grad<T>(dres, dinp, N, C);
  }
  void rmsnorm_fwd(Act out, Stat rstd, Act inp, Act w, int N, int C, float eps) {
    cpu::rmsnorm_fwd<T>(out, rstd, inp, w, N, C, eps);
  }
  void residual_rmsnorm_fwd(Act res, Act out, Stat rstd, Act a, Act b, Act w, int N, int C, float eps) {
    cpu::residual_rmsnorm_fwd<T>(res, out, rstd, a, b, w, N, C, eps);
  }
  void rmsnorm_bwd(Act dinp, Grad dw, Act dout, Act inp, Act w, Stat rstd, int N, int C, Grad dres) {
    cpu::rmsnorm_bwd<T>(dinp, dw, dout, inp, w, rstd, N, C);
    if (dres) cpu::bias_grad<T>(dres, dinp, N, C);
  }
  void head_rmsnorm(Act x, Act w, int N, int H, int HS, int64_t stride, float eps) {
    cpu::head_rmsnorm<T>(x, w, N, H, HS, stride, eps);
  }
  // Qwen3's q/k head norm + RoPE (rope null: none), one op on every backend; the backward writes
  // dx_raw (may alias dx) and accumulates dw. ld: the row stride of views into fused q|k|v rows
  // (0: dense; ops/head_norm_rope.h). H0 > 0: q's H0 heads and k's H − H0 in one call, gains and
  // their gradients (2, HS), rstd q's then k's.
  void head_norm_rope_fwd(Act x, Stat rstd, Act x_raw, Act w, int B, int T_, int H, int HS, float eps,
                          const Rope* rope, const int32_t* pos, int64_t ld, int H0 = 0) {
    cpu::head_norm_rope_fwd<T>(x, rstd, x_raw, w, B, T_, H, HS, eps, rope, pos, ld, H0);
  }
  void head_norm_rope_bwd(Act dx_raw, Grad dw, Act dx, Act x_raw, Act w, Stat rstd, int B, int T_, int H, int HS,
                          const Rope* rope, const int32_t* pos, int64_t ld, int H0 = 0) {
    cpu::head_norm_rope_bwd<T>(dx_raw, dw, dx, x_raw, w, rstd, B, T_, H, HS, rope, pos, ld, H0);
  }
  void linear_fwd(Act out, Act inp, Act w, Act bias, int N, int C, int OC, WeightLayout layout) {
    cpu::linear_fwd<T>(out, inp, w, bias, N, C, OC, layout);
  }
  // hidden = gelu(fc), fc = inp · op(W) + bias: the product, then the activation.
  void linear_gelu_fwd(Act hidden, Act fc, Act inp, Act w, Act bias, int N, int C, int OC, WeightLayout layout) {
    cpu::linear_fwd<T>(fc, inp, w, bias, N, C, OC, layout);
    cpu::gelu_fwd<T>(hidden, fc, static_cast<int64_t>(N) * OC);
  }
  // dinp (N, C) += (accumulate) or = dout · op(W)ᵀ; dW and dbias (when non-null) accumulate.
  void linear_bwd(Act dinp, Grad dw, Grad db, Act dout, Act inp, Act w, int N, int C, int OC, WeightLayout layout,
                  bool accumulate) {
    if (dinp != nullptr && !accumulate) zero(dinp, static_cast<size_t>(N) * C);
    cpu::linear_bwd<T>(dinp, dw, db, dout, inp, w, N, C, OC, layout);
  }
  // dfc (N, C) = (dout · op(W)ᵀ) ∘ gelu'(fc): the down projection's backward into `scratch`
  // (N, C), then the GELU's. dW and dbias accumulate.
  void linear_dgelu_bwd(Act dfc, Grad dw, Grad db, Act dout, Act inp, Act w, Act fc, Act scratch, int N, int C,
                        int OC, WeightLayout layout) {
    linear_bwd(scratch, dw, db, dout, inp, w, N, C, OC, layout, false);
    zero(dfc, static_cast<size_t>(N) * C);
    cpu::gelu_bwd<T>(dfc, fc, scratch, static_cast<int64_t>(N) * C);
  }
  // LoRA, A (r, C), B (OC, r): h (N, r) = inp · Aᵀ; out (N, OC) += scale · h · Bᵀ.
  void lora_fwd(Act out, Act h, Act inp, Act a, Act b, int N, int C, int OC, int r, double scale) {
    cpu::matmul<T>(h, inp, a, N, r, C, false, true);
    cpu::matmul<T>(out, h, b, N, OC, r, false, true, static_cast<T>(scale), T(1));
  }
  // Its backward: dB += scale · doutᵀ·h; dh (N, r) = scale · dout·B (scratch); dA += dhᵀ·inp;
  // dinp (N, C) += dh·A.
  void lora_bwd(Act dinp, Grad da, Grad db, Act dh, Act dout, Act inp, Act h, Act a, Act b, int N, int C, int OC,
                int r, double scale) {
    const T s = static_cast<T>(scale);
    cpu::matmul<T>(db, dout, h, OC, r, N, true, false, s, T(1));
    cpu::matmul<T>(dh, dout, b, N, r, OC, false, false, s, T(0));
    cpu::matmul<T>(da, dh, inp, r, C, N, true, false, T(1), T(1));
    cpu::matmul<T>(dinp, dh, a, N, C, r, false, false, T(1), T(1));
  }
  void swiglu_fwd(Act out, Act gate, Act up, int64_t n) { cpu::swiglu_fwd<T>(out, gate, up, n); }
  void swiglu_bwd(Act dgate, Act dup, Act dout, Act gate, Act up, int64_t n) {
    cpu::swiglu_bwd<T>(dgate, dup, dout, gate, up, n);
  }
  void swiglu_fwd_rows(Act out, Act gate, Act up, int rows, int ff, int64_t ld) {
    cpu::swiglu_fwd_rows<T>(out, gate, up, rows, ff, ld);
  }
  void swiglu_bwd_rows(Act dgate, Act dup, Act dout, Act gate, Act up, int rows, int ff, int64_t ld) {
    cpu::swiglu_bwd_rows<T>(dgate, dup, dout, gate, up, rows, ff, ld);
  }
  // ld: the row stride of a view into a fused q|k|v row (0: dense).
  void rope_fwd(Act x, int B, int T_, int H, int HS, const Rope& rope, const int32_t* pos, int64_t ld) {
    cpu::rope_fwd<T>(x, B, T_, H, HS, rope, 0, pos, ld);
  }
  void rope_bwd(Act dx, int B, int T_, int H, int HS, const Rope& rope, const int32_t* pos, int64_t ld) {
    cpu::rope_bwd<T>(dx, B, T_, H, HS, rope, 0, pos, ld);
  }
  // rope_bwd in place, then db (H·HS) += the column sums of the result (Qwen2's q/k bias gradient
  // in the rotation's pass on the GPU). ld as rope_bwd's.
  void rope_bias_bwd(Act dx, Grad db, int B, int T_, int H, int HS, const Rope& rope, const int32_t* pos,
                     int64_t ld) {
    cpu::rope_bias_bwd<T>(dx, db, B, T_, H, HS, rope, pos, ld);
  }
  // db (OC) += Σ_n dout[n, :], dout (N, OC) with row stride ld (0: OC): a bias gradient alone.
  void bias_grad(Grad db, Act dout, int N, int OC, int64_t ld) { cpu::bias_grad<T>(db, dout, N, OC, ld); }
  void attention_fwd(Act out, AttnSaved& saved, Act q, Act k, Act v, const AttentionShape& s,
                     const AttentionStrides& st, const int32_t* seg) {
    cpu::flash_attention_fwd<T>(out, saved.lse.data(), q, k, v, s, st,
                                saved.probs.empty() ? nullptr : saved.probs.data(), seg);
  }
  // Writes dq, dk, dv.
  void attention_bwd(Act dq, Act dk, Act dv, Act dout, Act q, Act k, Act v, Act out, AttnSaved& saved,
                     const AttentionShape& s, const AttentionStrides& st, const int32_t* seg) {
    cpu::flash_attention_bwd<T>(dq, dk, dv, dout, q, k, v, out, saved.lse.data(), s, st,
                                saved.probs.empty() ? nullptr : saved.probs.data(), seg);
  }
  void lm_head_cross_entropy(Stat losses, Act dx, Grad dw, Act x, Act w, const int32_t* targets, const Real* dloss,
                             int N, int C, int V, int Vp) {
    cpu::lm_head_cross_entropy<T>(losses, dx, dw, x, w, targets, dloss ? *dloss : T(0), N, C, V, Vp);
  }

  // ---- inference: KV-cache decoding (ops/decode.h) and sampling (ops/sample.h) ---------------
  template <class U>
  using Buf = std::vector<U>;
  template <class U>
  Buf<U> buf(size_t n) {
    return Buf<U>(n);
  }
  // Host <-> backend memory; here both are host memory.
  template <class U>
  void upload(U* dst, const U* host, size_t n) {
    std::copy_n(host, n, dst);
  }
  template <class U>
  void download(U* host, const U* src, size_t n) {
    std::copy_n(src, n, host);
  }
  // rows × width elements from src (row stride src_stride) to dst (row stride dst_stride).
  void copy_rows(Act dst, int64_t dst_stride, Act src, int64_t src_stride, int64_t rows, int64_t width) {
    for (int64_t r = 0; r < rows; ++r) std::copy_n(src + r * src_stride, width, dst + r * dst_stride);
  }
  void embedding_at(Act out, const int32_t* tokens, const int32_t* pos, Act wte, Act wpe, int N, int C) {
    cpu::embedding_at<T>(out, tokens, pos, wte, wpe, N, C);
  }
  void rope_at(Act x, const int32_t* pos, int N, int H, int HS, const Rope& rope, int64_t stride) {
    cpu::rope_at<T>(x, pos, N, H, HS, rope, stride);
  }
  void kv_append(Act ck, Act cv, Act k, Act v, const int32_t* pos, const DecodeShape& s, int64_t k_stride,
                 int64_t v_stride) {
    cpu::kv_append<T>(ck, cv, k, v, pos, s, k_stride, v_stride);
  }
  void decode_attention(Act out, Act q, Act ck, Act cv, const int32_t* pos, const DecodeShape& s, int64_t q_stride) {
    cpu::decode_attention<T>(out, q, ck, cv, pos, s, q_stride);
  }
  void rope_kv_append(Act qkv, int64_t stride, Act ck, Act cv, const int32_t* pos,
                      const DecodeShape& s, const Rope& rope) {
    cpu::rope_kv_append<T>(qkv, stride, ck, cv, pos, s, rope);
  }
  void advance_positions(int32_t* pos, int S, int32_t limit) { cpu::advance_positions(pos, S, limit); }
  void sample(int32_t* out, Act logits, const SamplerSettings* settings, uint8_t* seen, const int32_t* pos, int S,
              int V, int Vp) {
    cpu::sample_rows<T>(out, logits, settings, seen, pos, S, V, Vp);
  }
  // hidden (N, FF) = silu(inp · Wgᵀ) ∘ (inp · Wuᵀ), w_gate_up (2FF, C): gate rows, then up rows
  // (the parameter table stores gate_proj and up_proj contiguously). scratch: (N, 2FF).
  void linear_swiglu_fwd(Act hidden, Act scratch, Act inp, Act w_gate_up, int N, int C, int FF) {
    const int64_t nff = static_cast<int64_t>(N) * FF;
    cpu::linear_fwd<T>(scratch, inp, w_gate_up, nullptr, N, C, FF, WeightLayout::kOutIn);
    cpu::linear_fwd<T>(scratch + nff, inp, w_gate_up + static_cast<int64_t>(FF) * C, nullptr, N, C, FF,
                       WeightLayout::kOutIn);
    cpu::swiglu_fwd<T>(hidden, scratch, scratch + nff, nff);
  }
  // The decode step's fused ops (model/decode_impl.h; one kernel each on the GPU, small_gemm.cu
  // and decode_attention.cu): here the unfused ops they stand for, in order.
  // out = rmsnorm(x)·norm_w · Wᵀ + bias, W (OC, C); ln (N, C) and rstd (N) are scratch.
  void rmsnorm_linear_fwd(Act out, Act ln, Stat rstd, Act x, Act norm_w, Act w, Act bias, int N, int C, int OC,
                          float eps) {
    cpu::rmsnorm_fwd<T>(ln, rstd, x, norm_w, N, C, eps);
    cpu::linear_fwd<T>(out, ln, w, bias, N, C, OC, WeightLayout::kOutIn);
  }
  // hidden = linear_swiglu(rmsnorm(x)·norm_w); ln, rstd and scratch (N, 2FF) are scratch.
  void rmsnorm_linear_swiglu_fwd(Act hidden, Act scratch, Act ln, Stat rstd, Act x, Act norm_w, Act w_gate_up,
                                 int N, int C, int FF, float eps) {
    cpu::rmsnorm_fwd<T>(ln, rstd, x, norm_w, N, C, eps);
    linear_swiglu_fwd(hidden, scratch, ln, w_gate_up, N, C, FF);
  }
  // res (N, OC) += inp · op(W) + bias, the product stored in scratch (N, OC) first.
  void linear_residual_fwd(Act res, Act scratch, Act inp, Act w, Act bias, int N, int C, int OC,
                           WeightLayout layout) {
    cpu::linear_fwd<T>(scratch, inp, w, bias, N, C, OC, layout);
    const int64_t n = static_cast<int64_t>(N) * OC;
    for (int64_t i = 0; i < n; ++i) res[i] = res[i] + scratch[i];
  }
  // rope_kv_append (rope null: kv_append of the k and v columns), then decode_attention of the q
  // columns of qkv (S, stride).
  void rope_decode_attention(Act out, Act qkv, int64_t stride, Act ck, Act cv, const int32_t* pos,
                             const DecodeShape& s, const Rope* rope) {
    if (rope != nullptr) {
      cpu::rope_kv_append<T>(qkv, stride, ck, cv, pos, s, *rope);
    } else {
      const int64_t k = static_cast<int64_t>(s.NH) * s.HS, v = k + static_cast<int64_t>(s.NKV) * s.HS;
      cpu::kv_append<T>(ck, cv, qkv + k, qkv + v, pos, s, stride, stride);
    }
    cpu::decode_attention<T>(out, qkv, ck, cv, pos, s, stride);
  }
  // A decode step as one replayable unit: the CUDA backend captures a graph; here capture keeps
  // the function and launch calls it.
  struct StepGraph {
    std::function<void()> f;
  };
  void capture(StepGraph& g, std::function<void()> f) { g.f = std::move(f); }
  void launch(StepGraph& g) { g.f(); }
  // Ids read back behind the stream (decode_loop.h pipelines its steps on it): the CUDA backend
  // copies into pinned memory and waits at readback_wait; here the copy is done at start.
  struct Readback {
    std::vector<int32_t> host;
  };
  void readback_start(Readback& r, const int32_t* src, size_t n) { r.host.assign(src, src + n); }
  const int32_t* readback_wait(Readback& r) { return r.host.data(); }

 private:
  std::vector<T> weights_, grads_;
  std::vector<T> adapter_w_, adapter_g_;  // LoRA
};

}  // namespace forge
