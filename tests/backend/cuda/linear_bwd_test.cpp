// CudaBackend::linear_bwd with a bias against the CPU backend's twin in double: two micro-batches
// into nonzero dW and dbias, so that both accumulate (+=) across calls (the bias gradient is
// bias_grad's channel pass; cuBLASLt's BGRADB epilogue was tried and measured slower, see
// docs/perf-notes.md).
// Both weight layouts ((out, in): the Hugging Face families; (in, out): GPT-2's Conv1D), in f32,
// bf16 and f16. Shapes: Qwen2's v projection in miniature (OC < C) and one with sizes that are
// multiples of nothing useful. Tolerances: dinp tol_for(dt) (one output rounding plus f32
// accumulation); dW and dbias (f32 whatever dt) kTolWgrad (f32 summation order over N rows).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backend/cuda/op_testing.h"
#include "forge/backend/cpu/backend.h"
#include "forge/backend/cuda/backend.h"
#include "model/small_configs.h"

namespace forge::cuda::testing {
namespace {

using LinearBwdTest = DtypeTest<CudaTest>;

std::vector<double> wide(const std::vector<float>& v) { return {v.begin(), v.end()}; }

struct Shape {
  int N, C, OC;
};

TEST_P(LinearBwdTest, BiasAndWeightGradientsAccumulateOverMicroBatches) {
  const ModelConfig cfg = forge::testing::small_config(Family::kLlama);
  const ParamTable table(cfg);
  CudaModelOptions o;
  o.dtype = dt();
  CudaBackend be(cfg, table, ctx(), o);
  CpuBackend<double> cpu(cfg, table);
  uint64_t seed = 100;
  auto fresh = [&](size_t n, double scale) {
    return as_dt(dt(), forge::testing::random_normal<float>(n, seed++, scale));
  };
  for (const Shape s : {Shape{1024, 128, 64}, Shape{257, 40, 24}})
    for (WeightLayout lay : {WeightLayout::kOutIn, WeightLayout::kInOut}) {
      const std::string where = std::string(dt_name(dt())) + " N=" + std::to_string(s.N) + " C=" +
                                std::to_string(s.C) + " OC=" + std::to_string(s.OC) +
                                (lay == WeightLayout::kOutIn ? " (out, in)" : " (in, out)");
      const size_t nw = static_cast<size_t>(s.C) * s.OC;
      const std::vector<float> w = fresh(nw, 0.3);
      const std::vector<float> dw0 = forge::testing::random_normal<float>(nw, seed++, 1.0),
                               db0 = forge::testing::random_normal<float>(s.OC, seed++, 1.0);
      DeviceBuffer<float> d_dw = upload(dw0), d_db = upload(db0);
      const DevTensor d_w = up(w), d_dinp = poison(static_cast<size_t>(s.N) * s.C);
      std::vector<double> dw_ref = wide(dw0), db_ref = wide(db0), dinp_ref(static_cast<size_t>(s.N) * s.C);
      std::vector<double> w_d = wide(w);
      std::vector<float> dinp;
      for (int micro = 0; micro < 2; ++micro) {
        const std::vector<float> inp = fresh(static_cast<size_t>(s.N) * s.C, 1.0),
                                 dout = fresh(static_cast<size_t>(s.N) * s.OC, 0.5);
        const DevTensor d_inp = up(inp), d_dout = up(dout);
        be.linear_bwd(d_dinp.data(), d_dw.data(), d_db.data(), d_dout.data(), d_inp.data(), d_w.data(), s.N, s.C,
                      s.OC, lay, false);
        std::vector<double> inp_d = wide(inp), dout_d = wide(dout);
        cpu.linear_bwd(dinp_ref.data(), dw_ref.data(), db_ref.data(), dout_d.data(), inp_d.data(), w_d.data(), s.N,
                       s.C, s.OC, lay, false);
        dinp = down(d_dinp);
      }
      EXPECT_TRUE(all_close(dinp, dinp_ref, tol_for(dt()))) << "dinp " << where;
      EXPECT_TRUE(all_close(download(d_dw), dw_ref, kTolWgrad)) << "dW " << where;
      EXPECT_TRUE(all_close(download(d_db), db_ref, kTolWgrad)) << "dbias " << where;
    }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, LinearBwdTest, ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(dt_name(info.param)); });

}  // namespace
}  // namespace forge::cuda::testing
