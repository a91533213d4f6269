// cuBLASLt wrapper (design in gemm.h). A plan — operation descriptor, three matrix layouts and
// the heuristic's algorithm — is built once per distinct (shape, transposes, types, epilogue,
// batch, strides, leading dimensions, operand alignments, beta ≠ 0) and cached in the Context
// (one cache per context, so per device; a mutex makes it safe to share a context between
// threads); a training step uses a few dozen shapes, so the cache stays small and every later
// call is a map lookup plus cublasLtMatmul.
//
// Determinism: every cuBLASLt reduction scheme (none, in-place with ordering counters, or a
// separate reduction over a workspace) sums in a fixed order, and the algorithm for a key never
// changes within a process, so equal inputs give bit-identical outputs.
//
// Which algorithm: the heuristic returns up to kCandidates, its estimate of the fastest first.
// By default a plan runs that first one. Under a timed Context::gemm_algo (core/gemm_algo.h) the
// plan's first call, when it runs eagerly, times candidates on the call's own operands and keeps
// the fastest — what issue 16 calls "cuBLASLt algorithm choice per shape". GemmAlgo::kTimed times
// only the candidates whose output on those operands is the first candidate's bit for bit
// (BitCheck), so every process gets the heuristic's results whichever wins; kTimedAny times all,
// and another process may time differently, pick another algorithm and differ in the last bits.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "forge/backend/cuda/allocator.h"
#include "forge/backend/cuda/check.h"
#include "forge/backend/cuda/gemm.h"
#include "forge/core/error.h"
#include "forge/core/log.h"

namespace forge::cuda {

namespace {

bool uses_bias(GemmEpilogue e) {
  return e == GemmEpilogue::kBias || e == GemmEpilogue::kBiasGelu || e == GemmEpilogue::kBiasGeluAux;
}

cudaDataType_t to_cuda(DType t) {
  switch (t) {
    case DType::kF32:
      return CUDA_R_32F;
    case DType::kBF16:
      return CUDA_R_16BF;
    case DType::kF16:
      return CUDA_R_16F;
    case DType::kF8E4M3:
      return CUDA_R_8F_E4M3;
    case DType::kF8E5M2:
      return CUDA_R_8F_E5M2;
    default:
      FORGE_CHECK(false, "[gemm] unsupported dtype ", dtype_name(t));
  }
  return CUDA_R_32F;
}

// How many algorithms the heuristic is asked for (bench gemm --algos and the timed choice).
constexpr int kCandidates = 8;

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  std::vector<cublasLtMatmulAlgo_t> candidates;  // the heuristic's, its estimated fastest first
  int chosen = 0;                                // the one gemm() runs
};

// Byte alignments of the three operands as cuBLASLt sees them (its "A" is our B).
struct Alignment {
  uint32_t a, b, c;
};

using PlanKey = std::tuple<int, int, int, bool, bool, int, int, int, int, int64_t, int64_t, int64_t,
                           int64_t, int64_t, int64_t, uint32_t, uint32_t, uint32_t, bool, int, bool, bool>;

// B's element type: b_type for FP8 products, else ab_type.
DType b_type_of(const GemmArgs& g) { return is_fp8(g.ab_type) ? g.b_type : g.ab_type; }

// Largest power of two ≤ 256 dividing the address, the row stride and (batched) the batch stride,
// all in bytes: what an algorithm may assume about every row of every batch entry.
uint32_t alignment_of(const void* p, int64_t ld, int64_t stride, int batch, size_t elt) {
  uint64_t bits = reinterpret_cast<uintptr_t>(p) | static_cast<uint64_t>(ld) * elt | 256u;
  if (batch > 1) bits |= static_cast<uint64_t>(stride) * elt;
  return static_cast<uint32_t>(bits & (~bits + 1));  // lowest set bit
}

// Layout of a row-major (rows, cols) matrix with row stride ld, seen column-major as (cols, rows).
cublasLtMatrixLayout_t layout(DType t, int rows, int cols, int64_t ld, int batch, int64_t stride) {
  cublasLtMatrixLayout_t l;
  FORGE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, to_cuda(t), cols, rows, ld));
  if (batch > 1) {
    FORGE_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                        &batch, sizeof(batch)));
    FORGE_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
        l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
  }
  return l;
}

