// CUDA decode ops (backend/cuda/decode.cu) against the CPU twins (backend/cpu/decode.cpp) on
// fresh random inputs rounded to the kernel's dtype, f32, bf16 and f16. Attention's reference
// is the double CPU twin; cache rows a slot cannot see hold NaN, so reading one fails the test.
// Shapes: S = 1 and 8 with a different position per slot, GQA (SmolLM2: NH 9, NKV 3) and
// groups above the 8 heads of one block, GPT-2's strided q from a fused (S, 3C) projection,
// head sizes 32 to 128, a ring holding the last cap tokens, a long context that takes the split
// path (cap 4096, positions ~4000), S = 128; RoPE unscaled, linear and llama3; and decode steps
// captured in a cuda::Graph that replay with new positions written into device memory.
#include "forge/backend/cuda/decode.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "forge/backend/cuda/graph.h"
#include "forge/backend/cuda/ops.h"
#include "forge/core/error.h"
#include "forge/ops/decode.h"
#include "forge/ops/rope.h"
#include "op_testing.h"

namespace forge::cuda {
namespace {

using namespace forge::cuda::testing;
using forge::testing::random_ids;

// decode_attention's scratch, zeroed as its contract asks (the splits' arrival counters).
DeviceBuffer<char> attention_scratch(Context& ctx, const DecodeShape& s) {
  const size_t n = std::max<size_t>(1, decode_attention_scratch_bytes(s));
  DeviceBuffer<char> b(ctx.allocator(), n);
  FORGE_CUDA_CHECK(cudaMemsetAsync(b.data(), 0, n, ctx.stream()));
  ctx.synchronize();
  return b;
}

class DecodeTest : public DtypeTest<CudaTest> {
 protected:
  static std::vector<float> to_f(const std::vector<double>& v) {
    return std::vector<float>(v.begin(), v.end());
  }
  static std::vector<double> to_d(const std::vector<float>& v) {
    return std::vector<double>(v.begin(), v.end());
  }

  // S·cap·NKV·HS random cache rows; the rows slot s cannot see at pos[s] are NaN.
  std::vector<float> cache(const DecodeShape& s, const std::vector<int32_t>& pos, uint64_t seed) {
    const size_t row = static_cast<size_t>(s.NKV) * s.HS;
    auto c = as_dt(dt(), random_normal<float>(static_cast<size_t>(s.S) * s.cap * row, seed));
    for (int i = 0; i < s.S; ++i)
      for (int r = std::min(pos[i] + 1, s.cap); r < s.cap; ++r)
        std::fill_n(c.begin() + (static_cast<size_t>(i) * s.cap + r) * row, row,
                    std::numeric_limits<float>::quiet_NaN());
    return c;
  }

