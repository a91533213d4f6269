// The CPU decode ops (backend/cpu/decode.cpp) against the training ops they must agree with: a
// decode step at position p is row p of the full-sequence computation. embedding_at and rope_at
// against embedding_fwd and rope_fwd (bit for bit), kv_append against the ring layout with the
// rest of the cache poisoned, decode_attention against flash_attention_fwd over the whole
// causal (or sliding-window) sequence, in double.
#include "forge/ops/decode.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "forge/core/error.h"
#include "forge/ops/attention.h"
#include "forge/ops/embedding.h"
#include "forge/ops/rope.h"
#include "testing.h"

namespace forge::cpu {
namespace {

using forge::testing::all_close;
using forge::testing::random_ids;
using forge::testing::random_normal;

constexpr double kPoison = 1e30;  // cache rows an op must not touch

// Copies dense rows (rows, width) into `into` at column `col` of rows `stride` wide.
std::vector<double> scatter(const std::vector<double>& dense, int rows, int width, int64_t stride,
                            int col, std::vector<double> into) {
  for (int r = 0; r < rows; ++r)
    std::copy_n(dense.begin() + static_cast<int64_t>(r) * width, width,
                into.begin() + r * stride + col);
  return into;
}

TEST(DecodeCpu, EmbeddingAtEqualsEmbeddingFwdRows) {
  const int V = 50, maxT = 40, C = 24, N = 5;
  const auto wte = random_normal<double>(static_cast<size_t>(V) * C, 1);
  const auto wpe = random_normal<double>(static_cast<size_t>(maxT) * C, 2);
  const std::vector<int32_t> tokens = {7, 0, 49, 7, 23};
  const std::vector<int32_t> pos = {0, 39, 12, 3, 12};
  // The whole sequence through embedding_fwd: position t holds token seq[t].
  const auto seq = random_ids(maxT, V, 3);
  for (const double* pe : {wpe.data(), static_cast<const double*>(nullptr)}) {
    std::vector<double> full(static_cast<size_t>(maxT) * C);
    embedding_fwd<double>(full.data(), seq.data(), wte.data(), pe, 1, maxT, C);
    std::vector<int32_t> tok_at(N);
    for (int n = 0; n < N; ++n) tok_at[n] = seq[pos[n]];
    std::vector<double> out(static_cast<size_t>(N) * C, kPoison), want(out.size());
    embedding_at<double>(out.data(), tok_at.data(), pos.data(), wte.data(), pe, N, C);
    for (int n = 0; n < N; ++n) std::copy_n(full.begin() + pos[n] * C, C, want.begin() + n * C);
    EXPECT_EQ(out, want) << "the same sums, bit for bit; wpe " << (pe ? "on" : "off");
    // Arbitrary (token, position) pairs, not only those of one sequence.
    embedding_at<double>(out.data(), tokens.data(), pos.data(), wte.data(), pe, N, C);
    for (int n = 0; n < N; ++n)
      for (int c = 0; c < C; ++c)
        EXPECT_EQ(out[n * C + c], wte[tokens[n] * C + c] + (pe ? pe[pos[n] * C + c] : 0.0))
            << n << " " << c;
  }
}

template <typename T>
void check_rope_at(const Rope& rope, int HS) {
  const int H = 3, N = 5, T_ = 48;
  const int64_t width = static_cast<int64_t>(H) * HS,
                stride = 3 * width;  // the k slice of (N, 3·H·HS)
  const std::vector<int32_t> pos = {0, 47, 8191, 3, 4000};
  const auto base_rows = random_normal<T>(static_cast<size_t>(N) * stride, 10 + HS);
  std::vector<T> x = base_rows;
  rope_at<T>(x.data() + width, pos.data(), N, H, HS, rope, stride);
  // Against the full sequence where it is short (t = pos), and against pos0 = pos where it is not.
  std::vector<T> seq = random_normal<T>(static_cast<size_t>(T_) * width, 20 + HS);
  for (int n = 0; n < N; ++n) {
    std::vector<T> want(base_rows.begin() + n * stride + width,
                        base_rows.begin() + n * stride + 2 * width);
    if (pos[n] < T_) {
      std::vector<T> s = seq;
      std::copy(want.begin(), want.end(), s.begin() + pos[n] * width);
      rope_fwd<T>(s.data(), 1, T_, H, HS, rope);
      want.assign(s.begin() + pos[n] * width, s.begin() + (pos[n] + 1) * width);
    } else {
      rope_fwd<T>(want.data(), 1, 1, H, HS, rope, pos[n]);
    }
    const std::vector<T> got(x.begin() + n * stride + width, x.begin() + n * stride + 2 * width);
    EXPECT_EQ(got, want) << "row " << n << " pos " << pos[n] << ": bit for bit";
    // The q and v slices of the fused row are untouched.
    EXPECT_TRUE(std::equal(x.begin() + n * stride, x.begin() + n * stride + width,
                           base_rows.begin() + n * stride));
    EXPECT_TRUE(std::equal(x.begin() + n * stride + 2 * width, x.begin() + (n + 1) * stride,
                           base_rows.begin() + n * stride + 2 * width));
  }
}

// Unscaled, linear and Llama 3.1's llama3 scaling: both ops take the same rope_inv_freq table.
TEST(DecodeCpu, RopeAtEqualsRopeFwdRowsBothStylesStrided) {
  for (RopeStyle style : {RopeStyle::kRotateHalf, RopeStyle::kInterleaved})
    for (const Rope& rope :
         {Rope{10000.0f, style}, Rope{10000.0f, style, RopeScaling::kLinear, 4.0f},
          Rope{500000.0f, style, RopeScaling::kLlama3, 8.0f, 1.0f, 4.0f, 8192}})
      for (int HS : {64, 20}) {
        SCOPED_TRACE("style " + std::to_string(static_cast<int>(style)) + " scaling " +
                     std::to_string(static_cast<int>(rope.scaling)) + " HS " + std::to_string(HS));
        check_rope_at<double>(rope, HS);
        check_rope_at<float>(rope, HS);
      }
}

TEST(DecodeCpu, KvAppendWritesExactlyTheRingRows) {
  const DecodeShape s{3, 4, 2, 4, 5};  // S, NH, NKV, HS, cap
  const int W = s.NKV * s.HS;
  const int64_t stride = 3 * W;                // k and v are column slices of one (S, 3·W) buffer
  const std::vector<int32_t> pos = {0, 7, 4};  // rows 0, 2 (wrapped), 4
  const auto kv = random_normal<double>(static_cast<size_t>(s.S) * stride, 30);
  std::vector<double> ck(static_cast<size_t>(s.S) * s.cap * W, kPoison), cv = ck;
  kv_append<double>(ck.data(), cv.data(), kv.data() + W, kv.data() + 2 * W, pos.data(), s, stride,
                    stride);
  for (int slot = 0; slot < s.S; ++slot)
    for (int r = 0; r < s.cap; ++r)
      for (int c = 0; c < W; ++c) {
        const size_t i = (static_cast<size_t>(slot) * s.cap + r) * W + c;
        const bool mine = r == pos[slot] % s.cap;
        EXPECT_EQ(ck[i], mine ? kv[slot * stride + W + c] : kPoison)
            << slot << " " << r << " " << c;
        EXPECT_EQ(cv[i], mine ? kv[slot * stride + 2 * W + c] : kPoison)
            << slot << " " << r << " " << c;
      }

  // A long sequence appended step by step (dense k, v): the ring holds the last cap tokens.
  const int T = 13;
  const auto k = random_normal<double>(static_cast<size_t>(T) * s.S * W, 31);  // (T, S, W)
  const auto v = random_normal<double>(k.size(), 32);
  std::fill(ck.begin(), ck.end(), kPoison), std::fill(cv.begin(), cv.end(), kPoison);
  for (int t = 0; t < T; ++t) {
    const std::vector<int32_t> p(s.S, t);
    kv_append<double>(ck.data(), cv.data(), k.data() + t * s.S * W, v.data() + t * s.S * W,
                      p.data(), s);
  }
  for (int slot = 0; slot < s.S; ++slot)
    for (int t = T - s.cap; t < T; ++t)
      for (int c = 0; c < W; ++c) {
        const size_t i = (static_cast<size_t>(slot) * s.cap + t % s.cap) * W + c;
        EXPECT_EQ(ck[i], k[(t * s.S + slot) * W + c]);
        EXPECT_EQ(cv[i], v[(t * s.S + slot) * W + c]);
      }
}

// One decode problem: S sequences of T tokens (q, k, v per token), the cache filled by
// kv_append step by step (slot s stops at its position p[s]: later steps rewrite that row), and
// flash_attention_fwd over the whole sequences as the reference.
struct Problem {
  DecodeShape s;
  int T, window;
  std::vector<int32_t> p;       // (S) the decode position of each slot
  std::vector<double> q, k, v;  // (S, T, NH, HS), (S, T, NKV, HS) twice
  std::vector<double> ck, cv;   // (S, cap, NKV, HS)

