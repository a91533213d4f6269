// CudaBackend's inference ops (backend.h): KV-cache decoding (cuda/decode.h), the sampler
// (cuda/sample.h), host <-> device copies between steps, and the decode step as a CUDA graph.
#include <cuda_runtime.h>

#include "forge/backend/cuda/backend.h"
#include "forge/backend/cuda/check.h"
#include "forge/backend/cuda/decode.h"
#include "forge/backend/cuda/graph.h"
#include "forge/backend/cuda/sample.h"
#include "forge/backend/cuda/small_gemm.h"
#include "forge/core/error.h"

namespace forge {

void CudaBackend::upload_bytes(void* dst, const void* host, size_t bytes) {
  FORGE_CUDA_CHECK(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, ctx_.stream()));
  ctx_.synchronize();  // `host` may be a temporary of the caller
}

void CudaBackend::download_bytes(void* host, const void* src, size_t bytes) {
  FORGE_CUDA_CHECK(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, ctx_.stream()));
  ctx_.synchronize();
}

void CudaBackend::copy_rows(Act dst, int64_t dst_stride, Act src, int64_t src_stride, int64_t rows, int64_t width) {
  if (rows <= 0) return;
  FORGE_CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_stride * es_, src, src_stride * es_, width * es_, rows,
                                     cudaMemcpyDeviceToDevice, ctx_.stream()));
}

void CudaBackend::embedding_at(Act out, const int32_t* tokens, const int32_t* pos, Act wte, Act wpe, int N, int C) {
  cuda::embedding_at(ctx_, dt_, out, tokens, pos, wte, wpe, N, C);
}

void CudaBackend::rope_at(Act x, const int32_t* pos, int N, int H, int HS, const Rope& rope,
                          int64_t stride) {
  cuda::rope_at(ctx_, dt_, x, pos, N, H, HS, rope, stride);
}

void CudaBackend::kv_append(Act ck, Act cv, Act k, Act v, const int32_t* pos, const DecodeShape& s, int64_t k_stride,
                            int64_t v_stride) {
  cuda::kv_append(ctx_, dt_, ck, cv, k, v, pos, s, k_stride, v_stride);
}

void CudaBackend::decode_attention(Act out, Act q, Act ck, Act cv, const int32_t* pos, const DecodeShape& s,
                                   int64_t q_stride) {
  if (!cuda::decode_attention_supported(s.HS)) {
    cuda::decode_attention_generic(ctx_, dt_, out, q, ck, cv, pos, s, q_stride);
    return;
  }
  cuda::decode_attention(ctx_, dt_, out, q, ck, cv, pos, s, q_stride, decode_scratch(s));
}

// Sized on the first (eager) step of a shape, so a captured step never allocates; zeroed once
// (the attention kernels' arrival counters start at zero and every call leaves them so).
void* CudaBackend::decode_scratch(const DecodeShape& s) {
  const size_t need = cuda::decode_attention_scratch_bytes(s);
  if (decode_scratch_.bytes() < need) {
    decode_scratch_ = Buf<uint8_t>(ctx_.allocator(), need);
    FORGE_CUDA_CHECK(cudaMemsetAsync(decode_scratch_.data(), 0, need, ctx_.stream()));
  }
  return decode_scratch_.data();
}

void CudaBackend::reserve_decode(const DecodeShape& s) {
  if (!cuda::decode_attention_supported(s.HS)) return;
  DecodeShape most = s;  // the splits (so the bytes) do not grow with the rows: take the largest
  size_t need = 0;
  for (int n = 1; n <= s.S; ++n) {
    DecodeShape r = s;
    r.S = n;
    if (const size_t b = cuda::decode_attention_scratch_bytes(r); b > need) need = b, most = r;
  }
  if (need > 0) decode_scratch(most);
}

void CudaBackend::rope_decode_attention(Act out, Act qkv, int64_t stride, Act ck, Act cv, const int32_t* pos,
                                        const DecodeShape& s, const Rope* rope) {
  cuda::rope_decode_attention(ctx_, dt_, out, qkv, stride, ck, cv, pos, s, rope,
                              cuda::decode_attention_supported(s.HS) ? decode_scratch(s) : nullptr);
}

