// Segment masks (packed rows, seg (B, T) on the device) in the CUDA attention paths: the flash
// kernels (mma.sync and Hopper wgmma, forward + backward) and the unfused GEMM + softmax path,
// against the CPU twin cpu::flash_attention_fwd/bwd<double> given the same seg, on inputs
// already rounded to the kernel dtype. Query i sees key j iff the shape allows it (causal,
// window) and j >= the first token of i's segment (a run of equal ids in the row).
//
// Layouts (B = 3, one per row, see make_segments): row 0 a length-1 segment then random
// lengths 1..T/4; row 1 one segment; row 2 boundaries on and next to the tile edges (63, 64,
// 65, 127, 128, ...) and a length-1 segment at the end. Non-adjacent runs reuse ids, so a kernel
// that compared ids instead of runs fails. T is never a multiple of the tiles (17, 300, 333,
// 1000), so every kernel also sees partial tiles. Every output starts poisoned (NaN bytes).
//
// Tolerances: flash_attention_test.cpp's (copied here with its reasoning): a correct kernel
// computes S and the log-sum-exp in f32 from exact products of dt inputs, rounds P (and dS) to
// dt for the tensor-core products, accumulates in f32 and stores dt. Segments only remove keys,
// so each row's sums have fewer terms and no larger errors. The unfused 16-bit path rounds the
// same operands (att and dS are dt GEMM operands), so the same table applies to it; its f32
// path has its own (UnfusedF32Tol).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "cuda_testing.h"
#include "forge/backend/cuda/graph.h"
#include "forge/backend/cuda/ops.h"
#include "forge/core/error.h"
#include "forge/ops/attention.h"

