// Multi-tensor AdamW (cuda::adamw_update_multi, one launch over every tensor of the flat
// buffers) against the per-tensor launches of cuda::adamw_update, which adamw_test.cpp checks
// against the CPU twin: the two must give the same bits in param, m, v and the working copy.
// The table mixes sizes 1 to 100,003 (several chunks), empty tensors, offsets off every 4-element
// boundary and both decay flags; steps with clipping active, stochastic rounding of the bf16 copy,
// f16 loss scaling with an overflow (nothing written) and a guard-skipped step. The chunking
// itself (host code) is checked without a GPU.
#include <algorithm>
#include <cmath>

#include "forge/backend/cuda/ops.h"
#include "op_testing.h"

namespace forge::cuda {
namespace {

using namespace forge::cuda::testing;

// Tensors laid end to end from offset `start`, so most begin off a 4-element boundary.
std::vector<AdamWTensor> table(int64_t start) {
  const int64_t sizes[] = {1, 3, 768, 0, 5, 100003, 2, 65543, 4, 1000, 7, 32768, 32769};
  std::vector<AdamWTensor> t;
  int64_t off = start;
  bool decay = true;
  for (int64_t n : sizes) {
    t.push_back({off, n, decay});
    off += n;
    decay = !decay;
  }
  return t;
}

int64_t total(const std::vector<AdamWTensor>& t) {
  return t.back().offset + t.back().n;
}

// Every element of every tensor in exactly one chunk, in order; within a chunk the one-by-one
// head is under 4 elements and ends on a 4-element boundary of the flat buffers; at most `chunk`
// elements after it.
TEST(AdamWChunks, CoverEveryElementOnceOnBoundaries) {
  for (int64_t start : {0, 1, 2, 3})
    for (int64_t chunk : {int64_t{4}, int64_t{1024}, int64_t{1} << 15}) {
      const std::vector<AdamWTensor> t = table(start);
      const std::vector<AdamWChunk> c = adamw_chunks(t, chunk);
      size_t k = 0;
      for (const AdamWTensor& x : t) {
        int64_t next = 0;  // the tensor's next element a chunk must start at
        while (next < x.n) {
          ASSERT_LT(k, c.size());
          const AdamWChunk& ch = c[k++];
          EXPECT_EQ(ch.offset, x.offset);
          EXPECT_EQ(ch.decay, x.decay ? 1 : 0);
          EXPECT_EQ(ch.begin, next);
          EXPECT_LE(ch.begin, ch.aligned);
          EXPECT_LE(ch.aligned, ch.end);
          EXPECT_LT(ch.aligned - ch.begin, 4);
          EXPECT_LE(ch.end - ch.aligned, chunk);
          EXPECT_LE(ch.end, x.n);
          if (ch.aligned < ch.end) EXPECT_EQ((ch.offset + ch.aligned) % 4, 0);
          // The head is as short as it can be: the element before `aligned` is off the boundary.
          if (ch.aligned > ch.begin) EXPECT_NE((ch.offset + ch.aligned - 1) % 4, 0);
          EXPECT_GT(ch.end, ch.begin);
          next = ch.end;
        }
      }
      EXPECT_EQ(k, c.size()) << "chunks beyond the tensors";
    }
  EXPECT_TRUE(adamw_chunks({{5, 0, true}}).empty());
}

class AdamWMultiTest : public CudaTest {
 protected:
  struct State {
    DeviceBuffer<float> param, m, v, grad;
    DeviceBuffer<uint16_t> w16;
    DeviceBuffer<float> w32;
  };
  State make(int64_t n, uint64_t seed) {
    std::vector<float> v = random_normal<float>(n, seed + 2);
    for (float& x : v) x = x * x;
    State s{upload(random_normal<float>(n, seed)),
            upload(random_normal<float>(n, seed + 1)),
            upload(v),
            upload(random_normal<float>(n, seed + 3)),
            poisoned<uint16_t>(n),
            poisoned<float>(n)};
    return s;
  }
  static void* work(State& s, DType dt) {
    if (dt == DType::kI32) return nullptr;  // no working copy
    return dt == DType::kF32 ? static_cast<void*>(s.w32.data()) : static_cast<void*>(s.w16.data());
  }
  void expect_same(State& a, State& b, const std::string& where) {
    EXPECT_TRUE(same_bits(download(a.param), download(b.param))) << "param " << where;
    EXPECT_TRUE(same_bits(download(a.m), download(b.m))) << "m " << where;
    EXPECT_TRUE(same_bits(download(a.v), download(b.v))) << "v " << where;
    EXPECT_EQ(download(a.w16), download(b.w16)) << "16-bit work " << where;
    EXPECT_TRUE(same_bits(download(a.w32), download(b.w32))) << "f32 work " << where;
  }
};

// Two steps each way (clip active, then inactive), every working-copy dtype, the bf16 copy also
// with stochastic rounding; flat buffers at a 16-byte boundary (the vector path) and one element
// past it (the element-by-element path). The multi-tensor call sees the buffers from the shifted
// base, the per-tensor calls each tensor at shift + offset with sr_offset = offset.
TEST_F(AdamWMultiTest, EqualsPerTensorLaunchesBitForBit) {
  for (int64_t shift : {0, 1})
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32})
      for (uint64_t sr_seed : {uint64_t{0}, uint64_t{0x5eed}}) {
        if (sr_seed != 0 && dt != DType::kBF16) continue;
        const std::vector<AdamWTensor> t = table(0);
        const int64_t n = total(t) + shift;
        State a = make(n, 900), b = make(n, 900);
        const std::vector<AdamWChunk> chunks = adamw_chunks(t);
        auto dchunks = upload(chunks);
        AdamWParams p;
        p.lr = 1e-3f, p.weight_decay = 0.1f, p.grad_scale = 0.5f;
        for (int step = 1; step <= 2; ++step) {
          p.step = step;
          AdamWParams nd = p;
          nd.weight_decay = 0.0f;
          auto f = upload(
              std::vector<AdamWFactors>{adamw_factors(p, sr_seed), adamw_factors(nd, sr_seed)});
          auto sq = upload(std::vector<float>{step == 1 ? 1e4f : 0.25f});
          auto at = [&](State& s, DType d, int64_t off) {
            void* w = work(s, d);
            if (w == nullptr) return w;
            return d == DType::kF32 ? static_cast<void*>(static_cast<float*>(w) + off)
                                    : static_cast<void*>(static_cast<uint16_t*>(w) + off);
          };
          for (const AdamWTensor& x : t) {
            if (x.n == 0) continue;
            const int64_t o = shift + x.offset;
            adamw_update(ctx(), a.param.data() + o, a.m.data() + o, a.v.data() + o,
                         a.grad.data() + o, at(a, dt, o), dt, x.n, f.data() + (x.decay ? 0 : 1),
                         static_cast<uint64_t>(x.offset), sq.data(), 1.0f);
          }
          adamw_update_multi(ctx(), dchunks.data(), static_cast<int>(chunks.size()),
                             b.param.data() + shift, b.m.data() + shift, b.v.data() + shift,
                             b.grad.data() + shift, at(b, dt, shift), dt, f.data(), sq.data(),
                             1.0f);
        }
        expect_same(a, b,
                    std::string(dt == DType::kI32 ? "none" : dtype_name(dt)) +
                        " shift=" + std::to_string(shift) + " sr=" + std::to_string(sr_seed));
      }
}

