// CUDA row sampler (backend/cuda/sample.cu) against the CPU twin (backend/cpu/sample.cpp), in
// f32, bf16 and f16: the CPU gets the dt-rounded logits as floats, the GPU the dt values.
//
// Agreement criterion: every id equal, and the seen flags equal — no tolerance. Both twins run
// the same IEEE-exact f32 operations (ops/sample_math.h), their own log and exp, and integer
// top-p sums, so there is no "two scores within rounding" case left to excuse; a mismatch is a
// bug. The Gumbel noise itself is compared bit for bit first, so a failure says which half broke.
#include "forge/backend/cuda/sample.h"

#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "forge/backend/cuda/graph.h"
#include "forge/core/error.h"
#include "forge/core/rng.h"
#include "forge/ops/sample.h"
#include "forge/ops/sample_math.h"
#include "op_testing.h"

namespace forge::cuda {
namespace {

using namespace forge::cuda::testing;

struct Mode {
  const char* name;
  SamplerSettings st;
  bool penalty;  // pass seen flags (5% set)
};

SamplerSettings make(float temperature, int top_k = 0, float top_p = 1.0f, float min_p = 0.0f,
                     float rp = 1.0f) {
  SamplerSettings s;
  s.temperature = temperature, s.top_k = top_k, s.top_p = top_p, s.min_p = min_p,
  s.repetition_penalty = rp;
  return s;
}

const Mode kModes[] = {
    {"greedy", make(0.0f), false},
    {"temperature", make(0.8f), false},
    {"top_k", make(1.0f, 50), false},
    {"top_p", make(1.0f, 0, 0.9f), false},
    {"min_p", make(1.0f, 0, 1.0f, 0.05f), false},
    {"greedy_penalty", make(0.0f, 0, 1.0f, 0.0f, 1.3f), true},
    {"sampled_penalty", make(0.7f, 40, 0.95f, 0.0f, 1.2f), true},
    {"mixed", make(1.0f), true},  // per row: settings from kMixed below
};

// Row s of the "mixed" mode cycles through these (each with its own seed).
const SamplerSettings kMixed[] = {
    make(0.0f),
    make(1.0f, 1),
    make(0.05f),
    make(1.5f, 0, 0.1f),
    make(1.0f, 7, 0.5f),
    make(0.9f, 0, 0.8f, 0.1f),
    make(1.0f, 0, 1.0f, 0.0f, 0.8f),
    make(2.0f, 1000, 0.99f, 0.01f, 1.1f),
};

std::vector<SamplerSettings> settings_for(const Mode& mode, int S, uint64_t seed0) {
  std::vector<SamplerSettings> st(S);
  for (int s = 0; s < S; ++s) {
    st[s] = std::string(mode.name) == "mixed" ? kMixed[s % 8] : mode.st;
    st[s].seed = seed0 + 7919ull * s + (static_cast<uint64_t>(s % 3) << 32);
  }
  return st;
}

// Logits (S, Vp) in dt's values: normal, row s scaled by 1 + s % 4 (flat to peaked rows); the
// padding columns hold a huge value that must never win.
std::vector<float> make_logits(DType dt, int S, int V, int Vp, uint64_t seed) {
  std::vector<float> l = random_normal<float>(static_cast<size_t>(S) * Vp, seed);
  for (int s = 0; s < S; ++s)
    for (int i = 0; i < Vp; ++i) {
      float& x = l[static_cast<size_t>(s) * Vp + i];
      x = i < V ? x * static_cast<float>(1 + s % 4) : 6e4f;
    }
  return as_dt(dt, l);
}

std::vector<uint8_t> make_seen(int S, int V, uint64_t seed) {
  Rng rng(seed, 3);
  std::vector<uint8_t> seen(static_cast<size_t>(S) * V);
  for (auto& f : seen) f = rng.below(20) == 0;
  return seen;
}

class SampleCudaTest : public DtypeTest<CudaTest> {
 protected:
  struct Result {
    std::vector<int32_t> ids;
    std::vector<uint8_t> seen;
  };
  Result run_gpu(const std::vector<float>& logits, const std::vector<SamplerSettings>& st,
                 const std::vector<uint8_t>* seen, const std::vector<int32_t>& pos, int S, int V,
                 int Vp) {
    DevTensor dl = up(logits);
    auto dst = upload(st);
    auto dpos = upload(pos);
    auto dout = poisoned<int32_t>(S);
    DeviceBuffer<uint8_t> dseen;
    if (seen) dseen = upload(*seen);
    sample_rows(ctx(), dt(), dout.data(), dl.data(), dst.data(), seen ? dseen.data() : nullptr,
                dpos.data(), S, V, Vp);
    return {download(dout), seen ? download(dseen) : std::vector<uint8_t>{}};
  }
};

// The Gumbel noise of 2^20 ids at a few (seed, position) pairs, bit for bit.
TEST_P(SampleCudaTest, NoiseEqualsCpuBitForBit) {
  if (dt() != DType::kF32) GTEST_SKIP() << "dtype-independent";
  const int n = 1 << 20;
  const std::pair<uint64_t, int32_t> keys[] = {{0, 0}, {42, 7}, {0xdeadbeefcafeull, 123456}};
  for (auto [seed, p] : keys) {
    auto dg = poisoned<float>(n);
    sample_gumbel_noise(ctx(), dg.data(), seed, p, n);
    const std::vector<float> got = download(dg);
    std::vector<float> want(n);
    for (int q = 0; q < n / 4; ++q) {
      const PhiloxCounter w =
          philox4x32_10({static_cast<uint32_t>(q), static_cast<uint32_t>(p), 0, kSampleStream},
                        {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
      for (int j = 0; j < 4; ++j) want[4 * q + j] = sampling::gumbel(w[j]);
    }
    EXPECT_TRUE(same_bits(got, want)) << "seed " << seed << " pos " << p;
  }
}

TEST_P(SampleCudaTest, ChoosesTheSameIdsAsTheCpuTwin) {
  struct Shape {
    int V, Vp;
  };
  // GPT-2's vocabulary padded to 64, Qwen's, and an odd width (no 16-byte loads).
  const Shape shapes[] = {{50257, 50304}, {151936, 151936}, {1000, 1001}};
  uint64_t seed = 500;
  int checked = 0;
  for (const Shape& sh : shapes) {
    const int Smax = 64;
    const std::vector<float> logits = make_logits(dt(), Smax, sh.V, sh.Vp, seed++);
    const std::vector<uint8_t> seen0 = make_seen(Smax, sh.V, seed++);
    for (int S : {1, 7, 64})
      for (const Mode& mode : kModes) {
        const std::vector<SamplerSettings> st = settings_for(mode, S, seed++);
        std::vector<int32_t> pos(S);
        for (int s = 0; s < S; ++s) pos[s] = 17 + 131 * s + static_cast<int32_t>(seed % 1000);
        const std::vector<float> rows(logits.begin(),
                                      logits.begin() + static_cast<size_t>(S) * sh.Vp);
        std::vector<uint8_t> seen(seen0.begin(), seen0.begin() + static_cast<size_t>(S) * sh.V);
        const Result gpu = run_gpu(rows, st, mode.penalty ? &seen : nullptr, pos, S, sh.V, sh.Vp);
        std::vector<int32_t> want(S, -1);
        cpu::sample_rows<float>(want.data(), rows.data(), st.data(),
                                mode.penalty ? seen.data() : nullptr, pos.data(), S, sh.V, sh.Vp);
        int bad = 0;
        std::string first;
        for (int s = 0; s < S; ++s)
          if (gpu.ids[s] != want[s] && bad++ < 5)
            first += " [row " + std::to_string(s) + ": gpu " + std::to_string(gpu.ids[s]) +
                     " cpu " + std::to_string(want[s]) + "]";
        EXPECT_EQ(bad, 0) << mode.name << " V=" << sh.V << " Vp=" << sh.Vp << " S=" << S << ":"
                          << first;
        if (mode.penalty) {
          EXPECT_TRUE(gpu.seen == seen)
              << mode.name << " seen flags differ, V=" << sh.V << " S=" << S;
        }
        checked += S;
      }
  }
  std::printf("%s: %d rows compared\n", dt_name(dt()), checked);
}

// Random settings per row (edges included: top_p = 0, top_k = V − 1, min_p = 1, temperatures
// from 1e-3 to 100, penalties on both sides of 1) on awkward rows: values on a coarse grid (many
// ties), NaN, ±inf and ±1e30 entries. Same criterion: every id equal.
TEST_P(SampleCudaTest, RandomSettingsOnAwkwardRowsMatchTheCpuTwin) {
  struct Shape {
    int V, Vp;
  };
  const Shape shapes[] = {{3001, 3008}, {1, 1}, {70000, 70001}};
  int bad = 0, rows_checked = 0;
  std::string first;
  for (int trial = 0; trial < 12; ++trial) {
    const Shape sh = shapes[trial % 3];
    const int S = 64;
    Rng rng(trial, 17);
    std::vector<float> logits =
        random_normal<float>(static_cast<size_t>(S) * sh.Vp, 1200 + trial, 3.0);
    for (int s = 0; s < S; ++s) {
      float* row = logits.data() + static_cast<size_t>(s) * sh.Vp;
      const int kind = static_cast<int>(rng.below(6));
      for (int i = 0; i < sh.V; ++i) {
        if (kind == 1) row[i] = std::round(row[i] * 2.0f) / 2.0f;  // ties everywhere
        if (kind == 2 && rng.below(50) == 0) row[i] = std::nanf("");
        if (kind == 3 && rng.below(40) == 0) row[i] = rng.below(2) ? -sampling::kInf : -1e30f;
        if (kind == 4 && rng.below(500) == 0) row[i] = rng.below(2) ? sampling::kInf : 1e30f;
      }
    }
    logits = as_dt(dt(), logits);
    std::vector<SamplerSettings> st(S);
    for (int s = 0; s < S; ++s) {
      SamplerSettings& x = st[s];
      const float temps[] = {0.0f, 1e-3f, 0.3f, 1.0f, 1.0f, 2.5f, 100.0f};
      x.temperature = temps[rng.below(7)];
      x.top_k = rng.below(3) == 0 ? static_cast<int>(rng.below(sh.V + 2))
                                  : (rng.below(5) == 0 ? sh.V - 1 : 0);
      const float ps[] = {1.0f, 1.0f, 0.0f, 0.05f, 0.5f, 0.9f, 0.999f};
      x.top_p = ps[rng.below(7)];
      const float mins[] = {0.0f, 0.0f, 0.01f, 0.3f, 1.0f};
      x.min_p = mins[rng.below(5)];
      const float rps[] = {1.0f, 1.0f, 0.5f, 1.3f, 2.0f};
      x.repetition_penalty = rps[rng.below(5)];
      x.seed = rng.next_u32() | static_cast<uint64_t>(rng.next_u32()) << 32;
    }
    std::vector<int32_t> pos(S);
    for (auto& p : pos) p = static_cast<int32_t>(rng.below(1 << 30));
    std::vector<uint8_t> seen = make_seen(S, sh.V, 1300 + trial);
    const Result gpu = run_gpu(logits, st, &seen, pos, S, sh.V, sh.Vp);
    std::vector<int32_t> want(S);
    cpu::sample_rows<float>(want.data(), logits.data(), st.data(), seen.data(), pos.data(), S, sh.V,
                            sh.Vp);
    for (int s = 0; s < S; ++s)
      if (gpu.ids[s] != want[s] && bad++ < 5)
        first += " [trial " + std::to_string(trial) + " row " + std::to_string(s) + ": gpu " +
                 std::to_string(gpu.ids[s]) + " cpu " + std::to_string(want[s]) + "]";
    EXPECT_TRUE(gpu.seen == seen) << "seen flags differ, trial " << trial;
    rows_checked += S;
  }
  EXPECT_EQ(bad, 0) << "of " << rows_checked << " rows:" << first;
}

// The decode loop as the model will run it: one captured sample_rows, replayed with new
// positions and settings written to device memory between replays; the seen flags carry over.
TEST_P(SampleCudaTest, GraphReplaysPickUpNewPositionsAndSettings) {
  const int S = 7, V = 50257, Vp = 50304;
  const std::vector<float> logits = make_logits(dt(), S, V, Vp, 900);
  std::vector<uint8_t> seen(static_cast<size_t>(S) * V, 0);
  DevTensor dl = up(logits);
  DeviceBuffer<SamplerSettings> dst(ctx().allocator(), S);
  DeviceBuffer<int32_t> dpos(ctx().allocator(), S);
  auto dout = poisoned<int32_t>(S);
  auto dseen = upload(seen);
  auto step = [&] {
    sample_rows(ctx(), dt(), dout.data(), dl.data(), dst.data(), dseen.data(), dpos.data(), S, V,
                Vp);
  };
  Graph g;
  for (int t = 0; t < 5; ++t) {
    std::vector<SamplerSettings> st = settings_for(kModes[t % 2 ? 7 : 6], S, 1000 + t);
    for (auto& x : st) x.repetition_penalty = 1.5f;  // the carried flags matter
    std::vector<int32_t> pos(S);
    for (int s = 0; s < S; ++s) pos[s] = 100 * t + s;
    FORGE_CUDA_CHECK(cudaMemcpyAsync(dst.data(), st.data(), S * sizeof(SamplerSettings),
                                     cudaMemcpyHostToDevice, ctx().stream()));
    FORGE_CUDA_CHECK(cudaMemcpyAsync(dpos.data(), pos.data(), S * sizeof(int32_t),
                                     cudaMemcpyHostToDevice, ctx().stream()));
    ctx().synchronize();  // pageable sources: the copies have landed before the next write
    if (t == 0) {
      step();  // eager warm-up, as graph.h asks
    } else {
      if (g.empty()) g.capture(ctx(), step);
      g.launch();
    }
    std::vector<int32_t> want(S);
    cpu::sample_rows<float>(want.data(), logits.data(), st.data(), seen.data(), pos.data(), S, V,
                            Vp);
    EXPECT_EQ(download(dout), want) << "step " << t;
    EXPECT_TRUE(download(dseen) == seen) << "step " << t;
  }
}

TEST_P(SampleCudaTest, RejectsBadShapes) {
  if (dt() != DType::kF32) GTEST_SKIP() << "dtype-independent";
  auto d = poisoned<float>(16);
  auto out = poisoned<int32_t>(1);
  EXPECT_THROW(sample_rows(ctx(), dt(), out.data(), d.data(), nullptr, nullptr, nullptr, 1, 17, 16),
               Error);
  EXPECT_THROW(sample_rows(ctx(), dt(), out.data(), d.data(), nullptr, nullptr, nullptr, -1, 8, 16),
               Error);
  EXPECT_THROW(sample_rows(ctx(), dt(), out.data(), d.data(), nullptr, nullptr, nullptr, 1, 0, 16),
               Error);
  sample_rows(ctx(), dt(), out.data(), d.data(), nullptr, nullptr, nullptr, 0, 8,
              16);  // S = 0: nothing
}

INSTANTIATE_TEST_SUITE_P(Sample, SampleCudaTest,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(dt_name(info.param)); });

}  // namespace
}  // namespace forge::cuda