// Stored (row-major) shapes: A is (M, K) or (K, M); B is (K, N) or (N, K); C is (M, N).
struct Stored {
  int a_rows, a_cols, b_rows, b_cols;
  int64_t lda, ldb, ldc;
};

Stored stored_shapes(const GemmArgs& g) {
  Stored s;
  s.a_rows = g.trans_a ? g.K : g.M;
  s.a_cols = g.trans_a ? g.M : g.K;
  s.b_rows = g.trans_b ? g.N : g.K;
  s.b_cols = g.trans_b ? g.K : g.N;
  s.lda = g.lda ? g.lda : s.a_cols;
  s.ldb = g.ldb ? g.ldb : s.b_cols;
  s.ldc = g.ldc ? g.ldc : g.N;
  return s;
}

void set_call_pointers(const Plan& p, const GemmArgs& g);

Plan make_plan(Context& ctx, const GemmArgs& g, const Stored& st, const Alignment& al) {
  Plan p;
  const cublasComputeType_t compute = CUBLAS_COMPUTE_32F;  // f32 accumulate; no TF32 for f32
  FORGE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, compute, CUDA_R_32F));
  // Column-major Cᵀ = op(B)ᵀ·op(A)ᵀ: "A" of cuBLASLt is our B, "B" is our A.
  const cublasOperation_t ta = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  FORGE_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  FORGE_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_DEFAULT;
  switch (g.epilogue) {
    case GemmEpilogue::kNone:
      break;
    case GemmEpilogue::kBias:
      ep = CUBLASLT_EPILOGUE_BIAS;
      break;
    case GemmEpilogue::kGelu:
      ep = CUBLASLT_EPILOGUE_GELU;
      break;
    case GemmEpilogue::kBiasGelu:
      ep = CUBLASLT_EPILOGUE_GELU_BIAS;
      break;
    case GemmEpilogue::kBiasGeluAux:
      ep = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
      break;
    case GemmEpilogue::kDGelu:
      ep = CUBLASLT_EPILOGUE_DGELU;
      break;
  }
  FORGE_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof(ep)));
  if (g.epilogue == GemmEpilogue::kBiasGeluAux || g.epilogue == GemmEpilogue::kDGelu) {
    const int64_t ld = g.N;
    FORGE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                      &ld, sizeof(ld)));
  }
  if (is_fp8(g.ab_type) && g.fast_accum) {
    const int8_t on = 1;
    FORGE_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &on, sizeof(on)));
  }
  if (is_fp8(g.ab_type) && g.row_scales) {
    const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    FORGE_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof(mode)));
    FORGE_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof(mode)));
  }
  if (uses_bias(g.epilogue)) {
    const cudaDataType_t bt = to_cuda(g.c_type);
    FORGE_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)));
  }
  p.la = layout(b_type_of(g), st.b_rows, st.b_cols, st.ldb, g.batch, g.stride_b);
  p.lb = layout(g.ab_type, st.a_rows, st.a_cols, st.lda, g.batch, g.stride_a);
  p.lc = layout(g.c_type, g.M, g.N, st.ldc, g.batch, g.stride_c);
  // The call's pointers before the heuristic: with FP8 row scales (OUTER_VEC) cuBLASLt refuses a
  // descriptor whose scale vectors are not set yet (CUBLAS_STATUS_INVALID_VALUE on an H200).
  set_call_pointers(p, g);

  cublasLtMatmulPreference_t pref;
  FORGE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const size_t ws = ctx.workspace_bytes();
  FORGE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, al.a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, al.b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, al.c},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, al.c}};
  for (const auto& [attr, bytes] : aligns)
    FORGE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &bytes, sizeof(bytes)));
  cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
  int found = 0;
  FORGE_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(ctx.lt(), p.op, p.la, p.lb, p.lc, p.lc, pref,
                                                    kCandidates, results, &found));
  cublasLtMatmulPreferenceDestroy(pref);
  for (int i = 0; i < found; ++i)
    if (results[i].state == CUBLAS_STATUS_SUCCESS) p.candidates.push_back(results[i].algo);
  if (p.candidates.empty()) {  // a product this cuBLASLt does not offer (e.g. an FP8 epilogue)
    cublasLtMatmulDescDestroy(p.op);
    for (cublasLtMatrixLayout_t l : {p.la, p.lb, p.lc}) cublasLtMatrixLayoutDestroy(l);
    throw Error(str("[gemm] cuBLASLt has no algorithm for M=", g.M, " N=", g.N, " K=", g.K, " ",
                    dtype_name(g.ab_type), " x ", dtype_name(b_type_of(g)), " -> ", dtype_name(g.c_type),
                    " epilogue ", static_cast<int>(g.epilogue), g.row_scales ? " row scales" : "",
                    " alignments ", al.b, "/", al.a, "/", al.c, " bytes"));
  }
  return p;
}