// f16 loss scaling: a finite step unscales before clipping exactly as the per-tensor launches
// do; an overflowed Σ g² (inf) and a guard-skipped step write nothing.
TEST_F(AdamWMultiTest, LossScaleAndGuardAsPerTensor) {
  const std::vector<AdamWTensor> t = table(1);
  const int64_t n = total(t);
  const std::vector<AdamWChunk> chunks = adamw_chunks(t);
  auto dchunks = upload(chunks);
  AdamWParams p;
  p.lr = 1e-3f, p.weight_decay = 0.1f, p.step = 3;
  AdamWParams nd = p;
  nd.weight_decay = 0.0f;
  auto f = upload(std::vector<AdamWFactors>{adamw_factors(p), adamw_factors(nd)});
  LossScaleState ls = loss_scale_init({1024.0f, 2000});
  ls.skipped_total = 1;  // Adam's t after a skipped step
  for (float sq_value : {4e6f, INFINITY})
    for (int skipped : {0, 1}) {
      State a = make(n, 950), b = make(n, 950);
      const std::vector<float> param0 = download(a.param);
      auto sq = upload(std::vector<float>{sq_value});
      auto dls = upload(std::vector<LossScaleState>{ls});
      StepGuardState g{};
      g.skipped = skipped;
      auto dguard = upload(std::vector<StepGuardState>{g});
      for (const AdamWTensor& x : t) {
        if (x.n == 0) continue;
        adamw_update(ctx(), a.param.data() + x.offset, a.m.data() + x.offset, a.v.data() + x.offset,
                     a.grad.data() + x.offset, a.w16.data() + x.offset, DType::kF16, x.n,
                     f.data() + (x.decay ? 0 : 1), static_cast<uint64_t>(x.offset), sq.data(), 1.0f,
                     dls.data(), dguard.data());
      }
      adamw_update_multi(ctx(), dchunks.data(), static_cast<int>(chunks.size()), b.param.data(),
                         b.m.data(), b.v.data(), b.grad.data(), b.w16.data(), DType::kF16, f.data(),
                         sq.data(), 1.0f, dls.data(), dguard.data());
      const std::string where =
          "sq=" + std::to_string(sq_value) + " skipped=" + std::to_string(skipped);
      expect_same(a, b, where);
      const bool untouched = skipped == 1 || !std::isfinite(sq_value);
      EXPECT_EQ(bit_identical(download(b.param), param0), untouched) << where;
    }
}

}  // namespace
}  // namespace forge::cuda