namespace forge::cuda {
namespace {

using namespace forge::cuda::testing;
using forge::testing::to_double;
using forge::testing::Tol;

struct SegTol {
  double out_max;   // |Δout| <= out_max·max|out_ref| elementwise
  double lse_abs;   // |Δlse| <= lse_abs (flash only)
  double grad_max;  // |Δg| <= grad_max·max|g_ref| elementwise, for dq, dk, dv
  double l2;        // ‖Δ‖₂ <= l2·‖ref‖₂ for out, dq, dk, dv
};
// bf16 (8 significant bits): the output store alone is 2^-9 ≈ 0.2% relative; P and dS rounding
// add a random 0.1–0.2% per term. lse: the expected error is ~1e-6 (f32 sums, exp2/log2
// approximations); 2e-3 still rejects one extra or missing key on rows of up to ~500 keys.
// f16 has 2 more mantissa bits: every dt-rounding term is 4× smaller.
// f32 (unfused only): f32 GEMMs (no TF32) and f32 softmax against double, ~1e-6 relative; the
// gradients' dP − rowsum(dP∘P) cancels ~10× (attention_test.cpp), so 1e-4 of the scale.
SegTol tol_for(DType dt) {
  if (dt == DType::kF32) return {2e-5, 1e-5, 1e-4, 2e-5};
  return dt == DType::kF16 ? SegTol{5e-3, 2e-3, 5e-3, 3e-3} : SegTol{2e-2, 2e-3, 2e-2, 1e-2};
}
// Absolute floor of every check: a length-1 segment gives dq = 0 exactly in the reference
// (P = 1, dS = dP − D = 0), while the kernel's D and dP are two f32 sums in different orders.
constexpr double kAbsFloor = 1e-4;

enum class Path { kUnfused, kMma, kWgmma };

struct Case {
  DType dt;
  AttentionShape s;
  Path path;
};

std::string case_string(const Case& c) {
  const AttentionShape& s = c.s;
  const char* path = c.path == Path::kUnfused ? "unfused_" : c.path == Path::kMma ? "mma_" : "wgmma_";
  return str(path, dtype_name(c.dt), "_B", s.B, "_T", s.T, "_NH", s.NH, "_NKV", s.NKV, "_HS", s.HS,
             s.causal ? "_causal" : "_full", s.window ? str("_window", s.window) : "");
}
std::string case_name(const ::testing::TestParamInfo<Case>& info) { return case_string(info.param); }
void PrintTo(const Case& c, std::ostream* os) { *os << case_string(c); }

std::vector<Case> all_cases() {
  using DType::kBF16;
  using DType::kF16;
  using DType::kF32;
  std::vector<Case> c;
  // Flash: both families (wgmma runs head sizes 64 and 128 only).
  const AttentionShape flash_shapes[] = {
      {3, 300, 4, 2, 64, true, 0},     // GQA 2, several tiles of every kernel
      {3, 333, 4, 1, 128, true, 0},    // GQA 4, HS 128
      {3, 300, 4, 2, 64, true, 37},    // window narrower than most segments
      {3, 17, 4, 2, 128, true, 5},     // less than one tile, window
      {3, 1000, 2, 1, 64, true, 0},    // many tiles: whole key / query tiles skipped by segment
      {3, 300, 4, 2, 64, false, 0},    // not causal: the segment is the only lower bound
  };
  for (const AttentionShape& s : flash_shapes)
    for (Path p : {Path::kMma, Path::kWgmma}) c.push_back({kBF16, s, p});
  for (Path p : {Path::kMma, Path::kWgmma}) {
    c.push_back({kF16, {3, 300, 8, 2, 128, true, 100}, p});
    c.push_back({kF16, {3, 17, 4, 4, 64, true, 0}, p});
  }
  c.push_back({kBF16, {3, 300, 4, 2, 96, true, 0}, Path::kMma});  // padded rows (mma only)
  // Unfused: f32, bf16, f16.
  for (DType dt : {kF32, kBF16, kF16}) {
    c.push_back({dt, {3, 300, 4, 2, 64, true, 0}, Path::kUnfused});
    c.push_back({dt, {3, 77, 4, 1, 128, true, 20}, Path::kUnfused});
  }
  c.push_back({kBF16, {3, 17, 2, 2, 64, true, 0}, Path::kUnfused});
  return c;
}

// seg (B, T): row b % 3 == 0 a length-1 segment, then random lengths 1..max(2, T/4); == 1 one
// segment; == 2 boundaries at and beside the tile edges of every kernel (BK / BQ 32, 64, 128)
// and a length-1 segment at the end. Run r of a row gets id 3 + r % 2, so runs that are not
// adjacent share ids.
std::vector<int32_t> make_segments(int B, int T, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> seg(size_t(B) * T);
  for (int b = 0; b < B; ++b) {
    std::vector<bool> begins(T, false);  // begins[t]: a run starts at t (t > 0)
    if (b % 3 == 0) {
      std::uniform_int_distribution<int> len(1, std::max(2, T / 4));
      for (int t = 1; t < T; t += len(rng)) begins[t] = true;  // [0, 1) is the first segment
    } else if (b % 3 == 2) {
      for (int t : {31, 32, 33, 63, 64, 65, 127, 128, 129, 191, 192, 255, 256, 257, 511, 512, 640, 767, 768})
        if (t < T) begins[t] = true;
      if (T > 1) begins[T - 1] = true;
    }
    int run = 0;
    for (int t = 0; t < T; ++t) {
      if (t > 0 && begins[t]) ++run;
      seg[size_t(b) * T + t] = 3 + run % 2;
    }
  }
  return seg;
}

struct Inputs {
  std::vector<float> q, k, v, dout;
};
Inputs make_inputs(DType dt, const AttentionShape& s, uint64_t seed) {
  const size_t nq = size_t(s.B) * s.T * s.NH * s.HS, nkv = size_t(s.B) * s.T * s.NKV * s.HS;
  return {round_to(dt, random_normal<float>(nq, seed)), round_to(dt, random_normal<float>(nkv, seed + 1)),
          round_to(dt, random_normal<float>(nkv, seed + 2)), round_to(dt, random_normal<float>(nq, seed + 3))};
}

// The CPU twin in double with the same seg; probs (B, NH, T, T) receives the probabilities of
// the visible keys (0 elsewhere).
struct Reference {
  std::vector<double> out, lse, probs, dq, dk, dv;
};
Reference reference(const AttentionShape& s, const Inputs& in, const std::vector<int32_t>& seg, bool probs) {
  const std::vector<double> q = to_double(in.q), k = to_double(in.k), v = to_double(in.v),
                            dout = to_double(in.dout);
  Reference r;
  r.out.resize(q.size());
  r.lse.resize(size_t(s.B) * s.NH * s.T);
  if (probs) r.probs.assign(size_t(s.B) * s.NH * s.T * s.T, 0.0);
  cpu::flash_attention_fwd<double>(r.out.data(), r.lse.data(), q.data(), k.data(), v.data(), s, {},
                                   probs ? r.probs.data() : nullptr, seg.data());
  r.dq.resize(q.size()), r.dk.resize(k.size()), r.dv.resize(v.size());
  cpu::flash_attention_bwd<double>(r.dq.data(), r.dk.data(), r.dv.data(), dout.data(), q.data(), k.data(),
                                   v.data(), r.out.data(), r.lse.data(), s, {}, nullptr, seg.data());
  return r;
}

// |got − ref| <= floor + max_tol·max|ref| elementwise, then ‖got − ref‖₂ <= l2_tol·‖ref‖₂ + floor·sqrt(n).
::testing::AssertionResult close_to(const std::vector<float>& got, const std::vector<double>& ref, double max_tol,
                                    double l2_tol) {
  double mx = 0, diff2 = 0, ref2 = 0;
  for (size_t i = 0; i < ref.size() && i < got.size(); ++i) {
    mx = std::max(mx, std::fabs(ref[i]));
    diff2 += (got[i] - ref[i]) * (got[i] - ref[i]);
    ref2 += ref[i] * ref[i];
  }
  ::testing::AssertionResult r = all_close(got, ref, Tol{kAbsFloor + max_tol * mx, 0.0});
  if (!r) return r << "\n  (max|ref| = " << mx << ")";
  const double l2 = std::sqrt(diff2), l2_bound = l2_tol * std::sqrt(ref2) + kAbsFloor * std::sqrt(double(ref.size()));
  if (!(l2 <= l2_bound))
    return ::testing::AssertionFailure() << "‖Δ‖₂ = " << l2 << " > " << l2_bound << " (‖ref‖₂ = " << std::sqrt(ref2)
                                         << ")";
  return ::testing::AssertionSuccess();
}

class AttentionSegTest : public CudaTest {
 protected:
  struct Result {
    std::vector<float> out, lse, att, dq, dk, dv;  // lse: flash; att: unfused
  };
  bool can_run(Path path) { return path != Path::kWgmma || ctx().props().major == 9; }