// The per-call pointers live in the descriptor (set under the cache's lock). cuBLASLt's A is our
// B, so its A scale is b_scale.
void set_call_pointers(const Plan& p, const GemmArgs& g) {
  if (is_fp8(g.ab_type)) {
    FORGE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                      &g.b_scale, sizeof(g.b_scale)));
    FORGE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                      &g.a_scale, sizeof(g.a_scale)));
  }
  if (g.bias)
    FORGE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                      &g.bias, sizeof(g.bias)));
  if (g.aux)
    FORGE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g.aux, sizeof(g.aux)));
}

cublasStatus_t enqueue(Context& ctx, const Plan& p, int candidate, const GemmArgs& g, const void* a,
                       const void* b, void* c) {
  return cublasLtMatmul(ctx.lt(), p.op, &g.alpha, b, p.la, a, p.lb, &g.beta, c, p.lc, c, p.lc,
                        &p.candidates[candidate], ctx.workspace(), ctx.workspace_bytes(),
                        ctx.stream());
}

// C's bytes from its first element to its last: (batch − 1) strides, then M rows of ldc.
size_t c_span_bytes(const GemmArgs& g, const Stored& st) {
  return static_cast<size_t>(static_cast<int64_t>(g.batch - 1) * g.stride_c +
                             static_cast<int64_t>(g.M - 1) * st.ldc + g.N) *
         dtype_size(g.c_type);
}

// A fingerprint of a product's output: two wrapping sums of independent 64-bit hashes of
// (element index, element bits), and how many elements have bits other than zero. Two outputs
// with equal sums are taken as equal (a differing element moves each sum by a pseudo-random
// 64-bit amount, so a false match has odds near 2⁻¹²⁸); it replaces a reference copy of C, which
// for the largest activations of a training step cost gigabytes of peak memory.
struct Fingerprint {
  unsigned long long sum[2];
  unsigned long long nonzero;
  bool operator==(const Fingerprint& o) const { return sum[0] == o.sum[0] && sum[1] == o.sum[1]; }
};

__device__ __forceinline__ unsigned long long splitmix64(unsigned long long z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Adds the elements of a (batch, rows, cols) matrix with row stride ld and batch stride
// (elements of `width` bytes, 2 or 4) to f; `salt` keeps C's and aux's elements apart. Only the
// product's own elements are read, never the gaps between rows.
__global__ void fingerprint_kernel(const uint8_t* __restrict__ p, int width, int64_t rows,
                                   int64_t cols, int64_t ld, int64_t stride, int64_t batch,
                                   unsigned long long salt, Fingerprint* __restrict__ f) {
  unsigned long long s0 = 0, s1 = 0, nz = 0;
  const int64_t n = batch * rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t col = i % cols, row = (i / cols) % rows, b = i / (cols * rows);
    const uint8_t* e = p + (b * stride + row * ld + col) * width;
    const unsigned long long bits = width == 2 ? *reinterpret_cast<const uint16_t*>(e)
                                               : *reinterpret_cast<const uint32_t*>(e);
    const unsigned long long key = splitmix64(static_cast<unsigned long long>(i) ^ salt);
    s0 += splitmix64(key ^ bits);
    s1 += splitmix64(key + 0xD6E8FEB86659FD93ull * (bits + 1));
    nz += bits != 0;
  }
  for (int o = 16; o > 0; o >>= 1) {
    s0 += __shfl_down_sync(0xffffffffu, s0, o);
    s1 += __shfl_down_sync(0xffffffffu, s1, o);
    nz += __shfl_down_sync(0xffffffffu, nz, o);
  }
  if ((threadIdx.x & 31) == 0) {
    atomicAdd(&f->sum[0], s0);  // unsigned atomics wrap: the sums are order-free
    atomicAdd(&f->sum[1], s1);
    atomicAdd(&f->nonzero, nz);
  }
}