void CudaBackend::rmsnorm_linear_fwd(Act out, Act ln, Stat rstd, Act x, Act norm_w, Act w, Act bias, int N,
                                     int C, int OC, float eps) {
  const cuda::SmallLinearFusion f{norm_w, eps, false};
  if (cuda::small_linear_eligible(dt_, N, C, OC, WeightLayout::kOutIn) &&
      cuda::small_linear_fusion_supported(dt_, N, C, OC, WeightLayout::kOutIn, f) &&
      cuda::small_linear_aligned(out, x, w) && cuda::small_linear_aligned(norm_w, nullptr, nullptr)) {
    cuda::small_linear_fwd(ctx_, dt_, out, x, w, bias, N, C, OC, WeightLayout::kOutIn, {}, f);
    return;
  }
  rmsnorm_fwd(ln, rstd, x, norm_w, N, C, eps);
  linear_fwd(out, ln, w, bias, N, C, OC, WeightLayout::kOutIn);
}

void CudaBackend::rmsnorm_linear_swiglu_fwd(Act hidden, Act scratch, Act ln, Stat rstd, Act x, Act norm_w,
                                            Act w_gate_up, int N, int C, int FF, float eps) {
  const cuda::SmallLinearFusion f{norm_w, eps, false};
  if (cuda::small_linear_swiglu_eligible(dt_, N, C, FF) &&
      cuda::small_linear_fusion_supported(dt_, N, C, 2 * FF, WeightLayout::kOutIn, f) &&
      cuda::small_linear_aligned(hidden, x, w_gate_up) && cuda::small_linear_aligned(norm_w, nullptr, nullptr)) {
    cuda::small_linear_swiglu_fwd(ctx_, dt_, hidden, x, w_gate_up, N, C, FF, {}, f);
    return;
  }
  rmsnorm_fwd(ln, rstd, x, norm_w, N, C, eps);
  linear_swiglu_fwd(hidden, scratch, ln, w_gate_up, N, C, FF);
}

void CudaBackend::linear_residual_fwd(Act res, Act scratch, Act inp, Act w, Act bias, int N, int C, int OC,
                                      WeightLayout layout) {
  const cuda::SmallLinearFusion f{nullptr, 0.0f, true};
  if (cuda::small_linear_eligible(dt_, N, C, OC, layout) &&
      cuda::small_linear_fusion_supported(dt_, N, C, OC, layout, f) && cuda::small_linear_aligned(res, inp, w)) {
    cuda::small_linear_fwd(ctx_, dt_, res, inp, w, bias, N, C, OC, layout, {}, f);
    return;
  }
  linear_fwd(scratch, inp, w, bias, N, C, OC, layout);
  cuda::add_inplace(ctx_, dt_, res, scratch, static_cast<int64_t>(N) * OC);
}

void CudaBackend::rope_kv_append(Act qkv, int64_t stride, Act ck, Act cv, const int32_t* pos,
                                 const DecodeShape& s, const Rope& rope) {
  cuda::rope_kv_append(ctx_, dt_, qkv, stride, ck, cv, pos, s, rope);
}

void CudaBackend::advance_positions(int32_t* pos, int S, int32_t limit) { cuda::advance_positions(ctx_, pos, S, limit); }

void CudaBackend::sample(int32_t* out, Act logits, const SamplerSettings* settings, uint8_t* seen, const int32_t* pos,
                         int S, int V, int Vp) {
  cuda::sample_rows(ctx_, dt_, out, logits, settings, seen, pos, S, V, Vp);
}

CudaBackend::StepGraph::StepGraph() : g(std::make_unique<cuda::Graph>()) {}
CudaBackend::StepGraph::~StepGraph() = default;

void CudaBackend::capture(StepGraph& g, const std::function<void()>& f) { g.g->capture(ctx_, f); }
void CudaBackend::launch(StepGraph& g) { g.g->launch(); }

CudaBackend::Readback::Readback() = default;
CudaBackend::Readback::~Readback() {
  if (done != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(done));
  if (host != nullptr) cudaFreeHost(host);
}

void CudaBackend::readback_start(Readback& r, const int32_t* src, size_t n) {
  if (r.done == nullptr) {
    cudaEvent_t e = nullptr;
    FORGE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    r.done = e;
  }
  if (n > r.cap) {
    if (r.host != nullptr) FORGE_CUDA_CHECK(cudaFreeHost(r.host));
    r.host = nullptr;
    r.cap = 0;
    FORGE_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&r.host), n * sizeof(int32_t)));
    r.cap = n;
  }
  FORGE_CUDA_CHECK(cudaMemcpyAsync(r.host, src, n * sizeof(int32_t), cudaMemcpyDeviceToHost, ctx_.stream()));
  FORGE_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(r.done), ctx_.stream()));
}

const int32_t* CudaBackend::readback_wait(Readback& r) {
  FORGE_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(r.done)));
  return r.host;
}

}  // namespace forge