  // Device buffers of one forward + backward; run() enqueues both (no host sync), so a graph
  // can capture it.
  struct Buffers {
    DeviceBuffer<char> q, k, v, dout, out, att, dq, dk, dv;
    DeviceBuffer<float> lse, delta;
  };
  Buffers buffers(DType dt, const AttentionShape& s, const Inputs& in, Path path) {
    const size_t e = dtype_size(dt), nlse = size_t(s.B) * s.NH * s.T;
    Buffers b;
    b.q = to_device(dt, in.q), b.k = to_device(dt, in.k), b.v = to_device(dt, in.v);
    b.dout = to_device(dt, in.dout);
    b.out = poisoned<char>(in.q.size() * e);
    b.dq = poisoned<char>(in.q.size() * e), b.dk = poisoned<char>(in.k.size() * e);
    b.dv = poisoned<char>(in.v.size() * e);
    if (path == Path::kUnfused) b.att = poisoned<char>(nlse * s.T * e);
    else b.lse = poisoned<float>(nlse), b.delta = poisoned<float>(nlse);
    return b;
  }
  void enqueue(DType dt, const AttentionShape& s, Path path, Buffers& b, const int32_t* seg) {
    if (path == Path::kUnfused) {
      attention_fwd(ctx(), dt, b.out.data(), b.att.data(), b.q.data(), b.k.data(), b.v.data(), s, seg);
      // The unfused backward accumulates: start from 0.
      for (DeviceBuffer<char>* g : {&b.dq, &b.dk, &b.dv})
        FORGE_CUDA_CHECK(cudaMemsetAsync(g->data(), 0, g->bytes(), ctx().stream()));
      attention_bwd(ctx(), dt, b.dq.data(), b.dk.data(), b.dv.data(), b.dout.data(), b.q.data(), b.k.data(),
                    b.v.data(), b.att.data(), s, seg);
      return;
    }
    const FlashKernels kernels = path == Path::kMma ? FlashKernels::kMma : FlashKernels::kWgmma;
    flash_attention_fwd(ctx(), dt, b.out.data(), b.lse.data(), b.q.data(), b.k.data(), b.v.data(), s, {}, kernels,
                        seg);
    flash_attention_bwd(ctx(), dt, b.dq.data(), b.dk.data(), b.dv.data(), b.dout.data(), b.q.data(), b.k.data(),
                        b.v.data(), b.out.data(), b.lse.data(), b.delta.data(), s, {}, kernels, seg);
  }
  Result results(DType dt, Path path, const Buffers& b) {
    Result r{to_host(dt, b.out), {}, {}, to_host(dt, b.dq), to_host(dt, b.dk), to_host(dt, b.dv)};
    if (path == Path::kUnfused) r.att = to_host(dt, b.att);
    else r.lse = download(b.lse);
    return r;
  }
  Result run(DType dt, const AttentionShape& s, const Inputs& in, Path path, const int32_t* seg) {
    Buffers b = buffers(dt, s, in, path);
    enqueue(dt, s, path, b, seg);
    return results(dt, path, b);
  }