// Sets every element of a (batch, rows, cols) matrix to all-ones bits (a NaN in every float
// type), leaving the gaps between rows alone: what a candidate that wrote nothing would leave.
__global__ void poison_kernel(uint8_t* __restrict__ p, int width, int64_t rows, int64_t cols,
                              int64_t ld, int64_t stride, int64_t batch) {
  const int64_t n = batch * rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t col = i % cols, row = (i / cols) % rows, b = i / (cols * rows);
    uint8_t* e = p + (b * stride + row * ld + col) * width;
    if (width == 2)
      *reinterpret_cast<uint16_t*>(e) = 0xFFFFu;
    else
      *reinterpret_cast<uint32_t*>(e) = 0xFFFFFFFFu;
  }
}

// A (batch, rows, cols) view of a product's output in memory.
struct OutputView {
  void* data;
  int width;
  int64_t rows, cols, ld, stride, batch;
  int blocks() const {
    return static_cast<int>(std::min<int64_t>((batch * rows * cols + 255) / 256, 4 * 1024));
  }
};

// Whether a candidate writes the heuristic's first candidate's bits on one call's operands: C
// (its M × N elements in every batch entry) and, under kBiasGeluAux, the aux output, compared by
// Fingerprint. prepare() runs candidate 0 and fingerprints its outputs; matches(k) runs
// candidate k from the same start and compares. The start: where the call accumulates (beta ≠ 0)
// C as it was, kept in a copy and put back by restore(); otherwise outputs poisoned first, so a
// candidate that writes nothing cannot match. The comparison is blind, and prepare() says no,
// where candidate 0's output is all zero bits (a zero operand: every algorithm writes zeros there
// whatever it does elsewhere) or C as it was (a zero product on top of C). Throws forge::Error
// when the copy cannot be allocated (the caller then keeps the heuristic's first).
class BitCheck {
 public:
  BitCheck(Context& ctx, const GemmArgs& g, const Plan& p, const Stored& st, const void* a,
           const void* b, void* c)
      : ctx_(ctx), g_(g), p_(p), a_(a), b_(b), c_(c),
        c_view_{c, static_cast<int>(dtype_size(g.c_type)), g.M, g.N, st.ldc, g.stride_c, g.batch},
        aux_view_{g.aux, static_cast<int>(dtype_size(g.c_type)), g.M, g.N, g.N, 0, 1},
        has_aux_(g.epilogue == GemmEpilogue::kBiasGeluAux),
        prints_(ctx.allocator(), 1) {
    if (g.beta != 0.0f) {
      saved_ = DeviceBuffer<uint8_t>(ctx.allocator(), c_span_bytes(g, st));
      copy(saved_.data(), c_, saved_.size());
    }
  }
  // Fingerprints candidate 0's outputs; false if it cannot run here or the check would be blind.
  bool prepare() {
    const bool accumulates = saved_.data() != nullptr;
    if (accumulates) start_ = fingerprint();
    reset();
    if (enqueue(ctx_, p_, 0, g_, a_, b_, c_) != CUBLAS_STATUS_SUCCESS) return false;
    ref_ = fingerprint();
    if (ref_.nonzero == 0 || (accumulates && ref_ == start_)) {
      log_debug("gemm: M=", g_.M, " N=", g_.N, " K=", g_.K, ": the output is ",
                ref_.nonzero == 0 ? "all zeros" : "C unchanged",
                ", so other algorithms' bits cannot be told apart here; the heuristic's is kept");
      return false;
    }
    return true;
  }
  // Whether candidate k runs here and writes candidate 0's bits.
  bool matches(int k) {
    reset();
    if (enqueue(ctx_, p_, k, g_, a_, b_, c_) != CUBLAS_STATUS_SUCCESS) return false;
    return fingerprint() == ref_;
  }
  // C as it was before prepare() (nothing to do where the call does not read C).
  void restore() {
    if (saved_.data()) copy(c_, saved_.data(), saved_.size());
  }
  ~BitCheck() { cudaStreamSynchronize(ctx_.stream()); }  // before the copy goes back

