// CudaBackend (backend.h): parameter storage, op bindings and the optimizer on one Context.
#include "forge/backend/cuda/backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "forge/backend/cuda/check.h"
#include "forge/backend/cuda/gemm.h"
#include "forge/backend/cuda/small_gemm.h"
#include "forge/core/error.h"

namespace forge {

using cuda::GemmArgs;

namespace {
// f32 elements staged at a time between the host and a frozen 16-bit base (which has no f32
// master): 16 MiB, so uploading a large base does not hold a second, f32 copy of it.
constexpr int64_t kStagingElems = int64_t{1} << 22;
}  // namespace

CudaBackend::CudaBackend(const ModelConfig& cfg, const ParamTable& table, cuda::Context& ctx,
                         const CudaModelOptions& o)
    : ctx_(ctx), table_(table), dt_(o.dtype), es_(dtype_size(o.dtype)) {
  if (dt_ != DType::kF32 && dt_ != DType::kBF16 && dt_ != DType::kF16)
    throw Error(str("CUDA training supports fp32, bf16 and f16 compute, not ", dtype_name(dt_)));
  // Flash attention needs 16-bit inputs; fp32 mode keeps the unfused path (exact CPU parity).
  flash_ = cuda::flash_attention_supported(dt_, cfg.head_dim()) && o.attention != AttentionPath::kUnfused;
  flash_kernels_ = o.attention == AttentionPath::kFlashMma          ? cuda::FlashKernels::kMma
                   : o.attention == AttentionPath::kFlashWgmma      ? cuda::FlashKernels::kWgmma
                   : o.attention == AttentionPath::kFlashWgmmaSplit ? cuda::FlashKernels::kWgmmaSplit
                                                                    : cuda::FlashKernels::kAuto;
  ctx.set_gemm_algo(o.gemm_algo);
  fuse_qkv_ = o.fuse_qkv;
  init_fp8(o.fp8);
  auto& a = ctx.allocator();
  const size_t P = table_.total();
  // A frozen base (LoRA) has no gradients or Adam state, and in 16-bit modes the working copy
  // is all of it (fp32 computes on the master).
  if (dt_ == DType::kF32 || !o.frozen_base) master_ = Buf<float>(a, P);
  if (!o.frozen_base) {
    grads_ = Buf<float>(a, P);
    if (o.adam_state) {
      m_ = Buf<float>(a, P);
      v_ = Buf<float>(a, P);
    }
  }
  if (dt_ != DType::kF32) work_ = Buf<uint8_t>(a, P * es_);
  norm_sq_ = Buf<float>(a, 1);
  factors_ = Buf<AdamWFactors>(a, 2);
  guard_ = Buf<StepGuardState>(a, 1);
  set_step_guard(StepGuardState{});
  if (dt_ == DType::kF16) {
    const LossScaleOptions& ls = o.loss_scale;
    if (!(ls.init_scale > 0.0f) || ls.growth_interval < 1)
      throw Error(str("loss scaling: init scale ", ls.init_scale, " and growth interval ", ls.growth_interval,
                      " (expected > 0 and >= 1)"));
    loss_scale_ = Buf<LossScaleState>(a, 1);
    scaled_dloss_ = Buf<float>(a, 1);
    set_loss_scale(loss_scale_init(ls));
  }
  if (m_.size() > 0) {
    FORGE_CUDA_CHECK(cudaMemsetAsync(m_.data(), 0, m_.bytes(), ctx_.stream()));
    FORGE_CUDA_CHECK(cudaMemsetAsync(v_.data(), 0, v_.bytes(), ctx_.stream()));
  }
  zero_grad();
}

// ---- parameters -------------------------------------------------------------------------------

CudaBackend::Act CudaBackend::w(int64_t off) const {
  if (dt_ == DType::kF32) return master_.data() + off;
  return work_.data() + off * es_;
}

void CudaBackend::set_weights(const std::vector<float>& host) {
  // Sizes come from checkpoints (the user's files): a mismatch is an Error, not a broken invariant.
  if (host.size() != static_cast<size_t>(table_.total()))
    throw Error(str("set_weights: ", host.size(), " values for ", table_.total(), " parameters"));
  if (master_.size() > 0) {
    FORGE_CUDA_CHECK(
        cudaMemcpyAsync(master_.data(), host.data(), master_.bytes(), cudaMemcpyHostToDevice, ctx_.stream()));
    if (dt_ != DType::kF32) cuda::convert(ctx_, dt_, work_.data(), DType::kF32, master_.data(), table_.total());
  } else {  // a frozen 16-bit base has no master: through a bounded f32 staging buffer
    const int64_t P = table_.total(), chunk = std::min<int64_t>(P, kStagingElems);
    Buf<float> staging(ctx_.allocator(), chunk);
    for (int64_t off = 0; off < P; off += chunk) {
      const int64_t n = std::min(chunk, P - off);
      FORGE_CUDA_CHECK(cudaMemcpyAsync(staging.data(), host.data() + off, n * sizeof(float), cudaMemcpyHostToDevice,
                                       ctx_.stream()));
      cuda::convert(ctx_, dt_, work_.data() + off * es_, DType::kF32, staging.data(), n);
    }
    ctx_.synchronize();  // before the staging buffer goes back to the cache
  }
  ctx_.synchronize();  // the host vector may go away
}

namespace {

std::vector<float> to_host(cuda::Context& ctx, const cuda::DeviceBuffer<float>& d) {
  std::vector<float> h(d.size());
  ctx.synchronize();
  if (d.size() > 0) FORGE_CUDA_CHECK(cudaMemcpy(h.data(), d.data(), d.bytes(), cudaMemcpyDeviceToHost));
  return h;
}

}  // namespace

std::vector<float> CudaBackend::weights_host() const {
  if (master_.size() > 0) return to_host(ctx_, master_);
  // A frozen 16-bit base: its working copy, widened through a bounded staging buffer.
  const int64_t P = table_.total(), chunk = std::min<int64_t>(P, kStagingElems);
  std::vector<float> h(P);
  Buf<float> staging(ctx_.allocator(), chunk);
  for (int64_t off = 0; off < P; off += chunk) {
    const int64_t n = std::min(chunk, P - off);
    cuda::convert(ctx_, DType::kF32, staging.data(), dt_, work_.data() + off * es_, n);
    ctx_.synchronize();
    FORGE_CUDA_CHECK(cudaMemcpy(h.data() + off, staging.data(), n * sizeof(float), cudaMemcpyDeviceToHost));
  }
  return h;
}
std::vector<float> CudaBackend::grads_host() const { return to_host(ctx_, grads_); }
std::vector<float> CudaBackend::adam_m_host() const { return to_host(ctx_, m_); }
std::vector<float> CudaBackend::adam_v_host() const { return to_host(ctx_, v_); }

void CudaBackend::set_adam_state(const std::vector<float>& m, const std::vector<float>& v) {
  if (m.empty() && v.empty()) {  // zeros (train/runner.h)
    FORGE_CUDA_CHECK(cudaMemsetAsync(m_.data(), 0, m_.bytes(), ctx_.stream()));
    FORGE_CUDA_CHECK(cudaMemsetAsync(v_.data(), 0, v_.bytes(), ctx_.stream()));
    ctx_.synchronize();
    return;
  }
  if (m.size() != m_.size() || v.size() != v_.size())
    throw Error(str("set_adam_state: ", m.size(), " and ", v.size(), " values for ", m_.size(),
                    " trained parameters"));
  // On our stream (a pageable cudaMemcpy may return before its DMA lands, and our stream does
  // not wait for the default one), then waited for: the host vectors may go away.
  FORGE_CUDA_CHECK(cudaMemcpyAsync(m_.data(), m.data(), m_.bytes(), cudaMemcpyHostToDevice, ctx_.stream()));
  FORGE_CUDA_CHECK(cudaMemcpyAsync(v_.data(), v.data(), v_.bytes(), cudaMemcpyHostToDevice, ctx_.stream()));
  ctx_.synchronize();
}

LossScaleState CudaBackend::loss_scale_host() const {
  FORGE_CHECK(loss_scale_.size() > 0, "loss_scale_host(): no loss scaling in ", dtype_name(dt_), " mode");
  LossScaleState s;
  ctx_.synchronize();
  FORGE_CUDA_CHECK(cudaMemcpy(&s, loss_scale_.data(), sizeof(s), cudaMemcpyDeviceToHost));
  return s;
}

void CudaBackend::set_loss_scale(const LossScaleState& s) {
  FORGE_CHECK(loss_scale_.size() > 0, "set_loss_scale(): no loss scaling in ", dtype_name(dt_), " mode");
  FORGE_CUDA_CHECK(cudaMemcpyAsync(loss_scale_.data(), &s, sizeof(s), cudaMemcpyHostToDevice, ctx_.stream()));
  ctx_.synchronize();  // `s` may go out of scope
}

StepGuardState CudaBackend::step_guard_host() const {
  StepGuardState s;
  ctx_.synchronize();
  FORGE_CUDA_CHECK(cudaMemcpy(&s, guard_.data(), sizeof(s), cudaMemcpyDeviceToHost));
  return s;
}

void CudaBackend::set_step_guard(const StepGuardState& s) {
  FORGE_CUDA_CHECK(
      cudaMemcpyAsync(guard_.data(), &s, sizeof(s), cudaMemcpyHostToDevice, ctx_.stream()));
  ctx_.synchronize();  // `s` may go out of scope
}

void CudaBackend::zero_grad() {
  if (grads_.size() > 0) FORGE_CUDA_CHECK(cudaMemsetAsync(grads_.data(), 0, grads_.bytes(), ctx_.stream()));
  if (a_grads_.size() > 0) FORGE_CUDA_CHECK(cudaMemsetAsync(a_grads_.data(), 0, a_grads_.bytes(), ctx_.stream()));
}

// ---- LoRA adapters ------------------------------------------------------------------------------

void CudaBackend::set_adapter(const std::vector<float>& a, const std::vector<ParamInfo>& params) {
  FORGE_CHECK(!has_adapter(), "set_adapter: the backend has adapters already");
  int64_t total = 0;
  for (const ParamInfo& p : params) total = std::max(total, p.offset + p.numel());
  FORGE_CHECK(total > 0 && static_cast<size_t>(total) == a.size(), "set_adapter: ", a.size(),
              " values for an adapter table of ", total);
  // The base is frozen from now on: its gradients, Adam state and (16-bit) master go. The
  // allocator reuses freed blocks in stream order, so queued work that reads them is safe.
  grads_ = Buf<float>();
  m_ = Buf<float>();
  v_ = Buf<float>();
  if (dt_ != DType::kF32) master_ = Buf<float>();
  auto& al = ctx_.allocator();
  const size_t A = a.size();
  a_params_ = params;
  a_master_ = Buf<float>(al, A);
  a_grads_ = Buf<float>(al, A);
  m_ = Buf<float>(al, A);
  v_ = Buf<float>(al, A);
  if (dt_ != DType::kF32) a_work_ = Buf<uint8_t>(al, A * es_);
  FORGE_CUDA_CHECK(cudaMemsetAsync(m_.data(), 0, m_.bytes(), ctx_.stream()));
  FORGE_CUDA_CHECK(cudaMemsetAsync(v_.data(), 0, v_.bytes(), ctx_.stream()));
  set_adapter_weights(a);
  zero_grad();
}

void CudaBackend::set_adapter_weights(const std::vector<float>& a) {
  FORGE_CHECK(has_adapter(), "set_adapter_weights without adapters");
  if (a.size() != a_master_.size())
    throw Error(str("set_adapter_weights: ", a.size(), " values for ", a_master_.size(), " adapter parameters"));
  FORGE_CUDA_CHECK(cudaMemcpyAsync(a_master_.data(), a.data(), a_master_.bytes(), cudaMemcpyHostToDevice,
                                   ctx_.stream()));
  if (dt_ != DType::kF32)
    cuda::convert(ctx_, dt_, a_work_.data(), DType::kF32, a_master_.data(), static_cast<int64_t>(a.size()));
  ctx_.synchronize();  // the host vector may go away
}

std::vector<float> CudaBackend::adapter_weights_host() const { return to_host(ctx_, a_master_); }
std::vector<float> CudaBackend::adapter_grads_host() const { return to_host(ctx_, a_grads_); }

CudaBackend::Act CudaBackend::aw(int64_t off) const {
  if (dt_ == DType::kF32) return a_master_.data() + off;
  return a_work_.data() + off * es_;
}

void CudaBackend::zero(Act p, size_t n) { FORGE_CUDA_CHECK(cudaMemsetAsync(p, 0, n * es_, ctx_.stream())); }

// −0 in f32, bf16 and f16 alike: the sign bit alone, the top bit of the element's last byte
// (little-endian).
void CudaBackend::fill_negative_zero(Act p, size_t n) {
  std::vector<uint8_t> host(n * es_, 0);
  for (size_t i = 0; i < n; ++i) host[i * es_ + es_ - 1] = 0x80;
  upload_bytes(p, host.data(), host.size());
}

const CudaBackend::Real* CudaBackend::scale_dloss(const Real* dloss) {
  if (loss_scale_.size() == 0) return dloss;
  cuda::loss_scale_dloss(ctx_, scaled_dloss_.data(), dloss, loss_scale_.data());
  return scaled_dloss_.data();
}

// ---- optimizer ---------------------------------------------------------------------------------

std::array<AdamWFactors, 2> CudaBackend::optimizer_factors(const AdamWParams& p, uint64_t sr_seed) {
  AdamWParams no_decay = p;
  no_decay.weight_decay = 0.0f;
  return {adamw_factors(p, sr_seed), adamw_factors(no_decay, sr_seed)};
}

void CudaBackend::optimizer_step(const AdamWFactors* factors, float max_norm,
                                 const double* loss_sums, int n_losses) {
  // With adapters the optimizer trains them alone (the base is frozen).
  const bool lora = has_adapter();
  FORGE_CHECK(lora || grads_.size() > 0, "optimizer_step: a frozen base without adapters has nothing to train");
  float* master = master_data();  // what trains: the adapters' buffers with adapters
  float* grads = grads_data();
  uint8_t* work16 = work_data();
  cuda::sum_squares(ctx_, norm_sq_.data(), grads, num_params());
  cuda::step_guard_check(ctx_, guard_.data(), loss_sums, n_losses, norm_sq_.data(),
                         loss_scale() != nullptr);
  for (const auto& info : params()) {
    void* work = work16 == nullptr ? nullptr : work16 + info.offset * es_;
    cuda::adamw_update(
        ctx_, master + info.offset, m_.data() + info.offset, v_.data() + info.offset,
        grads + info.offset, work, dt_, info.numel(), factors + (info.decay ? 0 : 1),
        static_cast<uint64_t>(info.offset), norm_sq_.data(), max_norm, loss_scale(), guard_.data());
  }
  if (loss_scale_.size() > 0)
    cuda::loss_scale_step(ctx_, loss_scale_.data(), norm_sq_.data(), guard_.data());
}

void CudaBackend::optimizer_step(const AdamWParams& p, float max_norm, uint64_t sr_seed) {
  // A pageable cudaMemcpyAsync returns once the source is staged, so the local array may go.
  const std::array<AdamWFactors, 2> f = optimizer_factors(p, sr_seed);
  FORGE_CUDA_CHECK(cudaMemcpyAsync(factors_.data(), f.data(), sizeof(f), cudaMemcpyHostToDevice, ctx_.stream()));
  optimizer_step(factors_.data(), max_norm);
}

// ---- ops ----------------------------------------------------------------------------------------

void CudaBackend::embedding_fwd(Act out, const int32_t* tokens, Act wte, Act wpe, int B, int T_, int C,
                                const int32_t* pos) {
  cuda::embedding_fwd(ctx_, dt_, out, tokens, wte, wpe, B, T_, C, pos);
}
void CudaBackend::embedding_bwd(Grad dwte, Grad dwpe, Act dout, const int32_t* tokens, int B, int T_, int C,
                                const int32_t* pos) {
  cuda::embedding_bwd(ctx_, dt_, dwte, dwpe, dout, tokens, B, T_, C, pos);
}
// The norm forwards also write their output's E4M3 rows for the FP8 product that reads it next
// (backend_fp8.cpp: fp8_norm_out / fp8_norm_done).
void CudaBackend::layernorm_fwd(Act out, Stat mean, Stat rstd, Act inp, Act w, Act b, int N, int C, float eps) {
  const Fp8Rows o = fp8_norm_out(N, C);
  fp8_norm_done(cuda::layernorm_fwd(ctx_, dt_, out, mean, rstd, inp, w, b, N, C, eps, o.q, o.descale), out, N, C);
}
void CudaBackend::residual_layernorm_fwd(Act res, Act out, Stat mean, Stat rstd, Act a, Act b, Act w, Act bias, int N,
                                         int C, float eps) {
  const Fp8Rows o = fp8_norm_out(N, C);
  fp8_norm_done(
      cuda::residual_layernorm_fwd(ctx_, dt_, res, out, mean, rstd, a, b, w, bias, N, C, eps, o.q, o.descale), out,
      N, C);
}
void CudaBackend::layernorm_bwd(Act dinp, Grad dw, Grad db, Act dout, Act inp, Act w, Stat mean, Stat rstd, int N,
                                int C, Grad dres) {
  cuda::layernorm_bwd(ctx_, dt_, dinp, dw, db, dout, inp, w, mean, rstd, N, C, dres);
}
void CudaBackend::rmsnorm_fwd(Act out, Stat rstd, Act inp, Act w, int N, int C, float eps) {
  const Fp8Rows o = fp8_norm_out(N, C);
  fp8_norm_done(cuda::rmsnorm_fwd(ctx_, dt_, out, rstd, inp, w, N, C, eps, o.q, o.descale), out, N, C);
}
void CudaBackend::residual_rmsnorm_fwd(Act res, Act out, Stat rstd, Act a, Act b, Act w, int N, int C, float eps) {
  const Fp8Rows o = fp8_norm_out(N, C);
  fp8_norm_done(cuda::residual_rmsnorm_fwd(ctx_, dt_, res, out, rstd, a, b, w, N, C, eps, o.q, o.descale), out, N,
                C);
}
void CudaBackend::rmsnorm_bwd(Act dinp, Grad dw, Act dout, Act inp, Act w, Stat rstd, int N, int C, Grad dres) {
  cuda::rmsnorm_bwd(ctx_, dt_, dinp, dw, dout, inp, w, rstd, N, C, dres);
}
void CudaBackend::head_rmsnorm(Act x, Act w, int N, int H, int HS, int64_t stride, float eps) {
  cuda::head_rmsnorm(ctx_, dt_, x, w, N, H, HS, stride, eps);
}
void CudaBackend::head_norm_rope_fwd(Act x, Stat rstd, Act x_raw, Act w, int B, int T_, int H, int HS, float eps,
                                     const Rope* rope, const int32_t* pos, int64_t ld, int H0) {
  cuda::head_norm_rope_fwd(ctx_, dt_, x, rstd, x_raw, w, B, T_, H, HS, eps, rope, pos, ld, H0);
}
void CudaBackend::head_norm_rope_bwd(Act dx_raw, Grad dw, Act dx, Act x_raw, Act w, Stat rstd, int B, int T_, int H,
                                     int HS, const Rope* rope, const int32_t* pos, int64_t ld, int H0) {
  cuda::head_norm_rope_bwd(ctx_, dt_, dx_raw, dw, dx, x_raw, w, rstd, B, T_, H, HS, rope, pos, ld, H0);
}

// out (N, OC) = inp (N, C) · op(W) (+ bias in the GEMM's epilogue); W is (OC, C) (kOutIn) or (C, OC).
// A few rows (decoding: one per sequence) go to the small-N kernels where they beat cuBLASLt,
// which is latency-bound there (small_gemm.cu has the measurements); training's N = B·T never does.
void CudaBackend::linear_fwd(Act out, Act inp, Act w, Act bias, int N, int C, int OC, WeightLayout layout) {
  if (cuda::small_linear_eligible(dt_, N, C, OC, layout) && cuda::small_linear_aligned(out, inp, w)) {
    cuda::small_linear_fwd(ctx_, dt_, out, inp, w, bias, N, C, OC, layout);
    return;
  }
  GemmArgs g;
  g.M = N, g.N = OC, g.K = C, g.trans_b = layout == WeightLayout::kOutIn;
  g.ab_type = g.c_type = dt_;
  if (bias) g.epilogue = cuda::GemmEpilogue::kBias, g.bias = bias;
  if (fp8_eligible(w, inp, N, C, OC)) return fp8_gemm(g, inp, false, w, layout == WeightLayout::kInOut, out);
  cuda::gemm(ctx_, g, inp, w, out);
}

// 16-bit modes: one GEMM writing both hidden = gelu(fc) and fc (the aux output the backward
// needs, GELU_AUX_BIAS); fp32: the GEMM and a GELU kernel.
void CudaBackend::linear_gelu_fwd(Act hidden, Act fc, Act inp, Act w, Act bias, int N, int C, int OC,
                                  WeightLayout layout) {
  if (!fuses_gelu() || bias == nullptr) {
    linear_fwd(fc, inp, w, bias, N, C, OC, layout);
    cuda::gelu_fwd(ctx_, dt_, hidden, fc, static_cast<int64_t>(N) * OC);
    return;
  }
  GemmArgs g;
  g.M = N, g.N = OC, g.K = C, g.trans_b = layout == WeightLayout::kOutIn;
  g.ab_type = g.c_type = dt_;
  g.epilogue = cuda::GemmEpilogue::kBiasGeluAux, g.bias = bias, g.aux = fc;
  if (fp8_eligible(w, inp, N, C, OC)) return fp8_gemm(g, inp, false, w, layout == WeightLayout::kInOut, hidden);
  cuda::gemm(ctx_, g, inp, w, hidden);
}

// dW (f32, W's layout) += and dbias (f32, when non-null) += the products of dout and inp.
void CudaBackend::weight_grads(Grad dw, Grad db, Act dout, Act inp, int N, int C, int OC, WeightLayout layout) {
  GemmArgs g;
  g.trans_a = true, g.beta = 1.0f, g.ab_type = dt_, g.c_type = DType::kF32, g.K = N;
  if (dw == nullptr) {
    // A frozen weight (LoRA's base, model/lora.h): its gradient is not computed.
  } else if (layout == WeightLayout::kInOut) {  // dW (C, OC) += inpᵀ · dout
    g.M = C, g.N = OC;
    cuda::gemm(ctx_, g, inp, dout, dw);
  } else {  // dW (OC, C) += doutᵀ · inp
    g.M = OC, g.N = C;
    cuda::gemm(ctx_, g, dout, inp, dw);
  }
  if (db) cuda::bias_grad(ctx_, dt_, db, dout, N, OC);  // dbias += Σ_n dout
}

// The first product into a gradient buffer overwrites it (beta 0): no memset, no read.
void CudaBackend::linear_bwd(Act dinp, Grad dw, Grad db, Act dout, Act inp, Act w, int N, int C, int OC,
                             WeightLayout layout, bool accumulate) {
  bool bias_summed = false;  // by the FP8 cast of dout (cast_fp8_rows_bias): one read for both
  if (dinp) {
    GemmArgs g;  // dinp (+)= dout (N, OC) · op(W) (OC, C)
    g.M = N, g.N = C, g.K = OC, g.trans_b = layout == WeightLayout::kInOut, g.beta = accumulate ? 1.0f : 0.0f;
    g.ab_type = g.c_type = dt_;
    const bool bias_sum =
        fp8_ == Fp8Recipe::kRowsDx && db != nullptr && cuda::cast_fp8_rows_bias_fused(dt_, OC);
    if (fp8_eligible(w, dout, N, OC, C, bias_sum)) {
      fp8_gemm(g, dout, true, w, layout == WeightLayout::kOutIn, dinp, bias_sum ? db : nullptr);
      bias_summed = bias_sum;
    } else {
      cuda::gemm(ctx_, g, dout, w, dinp);
    }
  }
  weight_grads(dw, bias_summed ? nullptr : db, dout, inp, N, C, OC, layout);
}

void CudaBackend::linear_dgelu_bwd(Act dfc, Grad dw, Grad db, Act dout, Act inp, Act w, Act fc, Act scratch, int N,
                                   int C, int OC, WeightLayout layout) {
  if (!fuses_gelu()) {
    linear_bwd(scratch, dw, db, dout, inp, w, N, C, OC, layout, false);
    zero(dfc, static_cast<size_t>(N) * C);
    cuda::gelu_bwd(ctx_, dt_, dfc, fc, scratch, static_cast<int64_t>(N) * C);
    return;
  }
  GemmArgs g;  // dfc = (dout · op(W)) ∘ gelu'(fc): the GELU backward in the product's epilogue
  g.M = N, g.N = C, g.K = OC, g.trans_b = layout == WeightLayout::kInOut;
  g.ab_type = g.c_type = dt_;
  g.epilogue = cuda::GemmEpilogue::kDGelu, g.aux = fc;
  // Stays bf16 under FORGE_FP8: cuBLASLt runs an FP8 product's DGELU as a separate epilogue
  // kernel over an f32 copy of the product (GPT-2 124M on an H100: 295 + 1,330 µs a call against
  // 606 µs for the fused bf16 kernel; docs/perf/fp8.md, "FP8 with per-row scales").
  cuda::gemm(ctx_, g, dout, w, dfc);
  weight_grads(dw, db, dout, inp, N, C, OC, layout);
}

// Small N: one kernel computes both products and the SwiGLU (nothing goes through scratch);
// otherwise gate = scratch[0, N·FF) and up = scratch[N·FF, 2·N·FF) by two linear_fwd, then
// swiglu_fwd — the CPU backend's composition.
void CudaBackend::linear_swiglu_fwd(Act hidden, Act scratch, Act inp, Act w_gate_up, int N, int C, int FF) {
  if (cuda::small_linear_swiglu_eligible(dt_, N, C, FF) && cuda::small_linear_aligned(hidden, inp, w_gate_up)) {
    cuda::small_linear_swiglu_fwd(ctx_, dt_, hidden, inp, w_gate_up, N, C, FF);
    return;
  }
  const int64_t nff = static_cast<int64_t>(N) * FF;
  linear_fwd(scratch, inp, w_gate_up, nullptr, N, C, FF, WeightLayout::kOutIn);
  linear_fwd(at(scratch, nff), inp, at(w_gate_up, static_cast<int64_t>(FF) * C), nullptr, N, C, FF,
             WeightLayout::kOutIn);
  swiglu_fwd(hidden, scratch, at(scratch, nff), nff);
}

// LoRA's two thin products each way, on cuBLASLt like every other product; the alpha/beta of
// each GEMM are the CPU twin's scale and accumulate (backend/cpu/backend.h).
void CudaBackend::lora_fwd(Act out, Act h, Act inp, Act a, Act b, int N, int C, int OC, int r, double scale) {
  GemmArgs gh;  // h (N, r) = inp (N, C) · Aᵀ
  gh.M = N, gh.N = r, gh.K = C, gh.trans_b = true;
  gh.ab_type = gh.c_type = dt_;
  cuda::gemm(ctx_, gh, inp, a, h);
  GemmArgs go;  // out (N, OC) += scale · h · Bᵀ
  go.M = N, go.N = OC, go.K = r, go.trans_b = true, go.alpha = static_cast<float>(scale), go.beta = 1.0f;
  go.ab_type = go.c_type = dt_;
  cuda::gemm(ctx_, go, h, b, out);
}

void CudaBackend::lora_bwd(Act dinp, Grad da, Grad db, Act dh, Act dout, Act inp, Act h, Act a, Act b, int N, int C,
                           int OC, int r, double scale) {
  const float s = static_cast<float>(scale);
  GemmArgs gb;  // dB (OC, r) f32 += s · doutᵀ (OC, N) · h (N, r)
  gb.M = OC, gb.N = r, gb.K = N, gb.trans_a = true, gb.alpha = s, gb.beta = 1.0f;
  gb.ab_type = dt_, gb.c_type = DType::kF32;
  cuda::gemm(ctx_, gb, dout, h, db);
  GemmArgs gh;  // dh (N, r) = s · dout (N, OC) · B (OC, r)
  gh.M = N, gh.N = r, gh.K = OC, gh.alpha = s;
  gh.ab_type = gh.c_type = dt_;
  cuda::gemm(ctx_, gh, dout, b, dh);
  GemmArgs ga;  // dA (r, C) f32 += dhᵀ (r, N) · inp (N, C)
  ga.M = r, ga.N = C, ga.K = N, ga.trans_a = true, ga.beta = 1.0f;
  ga.ab_type = dt_, ga.c_type = DType::kF32;
  cuda::gemm(ctx_, ga, dh, inp, da);
  GemmArgs gi;  // dinp (N, C) += dh (N, r) · A (r, C)
  gi.M = N, gi.N = C, gi.K = r, gi.beta = 1.0f;
  gi.ab_type = gi.c_type = dt_;
  cuda::gemm(ctx_, gi, dh, a, dinp);
}

void CudaBackend::swiglu_fwd(Act out, Act gate, Act up, int64_t n) { cuda::swiglu_fwd(ctx_, dt_, out, gate, up, n); }
void CudaBackend::swiglu_bwd(Act dgate, Act dup, Act dout, Act gate, Act up, int64_t n) {
  cuda::swiglu_bwd(ctx_, dt_, dgate, dup, dout, gate, up, n);
}
void CudaBackend::swiglu_fwd_rows(Act out, Act gate, Act up, int rows, int ff, int64_t ld) {
  cuda::swiglu_fwd_rows(ctx_, dt_, out, gate, up, rows, ff, ld);
}
void CudaBackend::swiglu_bwd_rows(Act dgate, Act dup, Act dout, Act gate, Act up, int rows, int ff, int64_t ld) {
  cuda::swiglu_bwd_rows(ctx_, dt_, dgate, dup, dout, gate, up, rows, ff, ld);
}
void CudaBackend::rope_fwd(Act x, int B, int T_, int H, int HS, const Rope& rope, const int32_t* pos, int64_t ld) {
  cuda::rope_fwd(ctx_, dt_, x, B, T_, H, HS, rope, 0, pos, ld);
}
void CudaBackend::rope_bwd(Act dx, int B, int T_, int H, int HS, const Rope& rope, const int32_t* pos, int64_t ld) {
  cuda::rope_bwd(ctx_, dt_, dx, B, T_, H, HS, rope, 0, pos, ld);
}
void CudaBackend::bias_grad(Grad db, Act dout, int N, int OC, int64_t ld) {
  cuda::bias_grad(ctx_, dt_, db, dout, N, OC, ld);
}
void CudaBackend::rope_bias_bwd(Act dx, Grad db, int B, int T_, int H, int HS, const Rope& rope,
                                const int32_t* pos, int64_t ld) {
  cuda::rope_bias_bwd(ctx_, dt_, dx, db, B, T_, H, HS, rope, pos, ld);
}

// ---- attention ----------------------------------------------------------------------------------

CudaBackend::AttnSaved CudaBackend::attention_saved(const AttentionShape& s) {
  AttnSaved a;
  const size_t rows = static_cast<size_t>(s.B) * s.NH * s.T;
  if (flash_) a.lse = Buf<float>(ctx_.allocator(), rows);
  else a.att = Buf<uint8_t>(ctx_.allocator(), rows * s.T * es_);
  return a;
}

void CudaBackend::plan_attention(const AttentionShape& s) {
  auto& a = ctx_.allocator();
  const size_t N = static_cast<size_t>(s.B) * s.T;
  if (flash_) {
    delta_ = Buf<float>(a, N * s.NH);
    return;
  }
  const size_t nq = N * s.NH * s.HS * es_, nkv = N * s.NKV * s.HS * es_;
  dense_q_ = Buf<uint8_t>(a, nq), dense_dq_ = Buf<uint8_t>(a, nq);
  dense_k_ = Buf<uint8_t>(a, nkv), dense_dk_ = Buf<uint8_t>(a, nkv);
  dense_v_ = Buf<uint8_t>(a, nkv), dense_dv_ = Buf<uint8_t>(a, nkv);
}

bool CudaBackend::dense(const AttentionShape& s, const AttentionStrides& st) const {
  const int64_t q = static_cast<int64_t>(s.NH) * s.HS, kv = static_cast<int64_t>(s.NKV) * s.HS;
  return (st.q == 0 || st.q == q) && (st.k == 0 || st.k == kv) && (st.v == 0 || st.v == kv);
}

// rows × width elements between a strided view (stride elements per row) and a dense buffer.
void CudaBackend::to_dense(Act dense, Act strided, int64_t stride, int64_t width, int64_t rows, bool from_strided) {
  const size_t pitch = stride * es_, w = width * es_;
  if (from_strided)
    FORGE_CUDA_CHECK(cudaMemcpy2DAsync(dense, w, strided, pitch, w, rows, cudaMemcpyDeviceToDevice, ctx_.stream()));
  else
    FORGE_CUDA_CHECK(cudaMemcpy2DAsync(strided, pitch, dense, w, w, rows, cudaMemcpyDeviceToDevice, ctx_.stream()));
}

// The unfused kernels take dense q/k/v: strided views are copied into scratch first (fp32's path
// and the forced comparison path; flash reads the views in place).
void CudaBackend::attention_fwd(Act out, AttnSaved& saved, Act q, Act k, Act v, const AttentionShape& s,
                                const AttentionStrides& st, const int32_t* seg) {
  if (flash_) {
    cuda::flash_attention_fwd(ctx_, dt_, out, saved.lse.data(), q, k, v, s, st, flash_kernels_, seg);
    return;
  }
  FORGE_CHECK(st.o == 0 || st.o == static_cast<int64_t>(s.NH) * s.HS, "unfused attention: strided output");
  if (!dense(s, st)) {
    const int64_t rows = static_cast<int64_t>(s.B) * s.T, wq = static_cast<int64_t>(s.NH) * s.HS;
    const int64_t wkv = static_cast<int64_t>(s.NKV) * s.HS;
    to_dense(dense_q_.data(), q, st.q ? st.q : wq, wq, rows, true);
    to_dense(dense_k_.data(), k, st.k ? st.k : wkv, wkv, rows, true);
    to_dense(dense_v_.data(), v, st.v ? st.v : wkv, wkv, rows, true);
    q = dense_q_.data(), k = dense_k_.data(), v = dense_v_.data();
  }
  cuda::attention_fwd(ctx_, dt_, out, saved.att.data(), q, k, v, s, seg);
}

void CudaBackend::attention_bwd(Act dq, Act dk, Act dv, Act dout, Act q, Act k, Act v, Act out, AttnSaved& saved,
                                const AttentionShape& s, const AttentionStrides& st, const int32_t* seg) {
  if (flash_) {  // writes the gradients; GPT-2's land in place in the fused (N, 3C) buffer
    cuda::flash_attention_bwd(ctx_, dt_, dq, dk, dv, dout, q, k, v, out, saved.lse.data(), delta_.data(), s, st,
                              flash_kernels_, seg);
    return;
  }
  const int64_t rows = static_cast<int64_t>(s.B) * s.T, wq = static_cast<int64_t>(s.NH) * s.HS;
  const int64_t wkv = static_cast<int64_t>(s.NKV) * s.HS;
  const bool strided = !dense(s, st);
  if (strided) {
    to_dense(dense_q_.data(), q, st.q ? st.q : wq, wq, rows, true);
    to_dense(dense_k_.data(), k, st.k ? st.k : wkv, wkv, rows, true);
    to_dense(dense_v_.data(), v, st.v ? st.v : wkv, wkv, rows, true);
  }
  Act gq = strided ? dense_dq_.data() : dq, gk = strided ? dense_dk_.data() : dk;
  Act gv = strided ? dense_dv_.data() : dv;
  zero(gq, rows * wq);  // the unfused backward accumulates
  zero(gk, rows * wkv);
  zero(gv, rows * wkv);
  cuda::attention_bwd(ctx_, dt_, gq, gk, gv, dout, strided ? dense_q_.data() : q, strided ? dense_k_.data() : k,
                      strided ? dense_v_.data() : v, saved.att.data(), s, seg);
  if (strided) {
    to_dense(gq, dq, st.q ? st.q : wq, wq, rows, false);
    to_dense(gk, dk, st.k ? st.k : wkv, wkv, rows, false);
    to_dense(gv, dv, st.v ? st.v : wkv, wkv, rows, false);
  }
}

// Under an FP8 recipe the head's logits and dx products run in FP8 (cross_entropy.cu), x's E4M3
// rows taken from the final norm when it wrote them.
void CudaBackend::lm_head_cross_entropy(Stat losses, Act dx, Grad dw, Act x, Act w, const int32_t* targets,
                                        const Real* dloss, int N, int C, int V, int Vp) {
  cuda::LmHeadFp8 f8;
  const bool fp8 = fp8_ != Fp8Recipe::kOff && N % 16 == 0 && C % 16 == 0 && Vp % 16 == 0;
  if (fp8) {
    if (fp8_rows_written(x, N, C)) f8.x8 = fp8_x_.data(), f8.x_descale = fp8_xs_.data();
    f8.grad_type = fp8_ == Fp8Recipe::kRowsE5M2 ? DType::kF8E5M2 : DType::kF8E4M3;
    fp8_x_of_ = nullptr;
  }
  cuda::lm_head_cross_entropy(ctx_, dt_, losses, dx, dw, x, w, targets, dloss, N, C, V, Vp, fp8 ? &f8 : nullptr);
}

}  // namespace forge