  // decode_attention on the device against cpu::decode_attention<double> on the same inputs.
  // generic: decode_attention_generic (any head size) instead of the flash-decoding kernel.
  void check_attention(const DecodeShape& s, const std::vector<int32_t>& pos, int64_t q_stride,
                       uint64_t seed, const std::string& what, bool generic = false) {
    SCOPED_TRACE(what + " S=" + std::to_string(s.S) + " NH=" + std::to_string(s.NH) +
                 " NKV=" + std::to_string(s.NKV) + " HS=" + std::to_string(s.HS) + " cap=" +
                 std::to_string(s.cap) +
                 (generic ? " generic" : " splits=" + std::to_string(decode_attention_splits(s))));
    const int64_t qs = q_stride ? q_stride : static_cast<int64_t>(s.NH) * s.HS;
    // Scale 1.5: scores of std ~1.5, a peaked softmax rather than a near-uniform average.
    const auto q = as_dt(dt(), random_normal<float>(static_cast<size_t>(s.S) * qs, seed, 1.5));
    const auto ck = cache(s, pos, seed + 1), cv = cache(s, pos, seed + 2);
    std::vector<double> want(static_cast<size_t>(s.S) * s.NH * s.HS);
    const auto qd = to_d(q), ckd = to_d(ck), cvd = to_d(cv);
    cpu::decode_attention<double>(want.data(), qd.data(), ckd.data(), cvd.data(), pos.data(), s,
                                  q_stride);
    auto dq = up(q), dk = up(ck), dv = up(cv);
    auto dpos = upload(pos);
    auto out = poison(want.size());
    if (generic) {
      decode_attention_generic(ctx(), dt(), out.data(), dq.data(), dk.data(), dv.data(), dpos.data(), s,
                               q_stride);
    } else {
      DeviceBuffer<char> scratch = attention_scratch(ctx(), s);
      decode_attention(ctx(), dt(), out.data(), dq.data(), dk.data(), dv.data(), dpos.data(), s,
                       q_stride, scratch.data());
    }
    EXPECT_TRUE(all_close(down(out), want,
                          tol_for(dt())));  // f32 1e-5 + 1e-4·|ref|, bf16 1e-2 + 2e-2·|ref|
  }
};

TEST_P(DecodeTest, EmbeddingAtMatchesCpu) {
  const int V = 100, maxT = 64, N = 7;
  const std::vector<int32_t> pos = {0, 63, 5, 5, 17, 1, 40};
  for (int C : {200, 37}) {  // 37: the element-by-element path
    for (bool with_wpe : {true, false}) {
      const auto wte = as_dt(dt(), random_normal<float>(static_cast<size_t>(V) * C, 1));
      const auto wpe = as_dt(dt(), random_normal<float>(static_cast<size_t>(maxT) * C, 2));
      const auto tokens = random_ids(N, V, 3);
      std::vector<float> want(static_cast<size_t>(N) * C);
      cpu::embedding_at<float>(want.data(), tokens.data(), pos.data(), wte.data(),
                               with_wpe ? wpe.data() : nullptr, N, C);
      auto dwte = up(wte), dwpe = up(wpe), out = poison(want.size());
      auto dtok = upload(tokens), dpos = upload(pos);
      embedding_at(ctx(), dt(), out.data(), dtok.data(), dpos.data(), dwte.data(),
                   with_wpe ? dwpe.data() : nullptr, N, C);
      // One f32 add of two dt values, rounded to dt: f32 exact, bf16/f16 one rounding.
      EXPECT_TRUE(all_close(down(out), as_dt(dt(), want), {0, 0}))
          << "C=" << C << " wpe=" << with_wpe;
    }
  }
}

// Unscaled, linear and Llama 3.1's llama3 RoPE (ops/rope.h): the GPU must take the scaled table.
std::vector<Rope> ropes(RopeStyle style) {
  return {Rope{10000.0f, style}, Rope{10000.0f, style, RopeScaling::kLinear, 4.0f},
          Rope{500000.0f, style, RopeScaling::kLlama3, 8.0f, 1.0f, 4.0f, 8192}};
}

TEST_P(DecodeTest, RopeAtMatchesCpuBothStylesScalingsStrided) {
  const int N = 6, H = 3;
  const std::vector<int32_t> pos = {0, 1, 100, 8191, 4000, 37};
  uint64_t seed = 10;
  for (int HS : {64, 20})  // 20: HS/2 = 10 is not a multiple of kVec, the element path
    for (RopeStyle style : {RopeStyle::kRotateHalf, RopeStyle::kInterleaved})
      for (const Rope& rope : ropes(style))
        for (bool strided : {false, true}) {
          const int64_t W = static_cast<int64_t>(H) * HS;
          const int64_t stride = strided ? 3 * W : W;  // the k slice of a fused (N, 3·H·HS) row
          const int64_t col = strided ? W : 0;
          const auto x = as_dt(dt(), random_normal<float>(static_cast<size_t>(N) * stride, seed++));
          std::vector<float> want = x;
          cpu::rope_at<float>(want.data() + col, pos.data(), N, H, HS, rope, stride);
          auto dx = up(x);
          auto dpos = upload(pos);
          rope_at(ctx(), dt(), dx.at(col), dpos.data(), N, H, HS, rope, stride);
          // The whole buffer (the q and v slices must be untouched); the angles differ from the
          // CPU's double cos/sin by ~1e-7, so f32 1e-5 + 1e-4·|ref|, bf16/f16 one output
          // rounding.
          EXPECT_TRUE(all_close(down(dx), want, tol_for(dt())))
              << "HS=" << HS << " style=" << static_cast<int>(style)
              << " scaling=" << static_cast<int>(rope.scaling) << " strided=" << strided;
          if (rope.scaling != RopeScaling::kNone) {  // positions 4000, 8191 tell them apart
            std::vector<float> plain = x;
            cpu::rope_at<float>(plain.data() + col, pos.data(), N, H, HS,
                                Rope{rope.theta, rope.style}, stride);
            EXPECT_FALSE(static_cast<bool>(all_close(plain, want, tol_for(dt()))))
                << "the case does not distinguish scaling " << static_cast<int>(rope.scaling);
          }
        }
}

// rope_at repeats rope_fwd's kernel arithmetic with a position per row: the same bits as
// cuda::rope_fwd at pos0 = pos[n], scaled or not.
TEST_P(DecodeTest, RopeAtEqualsRopeFwdKernelBitForBit) {
  const int N = 4, H = 2, HS = 64;
  const std::vector<int32_t> pos = {0, 3, 2047, 8000};
  const auto x = as_dt(dt(), random_normal<float>(static_cast<size_t>(N) * H * HS, 20));
  for (RopeStyle style : {RopeStyle::kRotateHalf, RopeStyle::kInterleaved})
    for (const Rope& rope : ropes(style)) {
      auto a = up(x), b = up(x);
      auto dpos = upload(pos);
      rope_at(ctx(), dt(), a.data(), dpos.data(), N, H, HS, rope);
      for (int n = 0; n < N; ++n)
        rope_fwd(ctx(), dt(), b.at(static_cast<size_t>(n) * H * HS), 1, 1, H, HS, rope, pos[n]);
      EXPECT_TRUE(same_bits(down(a), down(b)))
          << "style=" << static_cast<int>(style) << " scaling=" << static_cast<int>(rope.scaling);
    }
}

TEST_P(DecodeTest, KvAppendWritesExactlyTheRingRows) {
  struct Case {
    DecodeShape s;
    bool fused;  // k, v as column slices of one (S, 3·NKV·HS) projection (GPT-2), else dense
  };
  const Case cases[] = {{{8, 9, 3, 64, 40}, false},
                        {{8, 12, 12, 64, 40}, true},
                        {{3, 2, 1, 6, 5}, false}};  // rows of 6 elements: element-by-element copy
  const std::vector<int32_t> pos = {0, 39, 40, 85, 7, 7, 119, 1};  // 40, 85, 119 wrap
  uint64_t seed = 30;
  for (const Case& c : cases) {
    const DecodeShape& s = c.s;
    const int64_t W = static_cast<int64_t>(s.NKV) * s.HS, stride = c.fused ? 3 * W : W;
    const std::vector<int32_t> p(pos.begin(), pos.begin() + s.S);
    const auto kb = as_dt(dt(), random_normal<float>(static_cast<size_t>(s.S) * stride, seed++));
    const auto vb = c.fused ? kb : as_dt(dt(), random_normal<float>(kb.size(), seed++));
    const int64_t k_col = c.fused ? W : 0, v_col = c.fused ? 2 * W : 0;
    // Start from random caches: every row but the appended ones must keep its value.
    const auto ck = as_dt(dt(), random_normal<float>(static_cast<size_t>(s.S) * s.cap * W, seed++));
    const auto cv = as_dt(dt(), random_normal<float>(ck.size(), seed++));
    std::vector<float> want_k = ck, want_v = cv;
    cpu::kv_append<float>(want_k.data(), want_v.data(), kb.data() + k_col, vb.data() + v_col,
                          p.data(), s, stride, stride);
    auto dck = up(ck), dcv = up(cv), dkb = up(kb), dvb = up(vb);
    auto dpos = upload(p);
    kv_append(ctx(), dt(), dck.data(), dcv.data(), dkb.at(k_col), dvb.at(v_col), dpos.data(), s,
              stride, stride);
    // A copy: bit-identical.
    EXPECT_TRUE(same_bits(down(dck), want_k)) << "k, HS=" << s.HS << " fused=" << c.fused;
    EXPECT_TRUE(same_bits(down(dcv), want_v)) << "v, HS=" << s.HS << " fused=" << c.fused;
  }
}

TEST_P(DecodeTest, AttentionMatchesCpu) {
  // SmolLM2-135M: one slot, then 8 with different positions (row 0, a tile edge, a partial
  // tile, the last row).
  check_attention({1, 9, 3, 64, 256}, {137}, 0, 40, "smollm2 S=1");
  check_attention({8, 9, 3, 64, 256}, {0, 1, 63, 64, 100, 200, 255, 17}, 0, 41, "smollm2 S=8");
  // GPT-2: NKV = NH, q a column slice of the fused (S, 3C) projection (C = 768).
  check_attention({4, 12, 12, 64, 128}, {127, 0, 64, 31}, 3 * 768, 42, "gpt2 strided q");
  // Every head size, cap not a multiple of the tile.
  uint64_t seed = 50;
  for (int HS : {32, 64, 80, 96, 128})
    check_attention({3, 8, 2, HS, 100}, {99, 0, 50}, 0, seed++, "head sizes");
  // Groups above the 8 heads one block holds: 16 (two chunks of 8), 9 (chunks of 5 and 4).
  check_attention({2, 16, 1, 64, 200}, {199, 70}, 0, 60, "MQA group 16");
  check_attention({2, 18, 2, 128, 90}, {89, 3}, 0, 61, "group 9");
  // A ring: positions past cap see all cap rows (cap = window, Mistral).
  check_attention({3, 4, 2, 64, 96}, {500, 95, 1000}, 0, 62, "ring");
  // S = 128 slots, positions spread over the cache and past it.
  std::vector<int32_t> pos(128);
  for (int i = 0; i < 128; ++i) pos[i] = (i * 37) % 200;
  check_attention({128, 9, 3, 64, 128}, pos, 0, 63, "S=128");
}

// The fused RoPE + append of a Llama decode step: the CPU composition within the dtype's
// tolerance, and the three separate GPU ops (rope_at q, rope_at k, kv_append) bit for bit;
// unscaled, linear and llama3 RoPE.
TEST_P(DecodeTest, RopeKvAppendEqualsTheThreeOps) {
  for (RopeStyle style : {RopeStyle::kRotateHalf, RopeStyle::kInterleaved})
    for (const Rope& rope : ropes(style)) {
      SCOPED_TRACE("style " + std::to_string(static_cast<int>(style)) + " scaling " +
                   std::to_string(static_cast<int>(rope.scaling)));
      const DecodeShape s{4, 9, 3, 64, 40};
      const int64_t stride = static_cast<int64_t>(s.NH + 2 * s.NKV) * s.HS + 8;  // padded rows
      const std::vector<int32_t> pos = {0, 39, 85, 1000};  // 85 and 1000 wrap the ring
      const auto qkv = as_dt(dt(), random_normal<float>(static_cast<size_t>(s.S) * stride, 90));
      const size_t cn = static_cast<size_t>(s.S) * s.cap * s.NKV * s.HS;
      const auto ck = as_dt(dt(), random_normal<float>(cn, 91));
      const auto cv = as_dt(dt(), random_normal<float>(cn, 92));
      std::vector<double> wq = to_d(qkv), wk = to_d(ck), wv = to_d(cv);
      cpu::rope_kv_append<double>(wq.data(), stride, wk.data(), wv.data(), pos.data(), s, rope);
      if (rope.scaling != RopeScaling::kNone) {  // position 1000 tells them apart
        std::vector<double> pq = to_d(qkv), pk = to_d(ck), pv = to_d(cv);
        cpu::rope_kv_append<double>(pq.data(), stride, pk.data(), pv.data(), pos.data(), s,
                                    Rope{rope.theta, rope.style});
        EXPECT_FALSE(static_cast<bool>(all_close(pq, wq, tol_for(dt()))))
            << "the case does not distinguish the scaling";
      }
      auto dpos = upload(pos);
      auto a = up(qkv), ak = up(ck), av = up(cv);
      rope_kv_append(ctx(), dt(), a.data(), stride, ak.data(), av.data(), dpos.data(), s, rope);
      EXPECT_TRUE(all_close(down(a), wq, tol_for(dt()))) << "qkv";
      EXPECT_TRUE(all_close(down(ak), wk, tol_for(dt()))) << "cache k";
      EXPECT_TRUE(all_close(down(av), wv, tol_for(dt()))) << "cache v";
      auto b = up(qkv), bk = up(ck), bv = up(cv);
      const int64_t kc = static_cast<int64_t>(s.NH) * s.HS;
      const int64_t vc = kc + static_cast<int64_t>(s.NKV) * s.HS;
      rope_at(ctx(), dt(), b.data(), dpos.data(), s.S, s.NH, s.HS, rope, stride);
      rope_at(ctx(), dt(), b.at(kc), dpos.data(), s.S, s.NKV, s.HS, rope, stride);
      kv_append(ctx(), dt(), bk.data(), bv.data(), b.at(kc), b.at(vc), dpos.data(), s, stride,
                stride);
      EXPECT_TRUE(same_bits(down(a), down(b))) << "qkv vs rope_at";
      EXPECT_TRUE(same_bits(down(ak), down(bk))) << "cache k vs kv_append";
      EXPECT_TRUE(same_bits(down(av), down(bv))) << "cache v vs kv_append";
    }
}

// A Llama decode step's RoPE + cache append + attention as one kernel (rope_decode_attention;
// rope null: GPT-2's append + attention): the unfused GPU ops (rope_kv_append or kv_append, then
// decode_attention) bit for bit — output and both caches — and the double CPU composition
// within the dtype's tolerance. Cache rows a slot cannot see are NaN; the row the step writes
// holds stale random values, so reading it instead of the new k, v fails. One split and many,
// a ring, a group above 8 heads (two chunks), head size 128. Each call runs twice on fresh
// copies with the same scratch: the splits' arrival counters must come back to zero.
TEST_P(DecodeTest, RopeDecodeAttentionEqualsTheUnfusedOps) {
  auto s32_pos = [] {  // row 0, chunk edges, both passes of the 16 warps, the last row, a wrap
    std::vector<int32_t> p = {0, 31, 32, 511, 512, 700, 767, 1000};
    for (int i = static_cast<int>(p.size()); i < 32; ++i) p.push_back((i * 97) % 768);
    return p;
  };
  struct Case {
    DecodeShape s;
    std::vector<int32_t> pos;
    bool rope;
    RopeStyle style;
    const char* what;
  };
  const std::vector<Case> cases = {
      {{1, 9, 3, 64, 384}, {130}, true, RopeStyle::kRotateHalf, "smollm2 S=1"},
      // The new row in a warp's second chunk (row 600: chunk 18 of warp 2).
      {{1, 9, 3, 64, 1024}, {600}, true, RopeStyle::kInterleaved, "S=1, second pass"},
      // 32 slots: the short-cache kernel with four query heads a block (batch 32's path).
      {{32, 9, 3, 64, 768}, s32_pos(), true, RopeStyle::kRotateHalf, "S=32, four heads a block"},
      // 2,048-row caches (the serving default) take the one-pass kernel too: the new row in a
      // warp's fourth chunk, and slots far apart, one and four query heads a block.
      {{1, 9, 3, 64, 2048}, {1900}, true, RopeStyle::kRotateHalf, "S=1, cap 2048, fourth pass"},
      {{8, 9, 3, 64, 2048}, {2047, 0, 1100, 31, 1500, 700, 64, 1999}, true, RopeStyle::kInterleaved,
       "S=8, cap 2048"},
      {{32, 9, 3, 64, 2048}, s32_pos(), true, RopeStyle::kRotateHalf, "S=32, cap 2048, four heads"},
      {{4, 9, 3, 64, 40}, {0, 39, 85, 1000}, true, RopeStyle::kInterleaved, "ring"},
      {{2, 16, 1, 64, 200}, {199, 70}, true, RopeStyle::kRotateHalf, "group 16"},
      {{3, 8, 2, 128, 4096}, {4000, 29, 0}, true, RopeStyle::kRotateHalf, "long, HS 128"},
      {{2, 12, 12, 64, 128}, {127, 5}, false, RopeStyle::kRotateHalf, "no rope (gpt2)"},
  };
  uint64_t seed = 500;
  for (const Case& c : cases) {
    const DecodeShape& s = c.s;
    SCOPED_TRACE(std::string(c.what) + " splits=" + std::to_string(decode_attention_splits(s)));
    const Rope rope{10000.0, c.style};
    const Rope* r = c.rope ? &rope : nullptr;
    const int64_t kc = static_cast<int64_t>(s.NH) * s.HS;
    const int64_t vc = kc + static_cast<int64_t>(s.NKV) * s.HS;
    const int64_t stride = vc + static_cast<int64_t>(s.NKV) * s.HS + 8;  // padded rows
    const auto qkv = as_dt(dt(), random_normal<float>(static_cast<size_t>(s.S) * stride, seed++, 1.5));
    const auto ck = cache(s, c.pos, seed++), cv = cache(s, c.pos, seed++);
    // CPU in double: the composition.
    std::vector<double> wq = to_d(qkv), wk = to_d(ck), wv = to_d(cv);
    if (r != nullptr)
      cpu::rope_kv_append<double>(wq.data(), stride, wk.data(), wv.data(), c.pos.data(), s, rope);
    else
      cpu::kv_append<double>(wk.data(), wv.data(), wq.data() + kc, wq.data() + vc, c.pos.data(), s,
                             stride, stride);
    std::vector<double> want(static_cast<size_t>(s.S) * s.NH * s.HS);
    cpu::decode_attention<double>(want.data(), wq.data(), wk.data(), wv.data(), c.pos.data(), s,
                                  stride);
    auto dpos = upload(c.pos);
    DeviceBuffer<char> scratch = attention_scratch(ctx(), s);
    std::vector<float> fused[2][3];  // run, (out, cache k, cache v)
    for (auto& run : fused) {
      auto a = up(qkv), ak = up(ck), av = up(cv), out = poison(want.size());
      rope_decode_attention(ctx(), dt(), out.data(), a.data(), stride, ak.data(), av.data(),
                            dpos.data(), s, r, scratch.data());
      run[0] = down(out), run[1] = down(ak), run[2] = down(av);
    }
    auto b = up(qkv), bk = up(ck), bv = up(cv), out = poison(want.size());
    if (r != nullptr)
      rope_kv_append(ctx(), dt(), b.data(), stride, bk.data(), bv.data(), dpos.data(), s, rope);
    else
      kv_append(ctx(), dt(), bk.data(), bv.data(), b.at(kc), b.at(vc), dpos.data(), s, stride,
                stride);
    decode_attention(ctx(), dt(), out.data(), b.data(), bk.data(), bv.data(), dpos.data(), s,
                     stride, scratch.data());
    EXPECT_TRUE(same_bits(fused[0][0], down(out))) << "out vs the unfused ops";
    EXPECT_TRUE(same_bits(fused[0][1], down(bk))) << "cache k vs the unfused ops";
    EXPECT_TRUE(same_bits(fused[0][2], down(bv))) << "cache v vs the unfused ops";
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(same_bits(fused[0][i], fused[1][i])) << "rerun " << i;
    // f32 1e-5 + 1e-4·|ref|, bf16 1e-2 + 2e-2·|ref|
    EXPECT_TRUE(all_close(fused[0][0], want, tol_for(dt()))) << "out vs CPU";
    // (Rows no slot sees stay NaN on both sides.)
    auto no_nan = [](auto v) {
      for (auto& x : v) x = std::isnan(x) ? 0 : x;
      return v;
    };
    EXPECT_TRUE(all_close(no_nan(fused[0][1]), no_nan(wk), tol_for(dt()))) << "cache k vs CPU";
  }
}

// The untuned kernel for the head sizes the flash-decoding kernel does not take (tiny models).
TEST_P(DecodeTest, GenericAttentionMatchesCpu) {
  for (int HS : {8, 16, 48, 64, 256})
    check_attention({3, 4, 2, HS, 70}, {69, 0, 33}, 0, 80 + HS, "generic head sizes", true);
  check_attention({2, 6, 2, 16, 4096}, {4000, 12}, 0, 81, "generic long", true);
  check_attention({2, 4, 2, 8, 6}, {40, 3}, 0, 82, "generic ring", true);
  check_attention({2, 4, 4, 8, 20}, {19, 7}, 3 * 32, 83, "generic strided q", true);
}

TEST_P(DecodeTest, AttentionLongContextTakesTheSplitPath) {
  const DecodeShape s{2, 6, 2, 64, 4096};
  ASSERT_GT(decode_attention_splits(s), 1);
  check_attention(s, {4000, 3977}, 0, 70, "long");
  const DecodeShape s128{2, 8, 2, 128, 4096};
  ASSERT_GT(decode_attention_splits(s128), 1);
  // Slot 1 has 30 rows: most of its splits are empty and must add nothing.
  check_attention(s128, {4095, 29}, 0, 71, "long HS=128, a short slot");
}

// decode_attention captured once; positions rewritten in device memory between replays.
TEST_P(DecodeTest, AttentionInAGraphReadsNewPositions) {
  const DecodeShape s{2, 9, 3, 64, 2048};
  ASSERT_GT(decode_attention_splits(s), 1);  // both kernels are in the graph
  const int64_t W = static_cast<int64_t>(s.NH) * s.HS;
  const auto q = as_dt(dt(), random_normal<float>(static_cast<size_t>(s.S) * W, 80, 1.5));
  const std::vector<int32_t> all(s.S, s.cap - 1);
  const auto ck = cache(s, all, 81), cv = cache(s, all, 82);  // every row valid
  auto dq = up(q), dk = up(ck), dv = up(cv), out = poison(q.size());
  std::vector<int32_t> pos = {100, 1500};
  auto dpos = upload(pos);
  DeviceBuffer<char> scratch = attention_scratch(ctx(), s);
  auto step = [&] {
    decode_attention(ctx(), dt(), out.data(), dq.data(), dk.data(), dv.data(), dpos.data(), s, 0,
                     scratch.data());
  };
  auto want = [&](const std::vector<int32_t>& p) {
    std::vector<double> r(q.size());
    const auto qd = to_d(q), ckd = to_d(ck), cvd = to_d(cv);
    cpu::decode_attention<double>(r.data(), qd.data(), ckd.data(), cvd.data(), p.data(), s);
    return r;
  };
  step();  // eager first, as Graph requires
  Graph g;
  g.capture(ctx(), step);
  for (const std::vector<int32_t>& p :
       {pos, std::vector<int32_t>{2047, 7}, std::vector<int32_t>{0, 1023}}) {
    FORGE_CUDA_CHECK(cudaMemcpyAsync(dpos.data(), p.data(), p.size() * sizeof(int32_t),
                                     cudaMemcpyHostToDevice, ctx().stream()));
    g.launch();
    EXPECT_TRUE(all_close(down(out), want(p), tol_for(dt()))) << "pos " << p[0] << ", " << p[1];
  }
}

// A whole decode step's cache traffic in one graph: kv_append of this step's k, v (rewritten in
// their device buffers before each replay), decode_attention, advance_positions; against the
// CPU running the same sequence. A ring of cap 48 is filled past its size (wraps).
TEST_P(DecodeTest, AppendAttendAdvanceGraphMatchesCpuSteps) {
  const DecodeShape s{3, 4, 2, 32, 48};
  const int steps = 70, limit = 1 << 20;
  const int64_t Q = static_cast<int64_t>(s.NH) * s.HS, W = static_cast<int64_t>(s.NKV) * s.HS;
  std::vector<int32_t> pos = {0, 5, 30};  // each slot starts at its own position
  const size_t nc = static_cast<size_t>(s.S) * s.cap * W;
  std::vector<double> ck(nc, 0.0), cv(nc, 0.0);
  auto dck = up(to_f(ck)), dcv = up(to_f(cv));
  auto dq = poison(s.S * Q), dk = poison(s.S * W), dv = poison(s.S * W), out = poison(s.S * Q);
  auto dpos = upload(pos);
  DeviceBuffer<char> scratch = attention_scratch(ctx(), s);
  auto step = [&] {
    kv_append(ctx(), dt(), dck.data(), dcv.data(), dk.data(), dv.data(), dpos.data(), s);
    decode_attention(ctx(), dt(), out.data(), dq.data(), dck.data(), dcv.data(), dpos.data(), s, 0,
                     scratch.data());
    advance_positions(ctx(), dpos.data(), s.S, limit);
  };
  Graph g;
  for (int t = 0; t < steps; ++t) {
    const auto q = as_dt(dt(), random_normal<float>(s.S * Q, 1000 + t, 1.5));
    const auto k = as_dt(dt(), random_normal<float>(s.S * W, 2000 + t));
    const auto v = as_dt(dt(), random_normal<float>(s.S * W, 3000 + t));
    auto put = [&](DevTensor& d, const std::vector<float>& h) {
      DevTensor src = up(h);
      FORGE_CUDA_CHECK(cudaMemcpyAsync(d.data(), src.data(), h.size() * dtype_size(dt()),
                                       cudaMemcpyDeviceToDevice, ctx().stream()));
      ctx().synchronize();
    };
    put(dq, q), put(dk, k), put(dv, v);
    if (t == 0) {
      step();  // eager, then captured for every later step
      g.capture(ctx(), step);
    } else {
      g.launch();
    }
    const auto qd = to_d(q), kd = to_d(k), vd = to_d(v);
    std::vector<double> want(s.S * Q);
    cpu::kv_append<double>(ck.data(), cv.data(), kd.data(), vd.data(), pos.data(), s);
    cpu::decode_attention<double>(want.data(), qd.data(), ck.data(), cv.data(), pos.data(), s);
    cpu::advance_positions(pos.data(), s.S, limit);
    ASSERT_TRUE(all_close(down(out), want, tol_for(dt()))) << "step " << t;
  }
  EXPECT_EQ(download(dpos), pos);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, DecodeTest,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(dt_name(info.param)); });

class DecodeOpsTest : public CudaTest {};

TEST_F(DecodeOpsTest, AdvancePositionsClamps) {
  std::vector<int32_t> pos = {0, 5, 9, 10, 12, 3};
  auto d = upload(pos);
  advance_positions(ctx(), d.data(), 5, 10);  // the sixth is past S: untouched
  cpu::advance_positions(pos.data(), 5, 10);
  EXPECT_EQ(download(d), pos);
  EXPECT_EQ(pos, (std::vector<int32_t>{1, 6, 10, 10, 10, 3}));
}

TEST_F(DecodeOpsTest, UnsupportedHeadSizeThrows) {
  const DecodeShape s{1, 4, 2, 48, 16};
  EXPECT_FALSE(decode_attention_supported(48));
  DeviceBuffer<float> buf(ctx().allocator(), 4096);
  DeviceBuffer<int32_t> pos(ctx().allocator(), 1);
  EXPECT_THROW(decode_attention(ctx(), DType::kF32, buf.data(), buf.data(), buf.data(), buf.data(),
                                pos.data(), s, 0, buf.data()),
               Error);
  EXPECT_THROW(decode_attention_splits({1, 6, 4, 64, 16}), Error);  // NH % NKV != 0
}

// Not a correctness test: times decode_attention (bf16) at full context on the shapes the
// header of decode.cu quotes and prints µs and the effective K+V read bandwidth. Run with
// --gtest_also_run_disabled_tests --gtest_filter='*DecodeAttentionThroughput*'.
TEST_F(DecodeOpsTest, DISABLED_DecodeAttentionThroughput) {
  struct Row {
    const char* name;
    DecodeShape s;
    int64_t q_stride;
  };
  const Row rows[] = {{"smollm2-135m", {1, 9, 3, 64, 8192}, 0},
                      {"smollm2-135m", {8, 9, 3, 64, 8192}, 0},
                      {"smollm2-135m", {32, 9, 3, 64, 8192}, 0},
                      {"smollm2-135m", {128, 9, 3, 64, 8192}, 0},
                      {"gpt2-124m", {1, 12, 12, 64, 1024}, 3 * 768},
                      {"gpt2-124m", {128, 12, 12, 64, 1024}, 3 * 768},
                      {"hs128 gqa4", {32, 32, 8, 128, 4096}, 0}};
  cudaEvent_t t0, t1;
  FORGE_CUDA_CHECK(cudaEventCreate(&t0));
  FORGE_CUDA_CHECK(cudaEventCreate(&t1));
  for (const Row& r : rows) {
    const DecodeShape& s = r.s;
    const size_t nc = static_cast<size_t>(s.S) * s.cap * s.NKV * s.HS;
    const int64_t qs = r.q_stride ? r.q_stride : static_cast<int64_t>(s.NH) * s.HS;
    DeviceBuffer<uint16_t> ck(ctx().allocator(), nc), cv(ctx().allocator(), nc);
    DeviceBuffer<uint16_t> q(ctx().allocator(), s.S * qs),
        out(ctx().allocator(), s.S * s.NH * s.HS);
    FORGE_CUDA_CHECK(cudaMemsetAsync(ck.data(), 0x3c, ck.bytes(), ctx().stream()));  // ~0.011
    FORGE_CUDA_CHECK(cudaMemsetAsync(cv.data(), 0x3f, cv.bytes(), ctx().stream()));  // ~0.75
    FORGE_CUDA_CHECK(cudaMemsetAsync(q.data(), 0x3f, q.bytes(), ctx().stream()));
    const auto pos = upload(std::vector<int32_t>(s.S, s.cap - 1));
    DeviceBuffer<char> scratch = attention_scratch(ctx(), s);
    auto call = [&] {
      decode_attention(ctx(), DType::kBF16, out.data(), q.data(), ck.data(), cv.data(), pos.data(),
                       s, r.q_stride, scratch.data());
    };
    for (int i = 0; i < 3; ++i) call();
    const int iters = 20;
    FORGE_CUDA_CHECK(cudaEventRecord(t0, ctx().stream()));
    for (int i = 0; i < iters; ++i) call();
    FORGE_CUDA_CHECK(cudaEventRecord(t1, ctx().stream()));
    FORGE_CUDA_CHECK(cudaEventSynchronize(t1));
    float ms = 0;
    FORGE_CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
    const double us = 1e3 * ms / iters, gbs = 2.0 * nc * 2 / (us * 1e-6) / 1e9;
    std::printf(
        "decode_attention bf16 %-13s S=%3d NH=%2d NKV=%2d HS=%3d n=%5d splits=%2d  %8.1f us  %6.0f "
        "GB/s\n",
        r.name, s.S, s.NH, s.NKV, s.HS, s.cap, decode_attention_splits(s), us, gbs);
  }
  FORGE_CUDA_CHECK(cudaEventDestroy(t0));
  FORGE_CUDA_CHECK(cudaEventDestroy(t1));
}

}  // namespace
}  // namespace forge::cuda