 private:
  void reset() {
    if (saved_.data())
      restore();
    else
      poison(c_view_);
    if (has_aux_) poison(aux_view_);
  }
  Fingerprint fingerprint() {
    FORGE_CUDA_CHECK(cudaMemsetAsync(prints_.data(), 0, sizeof(Fingerprint), ctx_.stream()));
    add(c_view_, 0);
    if (has_aux_) add(aux_view_, 0xA0A0A0A0A0A0A0A0ull);
    Fingerprint f;
    FORGE_CUDA_CHECK(cudaMemcpyAsync(&f, prints_.data(), sizeof(f), cudaMemcpyDeviceToHost,
                                     ctx_.stream()));
    FORGE_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream()));
    return f;
  }
  void add(const OutputView& v, unsigned long long salt) {
    fingerprint_kernel<<<v.blocks(), 256, 0, ctx_.stream()>>>(
        static_cast<const uint8_t*>(v.data), v.width, v.rows, v.cols, v.ld, v.stride, v.batch,
        salt, prints_.data());
    FORGE_CUDA_CHECK(cudaGetLastError());
  }
  void poison(const OutputView& v) {
    poison_kernel<<<v.blocks(), 256, 0, ctx_.stream()>>>(static_cast<uint8_t*>(v.data), v.width,
                                                         v.rows, v.cols, v.ld, v.stride, v.batch);
    FORGE_CUDA_CHECK(cudaGetLastError());
  }
  void copy(void* to, const void* from, size_t bytes) {
    FORGE_CUDA_CHECK(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, ctx_.stream()));
  }
  Context& ctx_;
  const GemmArgs& g_;
  const Plan& p_;
  const void *a_, *b_;
  void* c_;
  OutputView c_view_, aux_view_;
  bool has_aux_;
  DeviceBuffer<uint8_t> saved_;
  DeviceBuffer<Fingerprint> prints_;
  Fingerprint start_{}, ref_{};
};

// Whether a product has outputs enough for BitCheck to tell apart two algorithms that sum in
// different orders. The f32 sums of two such orders differ by about one rounding (2⁻²⁴
// relative) in many elements; written as f32 most of those differences show, but rounded to a
// 16-bit type an element shows one only with odds near 2⁻²⁴ / 2⁻⁸·⁵ ≈ 2⁻¹⁵·⁵. 2²⁰ 16-bit outputs
// then show about 20 differences (missing all of them: odds near e⁻²⁰), 2¹⁶ only one or two, so
// below 2²⁰ (2¹² for f32) GemmAlgo::kTimed keeps the heuristic's first. Every product of a
// training step is far above these; decoding's small products are not, and keep the first.
bool large_enough_to_compare(const GemmArgs& g) {
  const int64_t outputs = static_cast<int64_t>(g.M) * g.N * g.batch;
  return outputs >= (dtype_size(g.c_type) >= 4 ? int64_t{1} << 12 : int64_t{1} << 20);
}

