// CudaBackend's FP8 products (CudaModelOptions::fp8, core/fp8_recipe.h). The LM head's products
// run inside cuda::lm_head_cross_entropy (backend.cpp passes it the final norm's E4M3 rows).
// A product eligible under the recipe — a block's linear layer — casts its two operands to FP8 with
// per-row power-of-two scales (ops/fp8_rows.h: cast_fp8_rows for the activation or output
// gradient, cast_fp8_rows or cast_transpose_fp8_rows for the weight, whichever gives the (OUT, K)
// rows cuBLASLt's TN layout needs) and runs cuBLASLt's FP8 GEMM with those scales as its
// OUTER_VEC scale vectors, f32 accumulation, the bf16 output and epilogue of the bf16 product it
// replaces (bias, GELU aux; the DGELU product never comes here: cuBLASLt does not fuse that
// epilogue in FP8, so linear_dgelu_bwd keeps it bf16).
//
// Where the operands come from: a norm forward's output (what q|k|v and the first MLP product
// read) has its E4M3 rows written by the norm kernel itself (fp8_norm_out / fp8_norm_done: the
// bytes cast_fp8_rows would give); every other operand — attention's output, the MLP's hidden
// activation, output gradients, the weights — is cast at the call, a separate pass (X: ~55 µs
// for 65,536 × 768 bf16 on an H100, docs/perf-notes.md), except that an output gradient whose
// layer has a bias is cast by the bias gradient's own pass (cast_fp8_rows_bias). Those casts
// belong in the kernels that produce the operands too (the norm backwards, the weights'
// optimizer step): the next steps.
#include <algorithm>
#include <vector>

#include "forge/backend/cuda/backend.h"
#include "forge/backend/cuda/gemm.h"
#include "forge/core/error.h"

namespace forge {

using cuda::GemmArgs;

void CudaBackend::init_fp8(Fp8Recipe r) {
  fp8_ = r;
  if (r == Fp8Recipe::kOff) return;
  if (dt_ != DType::kBF16)
    throw Error(str("FP8 products (FORGE_FP8=", fp8_recipe_name(r), ") need bf16 training, not ",
                    dtype_name(dt_)));
  const int cc = ctx_.props().major * 10 + ctx_.props().minor;
  if (cc < 90)
    throw Error(str("FP8 products (FORGE_FP8=", fp8_recipe_name(r),
                    ") need a Hopper GPU (compute capability 9.0), "
                    "not ",
                    ctx_.props().major, ".", ctx_.props().minor));
}

bool CudaBackend::fp8_eligible(Act w, Act x, int N, int K, int OUT, bool bias_sum) const {
  // The LM head's product here (logits outside training's fused head: generation) keeps bf16;
  // cuBLASLt's FP8 kernels want every dimension a multiple of 16 (16-byte rows), which every
  // block product of Forge's presets is.
  if (fp8_ == Fp8Recipe::kOff || w == this->w(table_.lm_head()) || N % 16 != 0 || K % 16 != 0 ||
      OUT % 16 != 0)
    return false;
  return fp8_rows_written(x, N, K) || OUT >= (bias_sum ? kFp8MinOutWithBiasSum : kFp8MinOutForCast);
}

bool CudaBackend::fp8_rows_written(Act x, int N, int K) const {
  return x == fp8_x_of_ && N == fp8_x_rows_ && K == fp8_x_cols_;
}

namespace {

// The buffer grown to at least n elements. A buffer a captured CUDA graph may hold is never
// freed while the backend lives: the old one moves to `retired`.
template <class U>
U* grown(cuda::DeviceBuffer<U>& b, size_t n, std::vector<cuda::DeviceBuffer<U>>& retired,
         cuda::Context& ctx) {
  if (b.size() >= n) return b.data();
  if (b.size() > 0) retired.push_back(std::move(b));
  b = cuda::DeviceBuffer<U>(ctx.allocator(), n);
  return b.data();
}

}  // namespace

CudaBackend::Fp8Rows CudaBackend::fp8_norm_out(int N, int C) {
  fp8_x_of_ = nullptr;
  if (fp8_ == Fp8Recipe::kOff || N % 16 != 0 || C % 16 != 0) return {};
  return {grown(fp8_x_, static_cast<size_t>(N) * C, fp8_retired_, ctx_),
          grown(fp8_xs_, static_cast<size_t>(N), fp8_retired_s_, ctx_)};
}

void CudaBackend::fp8_norm_done(bool written, Act out, int N, int C) {
  fp8_x_of_ = written ? out : nullptr;
  fp8_x_rows_ = N, fp8_x_cols_ = C;
}

// out (M, OUT) = x (M, K) · Wᵀ with `g` holding the bf16 call's epilogue, bias, aux and beta;
// w is (OUT, K) when !w_transposed, else (K, OUT).
void CudaBackend::fp8_gemm(GemmArgs g, Act x, bool x_is_grad, Act w, bool w_transposed, Act out,
                           Grad dbias) {
  const int M = g.M, OUT = g.N, K = g.K;
  const DType xt = x_is_grad && fp8_ == Fp8Recipe::kRowsE5M2 ? DType::kF8E5M2 : DType::kF8E4M3;
  uint8_t* x8 = grown(fp8_x_, static_cast<size_t>(M) * K, fp8_retired_, ctx_);
  float* xs = grown(fp8_xs_, static_cast<size_t>(M), fp8_retired_s_, ctx_);
  uint8_t* w8 = grown(fp8_w_, static_cast<size_t>(OUT) * K, fp8_retired_, ctx_);
  float* ws = grown(fp8_ws_, static_cast<size_t>(OUT), fp8_retired_s_, ctx_);
  // A norm's output whose E4M3 rows the norm wrote: read once, then the buffer is free again.
  const bool written = xt == DType::kF8E4M3 && fp8_rows_written(x, M, K);
  fp8_x_of_ = nullptr;
  if (written) {
    if (dbias) cuda::bias_grad(ctx_, dt_, dbias, x, M, K);
  } else if (dbias) {
    cuda::cast_fp8_rows_bias(ctx_, xt, x8, xs, dbias, dt_, x, M, K);
  } else {
    cuda::cast_fp8_rows(ctx_, xt, x8, xs, dt_, x, M, K);
  }
  if (w_transposed)
    cuda::cast_transpose_fp8_rows(ctx_, DType::kF8E4M3, w8, ws, dt_, w, K, OUT);
  else
    cuda::cast_fp8_rows(ctx_, DType::kF8E4M3, w8, ws, dt_, w, OUT, K);
  g.trans_a = false, g.trans_b = true;
  g.ab_type = xt, g.b_type = DType::kF8E4M3, g.c_type = dt_;
  g.a_scale = xs, g.b_scale = ws, g.row_scales = true, g.fast_accum = true;
  cuda::gemm(ctx_, g, x8, w8, out);
}

}  // namespace forge
