// CUDA embedding against the CPU twin (backend/cpu/embedding.cpp), f32 and bf16. Shapes:
// B=3, T=37, C=201 (C not a multiple of 4 or 8: element-by-element path), C=200 (vector path,
// small) and B=8, T=512, C=768 (vector path, large). Small vocabularies make long segments of
// one token in the backward; a large one makes most segments a single position. Packed rows
// (per-token positions pos (B, T)): the same shapes with random layouts, positions restarting at
// random segment boundaries and so repeating within and across rows.
#include "forge/ops/embedding.h"

#include "forge/backend/cuda/ops.h"
#include "model/packed_layout.h"
#include "op_testing.h"

namespace forge::cuda {
namespace {

using namespace forge::cuda::testing;
using forge::testing::random_ids;

class EmbeddingTest : public DtypeTest<CudaTest> {};

struct Shape {
  int B, T, C, V;
};
const Shape kShapes[] = {{3, 37, 201, 13}, {3, 37, 200, 50257}, {8, 512, 768, 64}};

TEST_P(EmbeddingTest, FwdMatchesCpuWithAndWithoutPositions) {
  uint64_t seed = 1000;
  for (const Shape& s : kShapes)
    for (bool with_wpe : {true, false}) {
      const int BT = s.B * s.T;
      const auto tokens = random_ids(BT, s.V, seed++);
      const auto wte = as_dt(dt(), random_normal<float>(static_cast<size_t>(s.V) * s.C, seed++));
      const auto wpe = as_dt(dt(), random_normal<float>(static_cast<size_t>(s.T) * s.C, seed++));
      std::vector<float> ref(static_cast<size_t>(BT) * s.C);
      cpu::embedding_fwd<float>(ref.data(), tokens.data(), wte.data(),
                                with_wpe ? wpe.data() : nullptr, s.B, s.T, s.C);
      auto dtok = upload(tokens);
      auto dwte = up(wte), dwpe = up(wpe), dout = poison(ref.size());
      embedding_fwd(ctx(), dt(), dout.data(), dtok.data(), dwte.data(),
                    with_wpe ? dwpe.data() : nullptr, s.B, s.T, s.C);
      EXPECT_TRUE(all_close(down(dout), ref, tol_for(dt())))
          << "B=" << s.B << " T=" << s.T << " C=" << s.C << " wpe=" << with_wpe;
    }
}

// dwte/dwpe are pre-filled with random values (+=), and the backward runs twice from the same
// state: the results must be bit-identical (no atomics, fixed summation order).
TEST_P(EmbeddingTest, BwdMatchesCpuAndIsDeterministic) {
  uint64_t seed = 2000;
  for (const Shape& s : kShapes)
    for (bool with_wpe : {true, false}) {
      const int BT = s.B * s.T;
      const size_t nwte = static_cast<size_t>(s.V) * s.C, nwpe = static_cast<size_t>(s.T) * s.C;
      const auto tokens = random_ids(BT, s.V, seed++);
      const auto dout = as_dt(dt(), random_normal<float>(static_cast<size_t>(BT) * s.C, seed++));
      const auto dwte0 = random_normal<float>(nwte, seed++);
      const auto dwpe0 = random_normal<float>(nwpe, seed++);
      std::vector<float> ref_wte = dwte0, ref_wpe = dwpe0;
      cpu::embedding_bwd<float>(ref_wte.data(), with_wpe ? ref_wpe.data() : nullptr, dout.data(),
                                tokens.data(), s.B, s.T, s.C);
      auto dtok = upload(tokens);
      auto ddout = up(dout);
      std::vector<float> got_wte[2], got_wpe[2];
      for (int run = 0; run < 2; ++run) {
        auto dwte = upload(dwte0), dwpe = upload(dwpe0);
        embedding_bwd(ctx(), dt(), dwte.data(), with_wpe ? dwpe.data() : nullptr, ddout.data(),
                      dtok.data(), s.B, s.T, s.C);
        got_wte[run] = download(dwte);
        got_wpe[run] = download(dwpe);
      }
      const std::string where = "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) +
                                " C=" + std::to_string(s.C) + " V=" + std::to_string(s.V) +
                                " wpe=" + std::to_string(with_wpe);
      // dwte/dwpe are f32 in both modes: only the f32 summation order differs from the CPU's
      // double sums (up to ~1000 rows per token in the V=64 case).
      EXPECT_TRUE(all_close(got_wte[0], ref_wte, kTolWgrad)) << where;
      EXPECT_TRUE(all_close(got_wpe[0], ref_wpe, kTolWgrad)) << where;  // == dwpe0 without wpe
      EXPECT_TRUE(bit_identical(got_wte[0], got_wte[1])) << where;
      EXPECT_TRUE(bit_identical(got_wpe[0], got_wpe[1])) << where;
    }
}

// Every position holds the same token: one segment of B·T rows.
TEST_P(EmbeddingTest, BwdSingleHotTokenMatchesCpu) {
  const int B = 4, T = 300, C = 96, V = 10;
  const std::vector<int32_t> tokens(B * T, 7);
  const auto dout = as_dt(dt(), random_normal<float>(static_cast<size_t>(B) * T * C, 3000));
  const auto dwte0 = random_normal<float>(static_cast<size_t>(V) * C, 3001);
  std::vector<float> ref = dwte0;
  cpu::embedding_bwd<float>(ref.data(), nullptr, dout.data(), tokens.data(), B, T, C);
  auto dtok = upload(tokens);
  auto ddout = up(dout);
  auto dwte = upload(dwte0);
  embedding_bwd(ctx(), dt(), dwte.data(), nullptr, ddout.data(), dtok.data(), B, T, C);
  EXPECT_TRUE(all_close(download(dwte), ref, kTolWgrad));
}

// Packed rows: wpe row pos[b, t] in the forward; in the backward dwpe gathers at the same rows,
// many tokens per position (segments of 1 to 9 tokens: positions 0-8 only, a few hundred rows
// each in the large shape), deterministic. wte and wpe have T rows of positions (pos < T).
TEST_P(EmbeddingTest, PackedPositionsMatchCpuAndAreDeterministic) {
  uint64_t seed = 4000;
  for (const Shape& s : kShapes)
    for (bool with_wpe : {true, false}) {
      const int BT = s.B * s.T;
      const size_t nwte = static_cast<size_t>(s.V) * s.C, nwpe = static_cast<size_t>(s.T) * s.C;
      const auto tokens = random_ids(BT, s.V, seed++);
      const forge::testing::PackedLayout lay =
          forge::testing::random_packed_layout(s.B, s.T, 9, seed++);
      const auto wte = as_dt(dt(), random_normal<float>(nwte, seed++));
      const auto wpe = as_dt(dt(), random_normal<float>(nwpe, seed++));
      const auto dout = as_dt(dt(), random_normal<float>(static_cast<size_t>(BT) * s.C, seed++));
      const auto dwte0 = random_normal<float>(nwte, seed++);
      const auto dwpe0 = random_normal<float>(nwpe, seed++);
      const float* pe = with_wpe ? wpe.data() : nullptr;
      std::vector<float> ref(static_cast<size_t>(BT) * s.C), ref_wte = dwte0, ref_wpe = dwpe0;
      cpu::embedding_fwd<float>(ref.data(), tokens.data(), wte.data(), pe, s.B, s.T, s.C,
                                lay.pos.data());
      cpu::embedding_bwd<float>(ref_wte.data(), with_wpe ? ref_wpe.data() : nullptr, dout.data(),
                                tokens.data(), s.B, s.T, s.C, lay.pos.data());
      // Whether the positions matter at all here: the unpacked forward differs beyond tolerance.
      if (with_wpe) {
        std::vector<float> plain(ref.size());
        cpu::embedding_fwd<float>(plain.data(), tokens.data(), wte.data(), pe, s.B, s.T, s.C);
        EXPECT_FALSE(all_close(plain, ref, tol_for(dt())));
      }
      auto dtok = upload(tokens), dpos = upload(lay.pos);
      auto dwte = up(wte), dwpe = up(wpe), out = poison(ref.size()), ddout = up(dout);
      embedding_fwd(ctx(), dt(), out.data(), dtok.data(), dwte.data(),
                    with_wpe ? dwpe.data() : nullptr, s.B, s.T, s.C, dpos.data());
      const std::string where = "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) +
                                " C=" + std::to_string(s.C) + " V=" + std::to_string(s.V) +
                                " wpe=" + std::to_string(with_wpe);
      // The forward adds two dt values in f32 and rounds once: the dtype's tolerance.
      EXPECT_TRUE(all_close(down(out), ref, tol_for(dt()))) << where;
      std::vector<float> got_wte[2], got_wpe[2];
      for (int run = 0; run < 2; ++run) {
        auto gwte = upload(dwte0), gwpe = upload(dwpe0);
        embedding_bwd(ctx(), dt(), gwte.data(), with_wpe ? gwpe.data() : nullptr, ddout.data(),
                      dtok.data(), s.B, s.T, s.C, dpos.data());
        got_wte[run] = download(gwte);
        got_wpe[run] = download(gwpe);
      }
      // f32 gradients: only the summation order differs from the CPU's (as in the unpacked test).
      EXPECT_TRUE(all_close(got_wte[0], ref_wte, kTolWgrad)) << where;
      EXPECT_TRUE(all_close(got_wpe[0], ref_wpe, kTolWgrad)) << where;
      EXPECT_TRUE(bit_identical(got_wte[0], got_wte[1])) << where;
      EXPECT_TRUE(bit_identical(got_wpe[0], got_wpe[1])) << where;
    }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, EmbeddingTest,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(dt_name(info.param)); });

}  // namespace
}  // namespace forge::cuda