// Under a timed GemmAlgo: times each candidate on the call's own operands (a warm-up, then kReps
// calls between two events) and returns the fastest's index; 0 (the heuristic's first) when
// there is nothing to choose, while the stream is being captured (no timing or synchronising
// inside a capture: the plan keeps the heuristic's choice), or when C cannot be copied. Under
// GemmAlgo::kTimed only candidates that write candidate 0's bits (BitCheck) are timed, so the
// choice never changes a result. Every trial writes C (and a GELU epilogue's aux output, which
// the real call then rewrites); where the call accumulates (beta ≠ 0) C is saved first and put
// back afterwards, so the real call that follows sees C as it was.
int time_candidates(Context& ctx, const GemmArgs& g, const Stored& st, const Plan& p, const void* a,
                    const void* b, void* c) {
  constexpr int kReps = 5;
  if (p.candidates.size() < 2) return 0;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  FORGE_CUDA_CHECK(cudaStreamIsCapturing(ctx.stream(), &capture));
  if (capture != cudaStreamCaptureStatusNone) return 0;
  const bool same_bits = ctx.gemm_algo() == GemmAlgo::kTimed;
  if (same_bits && !large_enough_to_compare(g)) {
    log_debug("gemm: M=", g.M, " N=", g.N, " K=", g.K, ": too few outputs to tell summation orders "
              "apart; the heuristic's algorithm is kept");
    return 0;
  }
  std::optional<BitCheck> check;
  try {
    check.emplace(ctx, g, p, st, a, b, c);
    if (same_bits && !check->prepare()) {
      check->restore();
      return 0;
    }
  } catch (const Error&) {
    log_debug("gemm: no memory to copy C for timing M=", g.M, " N=", g.N, " K=", g.K,
              "; the heuristic's algorithm is kept");
    return 0;
  }
  cudaEvent_t e0, e1;
  FORGE_CUDA_CHECK(cudaEventCreate(&e0));
  FORGE_CUDA_CHECK(cudaEventCreate(&e1));
  int best = 0, other_bits = 0;
  float best_ms = std::numeric_limits<float>::infinity(), first_ms = best_ms;
  for (int i = 0; i < static_cast<int>(p.candidates.size()); ++i) {
    if (same_bits && i > 0 && !check->matches(i)) {
      ++other_bits;
      continue;
    }
    if (enqueue(ctx, p, i, g, a, b, c) != CUBLAS_STATUS_SUCCESS) continue;  // not runnable here
    FORGE_CUDA_CHECK(cudaEventRecord(e0, ctx.stream()));
    bool ok = true;
    for (int r = 0; r < kReps && ok; ++r) ok = enqueue(ctx, p, i, g, a, b, c) == CUBLAS_STATUS_SUCCESS;
    FORGE_CUDA_CHECK(cudaEventRecord(e1, ctx.stream()));
    FORGE_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    FORGE_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    if (i == 0) first_ms = ms;
    if (ok && ms < best_ms) best = i, best_ms = ms;
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  check->restore();
  log_debug("gemm: M=", g.M, " N=", g.N, " K=", g.K, " epilogue ", static_cast<int>(g.epilogue),
            ": candidate ", best, " of ", p.candidates.size(), ", ", 1e3 * best_ms / kReps,
            " us a call (the heuristic's first: ", 1e3 * first_ms / kReps, " us); ", other_bits,
            " candidates skipped (other bits, or not runnable here)");
  return best;
}

}  // namespace

class GemmPlanCache {
 public:
  ~GemmPlanCache() {
    for (auto& [key, p] : plans) {
      cublasLtMatrixLayoutDestroy(p.la);
      cublasLtMatrixLayoutDestroy(p.lb);
      cublasLtMatrixLayoutDestroy(p.lc);
      cublasLtMatmulDescDestroy(p.op);
    }
  }
  std::map<PlanKey, Plan> plans;
  std::mutex mu;  // held from the lookup through the enqueue: the descriptor's pointers are set per call
};

GemmPlanCache* new_gemm_plan_cache() { return new GemmPlanCache(); }
void Context::GemmPlanCacheDeleter::operator()(GemmPlanCache* p) const { delete p; }

