#include "forge/ops/embedding.h"

#include <omp.h>

#include "testing.h"

namespace forge::cpu {
namespace {

using forge::testing::all_close;
using forge::testing::dot;
using forge::testing::finite_diff;
using forge::testing::kTolF32;
using forge::testing::kTolF64;
using forge::testing::kTolFiniteDiff;
using forge::testing::random_ids;
using forge::testing::random_normal;
using forge::testing::to_double;

// B = 2, T = 3, V = 4: ids 0 and V−1 present, id 2 three times (across both sequences and at
// two positions), id 1 absent so its dwte row must stay zero.
const std::vector<int32_t> kTokens = {2, 0, 3, 2, 2, 0};
constexpr int kB = 2, kT = 3, kV = 4, kC = 5, kMaxT = 4;

// GPT-2 style (wpe present) and Llama style (wpe null).
TEST(Embedding, BackwardMatchesFiniteDifferences) {
  uint64_t seed = 200;
  for (bool has_wpe : {true, false}) {
    auto wte = random_normal<double>(kV * kC, seed++);
    auto wpe = random_normal<double>(kMaxT * kC, seed++);
    const auto w = random_normal<double>(kB * kT * kC, seed++);
    const double* wpe_ptr = has_wpe ? wpe.data() : nullptr;
    auto loss = [&] {
      std::vector<double> out(kB * kT * kC);
      embedding_fwd<double>(out.data(), kTokens.data(), wte.data(), wpe_ptr, kB, kT, kC);
      return dot(out, w);
    };
    std::vector<double> dwte(kV * kC, 0.0), dwpe(kMaxT * kC, 0.0);
    embedding_bwd<double>(dwte.data(), has_wpe ? dwpe.data() : nullptr, w.data(), kTokens.data(),
                          kB, kT, kC);
    EXPECT_TRUE(all_close(dwte, finite_diff(wte, loss), kTolFiniteDiff)) << "wpe=" << has_wpe;
    if (has_wpe) {
      // Rows t >= T of dwpe get no gradient; finite differences agree (they are zero there).
      EXPECT_TRUE(all_close(dwpe, finite_diff(wpe, loss), kTolFiniteDiff));
    }
  }
}

TEST(Embedding, HandComputedRowsAndAccumulation) {
  // wte[v, c] = 10·v + c, wpe[t, c] = 100·t: out[b, t, c] = 10·tokens[b, t] + c + 100·t.
  std::vector<double> wte(kV * kC), wpe(kMaxT * kC);
  for (int v = 0; v < kV; ++v)
    for (int c = 0; c < kC; ++c) wte[v * kC + c] = 10 * v + c;
  for (int t = 0; t < kMaxT; ++t)
    for (int c = 0; c < kC; ++c) wpe[t * kC + c] = 100 * t;
  std::vector<double> out(kB * kT * kC), out_llama(kB * kT * kC);
  embedding_fwd<double>(out.data(), kTokens.data(), wte.data(), wpe.data(), kB, kT, kC);
  embedding_fwd<double>(out_llama.data(), kTokens.data(), wte.data(), nullptr, kB, kT, kC);
  for (int b = 0; b < kB; ++b)
    for (int t = 0; t < kT; ++t)
      for (int c = 0; c < kC; ++c) {
        const int i = (b * kT + t) * kC + c;
        EXPECT_EQ(out[i], 10 * kTokens[b * kT + t] + c + 100 * t) << b << " " << t << " " << c;
        EXPECT_EQ(out_llama[i], 10 * kTokens[b * kT + t] + c) << b << " " << t << " " << c;
      }

  // dout[b, t, c] = 1 + b·T + t (one value per position). Pre-filled gradients: bwd adds.
  std::vector<double> dout(kB * kT * kC);
  for (int bt = 0; bt < kB * kT; ++bt)
    for (int c = 0; c < kC; ++c) dout[bt * kC + c] = 1 + bt;
  const auto dwte_pre = random_normal<double>(kV * kC, 300);
  const auto dwpe_pre = random_normal<double>(kMaxT * kC, 301);
  auto dwte = dwte_pre, dwpe = dwpe_pre;
  embedding_bwd<double>(dwte.data(), dwpe.data(), dout.data(), kTokens.data(), kB, kT, kC);
  // Tokens {2, 0, 3 | 2, 2, 0} at positions bt = 0..5 carry dout 1..6:
  // id 0: 2 + 6 = 8; id 1: 0; id 2: 1 + 4 + 5 = 10; id 3: 3.
  const double dwte_row[kV] = {8, 0, 10, 3};
  // wpe row t sums over the batch: t=0: 1 + 4, t=1: 2 + 5, t=2: 3 + 6, t=3: 0.
  const double dwpe_row[kMaxT] = {5, 7, 9, 0};
  for (int c = 0; c < kC; ++c) {
    for (int v = 0; v < kV; ++v)
      EXPECT_DOUBLE_EQ(dwte[v * kC + c] - dwte_pre[v * kC + c], dwte_row[v]) << v << " " << c;
    for (int t = 0; t < kMaxT; ++t)
      EXPECT_DOUBLE_EQ(dwpe[t * kC + c] - dwpe_pre[t * kC + c], dwpe_row[t]) << t << " " << c;
  }
}

// Float against double on a larger batch with many repeats (V = 7 for 8·33 tokens).
TEST(Embedding, FloatMatchesDouble) {
  const int B = 8, T = 33, V = 7, C = 70;
  auto tokens = random_ids(B * T, V, 400);
  tokens[0] = 0;
  tokens[B * T - 1] = V - 1;
  const auto wte = random_normal<float>(V * C, 401);
  const auto wpe = random_normal<float>(T * C, 402);
  const auto dout = random_normal<float>(B * T * C, 403);
  const auto wte_d = to_double(wte), wpe_d = to_double(wpe), dout_d = to_double(dout);

  std::vector<float> out(B * T * C);
  std::vector<double> out_d(B * T * C);
  embedding_fwd<float>(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
  embedding_fwd<double>(out_d.data(), tokens.data(), wte_d.data(), wpe_d.data(), B, T, C);
  EXPECT_TRUE(all_close(out, out_d, kTolF32));

  std::vector<float> dwte(V * C, 0.f), dwpe(T * C, 0.f);
  std::vector<double> dwte_d(V * C, 0.0), dwpe_d(T * C, 0.0);
  embedding_bwd<float>(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C);
  embedding_bwd<double>(dwte_d.data(), dwpe_d.data(), dout_d.data(), tokens.data(), B, T, C);
  EXPECT_TRUE(all_close(dwte, dwte_d, kTolF32));
  EXPECT_TRUE(all_close(dwpe, dwpe_d, kTolF32));

  // The double backward against the plain scatter loop, summed in the same (b, t) order.
  std::vector<double> dwte_ref(V * C, 0.0);
  for (int bt = 0; bt < B * T; ++bt)
    for (int c = 0; c < C; ++c) dwte_ref[tokens[bt] * C + c] += dout_d[bt * C + c];
  EXPECT_TRUE(all_close(dwte_d, dwte_ref, kTolF64));
}

// Bit-identical gradients for any thread count (no atomics, fixed summation order).
TEST(Embedding, BackwardIndependentOfThreadCount) {
  const int B = 4, T = 64, V = 50, C = 96;
  const auto tokens = random_ids(B * T, V, 410);
  const auto dout = random_normal<float>(B * T * C, 411);
  const int saved = omp_get_max_threads();
  std::vector<float> dwte1(V * C, 0.f), dwpe1(T * C, 0.f), dwte3(V * C, 0.f), dwpe3(T * C, 0.f);
  omp_set_num_threads(1);
  embedding_bwd<float>(dwte1.data(), dwpe1.data(), dout.data(), tokens.data(), B, T, C);
  omp_set_num_threads(3);
  embedding_bwd<float>(dwte3.data(), dwpe3.data(), dout.data(), tokens.data(), B, T, C);
  omp_set_num_threads(saved);
  EXPECT_EQ(dwte1, dwte3);
  EXPECT_EQ(dwpe1, dwpe3);
}

}  // namespace
}  // namespace forge::cpu