  static bool same(const std::vector<float>& x, const std::vector<float>& y) {
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
  }
  static void expect_same(const Result& a, const Result& b) {
    EXPECT_TRUE(same(a.out, b.out)) << "out";
    EXPECT_TRUE(same(a.lse, b.lse)) << "lse";
    EXPECT_TRUE(same(a.att, b.att)) << "att";
    EXPECT_TRUE(same(a.dq, b.dq)) << "dq";
    EXPECT_TRUE(same(a.dk, b.dk)) << "dk";
    EXPECT_TRUE(same(a.dv, b.dv)) << "dv";
  }
};

class AttentionSegCaseTest : public AttentionSegTest, public ::testing::WithParamInterface<Case> {};

TEST_P(AttentionSegCaseTest, MatchesCpuReference) {
  const auto [dt, s, path] = GetParam();
  if (!can_run(path)) GTEST_SKIP() << "the wgmma kernels need a compute capability 9.x device";
  const Inputs in = make_inputs(dt, s, 2000 + s.T + 10 * s.NKV + s.HS + s.window);
  const std::vector<int32_t> seg = make_segments(s.B, s.T, 17 + s.T);
  auto d_seg = upload(seg);
  const Result gpu = run(dt, s, in, path, d_seg.data());
  const Reference ref = reference(s, in, seg, path == Path::kUnfused);
  const SegTol t = tol_for(dt);
  EXPECT_TRUE(close_to(gpu.out, ref.out, t.out_max, t.l2)) << "out";
  if (path == Path::kUnfused) {
    // The probabilities: their dt store is the only rounding (attention_test.cpp's tolerances:
    // f32 kTolF32, bf16 rtol 4e-3, f16 rtol 1e-3, with a tiny atol so that a wrong small
    // probability fails). Masked entries — other segments' keys included — are exactly 0.
    const Tol tol_att = dt == DType::kF32 ? forge::testing::kTolF32
                        : dt == DType::kBF16 ? Tol{1e-6, 4e-3}
                                             : Tol{1e-6, 1e-3};
    EXPECT_TRUE(all_close(gpu.att, ref.probs, tol_att)) << "att";
    size_t masked_nonzero = 0;
    for (size_t e = 0; e < ref.probs.size(); ++e) masked_nonzero += ref.probs[e] == 0.0 && gpu.att[e] != 0.0f;
    EXPECT_EQ(masked_nonzero, 0u) << "masked probabilities must be exactly 0";
  } else {
    EXPECT_TRUE(all_close(gpu.lse, ref.lse, Tol{t.lse_abs, 0.0})) << "lse";
  }
  EXPECT_TRUE(close_to(gpu.dq, ref.dq, t.grad_max, t.l2)) << "dq";
  EXPECT_TRUE(close_to(gpu.dk, ref.dk, t.grad_max, t.l2)) << "dk";
  EXPECT_TRUE(close_to(gpu.dv, ref.dv, t.grad_max, t.l2)) << "dv";
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionSegCaseTest, ::testing::ValuesIn(all_cases()), case_name);

// One segment per row (every id equal) sees exactly what no segments see, so the segment
// instantiations must do the same arithmetic in the same order: bit-identical results.
TEST_F(AttentionSegTest, OneSegmentIsBitIdenticalToNoSegments) {
  struct Run {
    DType dt;
    AttentionShape s;
    Path path;
  };
  const Run runs[] = {
      {DType::kBF16, {2, 333, 4, 2, 64, true, 0}, Path::kMma},
      {DType::kBF16, {2, 333, 4, 2, 128, true, 50}, Path::kMma},
      {DType::kBF16, {2, 333, 4, 2, 64, true, 0}, Path::kWgmma},
      {DType::kF16, {2, 333, 4, 2, 128, true, 50}, Path::kWgmma},
      {DType::kF32, {2, 100, 4, 2, 64, true, 0}, Path::kUnfused},
      {DType::kBF16, {2, 100, 4, 2, 64, true, 0}, Path::kUnfused},
  };
  for (const Run& r : runs) {
    if (!can_run(r.path)) continue;
    SCOPED_TRACE(case_string({r.dt, r.s, r.path}));
    const Inputs in = make_inputs(r.dt, r.s, 41);
    auto one = upload(std::vector<int32_t>(size_t(r.s.B) * r.s.T, 9));
    expect_same(run(r.dt, r.s, in, r.path, one.data()), run(r.dt, r.s, in, r.path, nullptr));
  }
}

// segment_starts against starts written out by hand, then on rows longer than one scan step
// (1024 tokens) against a host loop; ids repeat across non-adjacent runs.
TEST_F(AttentionSegTest, SegmentStartsOfRuns) {
  {
    const std::vector<int32_t> seg = {5, 5, 3, 3, 3, 5, 7, 7, /* row 2 */ 1, 2, 1, 1, 1, 1, 1, 2};
    const std::vector<int32_t> want = {0, 0, 2, 2, 2, 5, 6, 6, /* row 2 */ 0, 1, 2, 2, 2, 2, 2, 7};
    auto d_seg = upload(seg);
    auto d_start = poisoned<int32_t>(seg.size());
    segment_starts(ctx(), d_start.data(), d_seg.data(), 2, 8);
    EXPECT_EQ(download(d_start), want);
  }
  const int B = 3, T = 2500;
  std::mt19937_64 rng(5);
  std::vector<int32_t> seg(size_t(B) * T);
  for (int b = 0; b < B; ++b)
    for (int t = 0, id = 0; t < T; ++t) {
      if (b != 1 && t > 0 && rng() % (b == 0 ? 300 : 3) == 0) id = 1 - id;  // row 1: one run
      if (b == 2 && (t == 1023 || t == 1024 || t == 2048)) id = 1 - id;     // runs at the step edges
      seg[size_t(b) * T + t] = id;
    }
  std::vector<int32_t> want(seg.size());
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      const size_t i = size_t(b) * T + t;
      want[i] = t > 0 && seg[i] == seg[i - 1] ? want[i - 1] : t;
    }
  auto d_seg = upload(seg);
  auto d_start = poisoned<int32_t>(seg.size());
  segment_starts(ctx(), d_start.data(), d_seg.data(), B, T);
  EXPECT_EQ(download(d_start), want);
}

// Training replays a captured step with new segment ids copied into the same device buffer: a
// replay must recompute the segment starts from that memory. Capture a forward + backward with
// layout A, copy layout B into the buffer, replay, and compare bit for bit with an eager run on B.
TEST_F(AttentionSegTest, GraphReplayFollowsSegmentsInDeviceMemory) {
  const DType dt = DType::kBF16;
  const AttentionShape s{3, 300, 4, 2, 64, true, 0};
  const Inputs in = make_inputs(dt, s, 61);
  const std::vector<int32_t> seg_a = make_segments(s.B, s.T, 1), seg_b = make_segments(s.B, s.T, 2);
  ASSERT_NE(seg_a, seg_b);
  for (Path path : {Path::kUnfused, Path::kMma, Path::kWgmma}) {
    if (!can_run(path)) continue;
    SCOPED_TRACE(case_string({dt, s, path}));
    auto d_seg = upload(seg_a);
    Buffers b = buffers(dt, s, in, path);
    enqueue(dt, s, path, b, d_seg.data());  // eager first: the capture needs warm caches
    Graph graph;
    graph.capture(ctx(), [&] { enqueue(dt, s, path, b, d_seg.data()); });
    FORGE_CUDA_CHECK(cudaMemcpyAsync(d_seg.data(), seg_b.data(), seg_b.size() * sizeof(int32_t),
                                     cudaMemcpyHostToDevice, ctx().stream()));
    ctx().synchronize();
    graph.launch();
    const Result replayed = results(dt, path, b);
    auto d_seg_b = upload(seg_b);
    expect_same(replayed, run(dt, s, in, path, d_seg_b.data()));
  }
}

}  // namespace
}  // namespace forge::cuda