namespace {

// The plan of g's key, built (and under a timed GemmAlgo its algorithm chosen) on first use.
// The caller holds cache.mu.
Plan& plan_for(Context& ctx, GemmPlanCache& cache, const GemmArgs& g, const void* a, const void* b,
               void* c) {
  FORGE_CHECK(g.M > 0 && g.N > 0 && g.K > 0 && g.batch > 0, "[gemm] bad shape M=", g.M, " N=", g.N,
              " K=", g.K);
  FORGE_CHECK(!uses_bias(g.epilogue) || g.bias != nullptr, "[gemm] bias epilogue without a bias");
  const bool needs_aux = g.epilogue == GemmEpilogue::kBiasGeluAux || g.epilogue == GemmEpilogue::kDGelu;
  FORGE_CHECK(!needs_aux || g.aux != nullptr, "[gemm] GELU aux epilogue without an aux buffer");
  FORGE_CHECK(g.epilogue != GemmEpilogue::kDGelu || (g.beta == 0.0f && g.batch == 1),
              "[gemm] the DGELU epilogue needs beta = 0 and no batch");
  if (is_fp8(g.ab_type)) {
    FORGE_CHECK(is_fp8(g.b_type) && !(g.ab_type == DType::kF8E5M2 && g.b_type == DType::kF8E5M2),
                "[gemm] FP8 operands ", dtype_name(g.ab_type), " x ", dtype_name(g.b_type),
                " (want e4m3 or e5m2 each, not both e5m2)");
    FORGE_CHECK(!g.trans_a && g.trans_b, "[gemm] FP8 products run in the TN layout only (trans_a false, "
                "trans_b true: A (M, K) and B (N, K)); cast_transpose_fp8 makes such operands");
    FORGE_CHECK(g.a_scale != nullptr && g.b_scale != nullptr, "[gemm] an FP8 product without its scales");
    FORGE_CHECK(g.c_type == DType::kBF16 || g.c_type == DType::kF32, "[gemm] FP8 products write bf16 or f32, not ",
                dtype_name(g.c_type));
  }
  const Stored st = stored_shapes(g);
  FORGE_CHECK(st.lda >= st.a_cols && st.ldb >= st.b_cols && st.ldc >= g.N,
              "[gemm] row strides lda=", st.lda, " ldb=", st.ldb, " ldc=", st.ldc,
              " below the stored widths ", st.a_cols, " ", st.b_cols, " ", g.N);
  const Alignment al{alignment_of(b, st.ldb, g.stride_b, g.batch, dtype_size(b_type_of(g))),
                     alignment_of(a, st.lda, g.stride_a, g.batch, dtype_size(g.ab_type)),
                     alignment_of(c, st.ldc, g.stride_c, g.batch, dtype_size(g.c_type))};
  const PlanKey key{g.M,
                    g.N,
                    g.K,
                    g.trans_a,
                    g.trans_b,
                    static_cast<int>(g.ab_type),
                    static_cast<int>(g.c_type),
                    static_cast<int>(g.epilogue),
                    g.batch,
                    g.stride_a,
                    g.stride_b,
                    g.stride_c,
                    st.lda,
                    st.ldb,
                    st.ldc,
                    al.a,
                    al.b,
                    al.c,
                    g.beta != 0.0f,
                    static_cast<int>(b_type_of(g)),
                    is_fp8(g.ab_type) && g.fast_accum,
                    is_fp8(g.ab_type) && g.row_scales};
  auto it = cache.plans.find(key);
  if (it == cache.plans.end()) {
    it = cache.plans.emplace(key, make_plan(ctx, g, st, al)).first;
    if (ctx.gemm_algo() != GemmAlgo::kHeuristic) {
      set_call_pointers(it->second, g);
      it->second.chosen = time_candidates(ctx, g, st, it->second, a, b, c);
    }
  }
  return it->second;
}

}  // namespace

void gemm(Context& ctx, const GemmArgs& g, const void* a, const void* b, void* c) {
  GemmPlanCache& cache = ctx.gemm_plans();
  std::lock_guard<std::mutex> lock(cache.mu);
  const Plan& plan = plan_for(ctx, cache, g, a, b, c);
  const int candidate = g.candidate < 0 ? plan.chosen : g.candidate;
  FORGE_CHECK(candidate < static_cast<int>(plan.candidates.size()), "[gemm] candidate ", candidate,
              " of ", plan.candidates.size());
  set_call_pointers(plan, g);
  FORGE_CUBLAS_CHECK(enqueue(ctx, plan, candidate, g, a, b, c));
}

int gemm_candidates(Context& ctx, const GemmArgs& g, const void* a, const void* b, void* c) {
  GemmPlanCache& cache = ctx.gemm_plans();
  std::lock_guard<std::mutex> lock(cache.mu);
  return static_cast<int>(plan_for(ctx, cache, g, a, b, c).candidates.size());
}

bool gemm_candidate_same_bits(Context& ctx, const GemmArgs& g, const void* a, const void* b,
                              void* c, int k) {
  GemmPlanCache& cache = ctx.gemm_plans();
  std::lock_guard<std::mutex> lock(cache.mu);
  const Plan& plan = plan_for(ctx, cache, g, a, b, c);
  FORGE_CHECK(k >= 0 && k < static_cast<int>(plan.candidates.size()), "[gemm] candidate ", k,
              " of ", plan.candidates.size());
  set_call_pointers(plan, g);
  BitCheck check(ctx, g, plan, stored_shapes(g), a, b, c);
  if (!check.prepare()) {
    check.restore();
    throw Error("[gemm] candidates cannot be compared on these operands (the heuristic's first does "
                "not run, or its output is all zeros or C unchanged)");
  }
  const bool same = k == 0 || check.matches(k);
  check.restore();
  return same;
}

}  // namespace forge::cuda