  Problem(DecodeShape shape, int T_, int window_, std::vector<int32_t> pos, uint64_t seed)
      : s(shape), T(T_), window(window_), p(std::move(pos)) {
    q = random_normal<double>(static_cast<size_t>(s.S) * T * s.NH * s.HS, seed);
    k = random_normal<double>(static_cast<size_t>(s.S) * T * s.NKV * s.HS, seed + 1);
    v = random_normal<double>(k.size(), seed + 2);
    ck.assign(static_cast<size_t>(s.S) * s.cap * s.NKV * s.HS, kPoison), cv = ck;
    const int W = s.NKV * s.HS;
    for (int t = 0; t < T; ++t) {
      std::vector<int32_t> at(s.S);
      for (int i = 0; i < s.S; ++i) at[i] = std::min(t, p[i]);
      std::vector<double> kt(static_cast<size_t>(s.S) * W), vt(kt.size());  // (S, NKV, HS)
      for (int i = 0; i < s.S; ++i) {
        std::copy_n(k.begin() + (static_cast<int64_t>(i) * T + at[i]) * W, W, kt.begin() + i * W);
        std::copy_n(v.begin() + (static_cast<int64_t>(i) * T + at[i]) * W, W, vt.begin() + i * W);
      }
      kv_append<double>(ck.data(), cv.data(), kt.data(), vt.data(), at.data(), s);
    }
  }
  // Row p[s] of every slot of flash_attention_fwd, (S, NH, HS).
  std::vector<double> reference() const {
    const AttentionShape a{s.S, T, s.NH, s.NKV, s.HS, true, window};
    std::vector<double> out(q.size()), lse(static_cast<size_t>(s.S) * s.NH * T);
    flash_attention_fwd<double>(out.data(), lse.data(), q.data(), k.data(), v.data(), a);
    return rows_at_p(out);
  }
  // Query rows at p, (S, NH, HS).
  std::vector<double> rows_at_p(const std::vector<double>& x) const {
    const int W = s.NH * s.HS;
    std::vector<double> r(static_cast<size_t>(s.S) * W);
    for (int i = 0; i < s.S; ++i)
      std::copy_n(x.begin() + (static_cast<int64_t>(i) * T + p[i]) * W, W, r.begin() + i * W);
    return r;
  }
  std::vector<double> decode(int64_t q_stride = 0) const {
    const int W = s.NH * s.HS;
    std::vector<double> qd = rows_at_p(q), out(static_cast<size_t>(s.S) * W, kPoison);
    if (q_stride) {  // q as the first columns of a fused (S, q_stride) buffer
      qd = scatter(qd, s.S, W, q_stride, 0,
                   random_normal<double>(static_cast<size_t>(s.S) * q_stride, 99));
    }
    decode_attention<double>(out.data(), qd.data(), ck.data(), cv.data(), p.data(), s, q_stride);
    return out;
  }
};

// Double throughout: the two loops differ only in rounding (summation of the same terms), so
// 1e-12 absolute on O(1) outputs.
constexpr forge::testing::Tol kTolSameSum{1e-12, 1e-10};

TEST(DecodeCpu, AttentionEqualsFlashRowCausalGqa) {
  for (int HS : {32, 64}) {
    SCOPED_TRACE("HS " + std::to_string(HS));
    // cap 32 ≥ T: no wrap; rows beyond p hold poison and must not be read.
    const Problem pr({4, 6, 2, HS, 32}, 23, 0, {0, 11, 22, 5}, 40 + HS);
    const auto want = pr.reference();
    EXPECT_TRUE(all_close(pr.decode(), want, kTolSameSum));
    // q as a column slice of a fused (S, NH·HS + 2·NKV·HS) projection.
    EXPECT_TRUE(all_close(pr.decode((6 + 2 * 2) * HS), want, kTolSameSum)) << "strided q";
  }
  // Multi-head attention (NKV = NH) too.
  const Problem mha({2, 3, 3, 16, 16}, 9, 0, {8, 2}, 50);
  EXPECT_TRUE(all_close(mha.decode(), mha.reference(), kTolSameSum)) << "NKV = NH";
}

TEST(DecodeCpu, AttentionOverARingEqualsSlidingWindow) {
  // cap = window = 8 over 40 tokens: the ring wraps up to four times; slot 0 never fills it.
  const Problem pr({4, 6, 2, 32, 8}, 40, 8, {3, 20, 39, 7}, 60);
  EXPECT_TRUE(all_close(pr.decode(), pr.reference(), kTolSameSum));
}

TEST(DecodeCpu, AttentionIgnoresTheOrderOfCacheRows) {
  Problem pr({3, 4, 2, 16, 12}, 30, 12, {29, 5, 11}, 70);
  const auto before = pr.decode();
  const int W = pr.s.NKV * pr.s.HS;
  // Permute the visible rows [0, min(p + 1, cap)) of each slot, k and v together.
  for (int i = 0; i < pr.s.S; ++i) {
    const int n = std::min(pr.p[i] + 1, pr.s.cap);
    std::vector<int> perm(n);
    std::iota(perm.begin(), perm.end(), 0);
    std::reverse(perm.begin(), perm.end());
    std::rotate(perm.begin(), perm.begin() + n / 3, perm.end());
    const auto k0 = pr.ck, v0 = pr.cv;
    for (int r = 0; r < n; ++r) {
      const int64_t dst = (static_cast<int64_t>(i) * pr.s.cap + r) * W,
                    src = (static_cast<int64_t>(i) * pr.s.cap + perm[r]) * W;
      std::copy_n(k0.begin() + src, W, pr.ck.begin() + dst);
      std::copy_n(v0.begin() + src, W, pr.cv.begin() + dst);
    }
  }
  const auto after = pr.decode();
  EXPECT_TRUE(all_close(after, before, kTolSameSum));
  EXPECT_NE(after, std::vector<double>(after.size(), kPoison));
}

// The float instantiation accumulates in float: against the double one, ~1e-6 relative on
// 30-term softmax sums.
TEST(DecodeCpu, AttentionFloatMatchesDouble) {
  const Problem pr({2, 4, 2, 32, 32}, 30, 0, {29, 13}, 80);
  const auto want = pr.decode();
  auto f = [](const std::vector<double>& x) { return std::vector<float>(x.begin(), x.end()); };
  const auto q = f(pr.rows_at_p(pr.q)), ck = f(pr.ck), cv = f(pr.cv);
  std::vector<float> out(want.size());
  decode_attention<float>(out.data(), q.data(), ck.data(), cv.data(), pr.p.data(), pr.s);
  EXPECT_TRUE(all_close(out, want, {1e-5, 1e-4}));
}

TEST(DecodeCpu, AdvancePositionsClamps) {
  std::vector<int32_t> pos = {0, 5, 9, 10, 12};
  advance_positions(pos.data(), 4, 10);  // the fifth is past S: untouched
  EXPECT_EQ(pos, (std::vector<int32_t>{1, 6, 10, 10, 12}));
}

TEST(DecodeCpu, BadShapesThrow) {
  std::vector<double> buf(1024);
  const std::vector<int32_t> pos = {0};
  EXPECT_THROW(decode_attention<double>(buf.data(), buf.data(), buf.data(), buf.data(), pos.data(),
                                        {1, 6, 4, 8, 4}),
               Error);  // NH % NKV != 0
  EXPECT_THROW(kv_append<double>(buf.data(), buf.data(), buf.data(), buf.data(), pos.data(),
                                 {1, 4, 2, 8, 0}),
               Error);  // cap 0
  EXPECT_THROW(
      rope_at<double>(buf.data(), pos.data(), 1, 2, 7, Rope{10000.0f, RopeStyle::kRotateHalf}),
      Error);  // odd HS
  EXPECT_THROW(
      rope_at<double>(buf.data(), pos.data(), 1, 2, 8, Rope{10000.0f, RopeStyle::kRotateHalf}, 8),
      Error);  // stride < H·HS
}

}  // namespace
}  // namespace forge::cpu
