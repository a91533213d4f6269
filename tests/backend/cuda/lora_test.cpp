// CudaBackend::lora_fwd / lora_bwd (LoRA's products on cuBLASLt) against the CPU backend's twins
// in double, on fresh random inputs (B nonzero) and nonzero initial out, dinp, dA and dB, so
// that the accumulate / overwrite semantics of each product are checked, in f32, bf16 and f16.
//
// Each product's output is compared with the reference computed from the rounded inputs the GPU
// read. The products that read a 16-bit intermediate the GPU itself wrote (out reads h, dA and
// dinp read dh) are referenced against that intermediate as downloaded (h and dh are checked on
// their own first), so the tolerance measures one product, not the rounding of the one before.
// Tolerances: activations (dt) tol_for(dt) (kTolF32, kTolBf16, kTolF16: one output rounding plus
// f32 accumulation); dA, dB (f32 whatever dt) kTolWgrad (f32 summation order over 64 rows).
#include <gtest/gtest.h>

#include <vector>

#include "backend/cuda/op_testing.h"
#include "forge/backend/cpu/backend.h"
#include "forge/backend/cuda/backend.h"
#include "forge/ops/matmul.h"
#include "model/small_configs.h"

namespace forge::cuda::testing {
namespace {

using LoraOpTest = DtypeTest<CudaTest>;

constexpr int N = 64, C = 48, OC = 40, R = 4;
constexpr double kScale = 2.5;  // alpha / r

std::vector<double> wide(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// Host vector of n normal(0, scale) values as dtype dt would store them.
std::vector<float> fresh(DType dt, size_t n, uint64_t seed, double scale) {
  return as_dt(dt, forge::testing::random_normal<float>(n, seed, scale));
}

TEST_P(LoraOpTest, ForwardAndBackwardMatchTheCpuBackend) {
  const ModelConfig cfg = forge::testing::small_config(Family::kLlama);
  const ParamTable table(cfg);
  CudaModelOptions o;
  o.dtype = dt();
  CudaBackend be(cfg, table, ctx(), o);
  CpuBackend<double> cpu(cfg, table);

  const std::vector<float> inp = fresh(dt(), N * C, 1, 1.0), a = fresh(dt(), R * C, 2, 0.3),
                           b = fresh(dt(), OC * R, 3, 0.3), out0 = fresh(dt(), N * OC, 4, 1.0),
                           dout = fresh(dt(), N * OC, 5, 0.5), dinp0 = fresh(dt(), N * C, 6, 1.0);
  const std::vector<float> da0 = forge::testing::random_normal<float>(R * C, 7, 1.0),
                           db0 = forge::testing::random_normal<float>(OC * R, 8, 1.0);
  const DevTensor d_inp = up(inp), d_a = up(a), d_b = up(b), d_out = up(out0), d_dout = up(dout),
                  d_dinp = up(dinp0);
  const DevTensor d_h = poison(N * R), d_dh = poison(N * R);

  // Forward: h = inp·Aᵀ (overwritten), out += scale·h·Bᵀ.
  be.lora_fwd(d_out.data(), d_h.data(), d_inp.data(), d_a.data(), d_b.data(), N, C, OC, R, kScale);
  const std::vector<float> h = down(d_h), out = down(d_out);
  std::vector<double> h_ref(N * R), out_ref = wide(out0);
  std::vector<double> inp_d = wide(inp), a_d = wide(a), b_d = wide(b), dout_d = wide(dout);
  cpu.lora_fwd(out_ref.data(), h_ref.data(), inp_d.data(), a_d.data(), b_d.data(), N, C, OC, R, kScale);
  EXPECT_TRUE(all_close(h, h_ref, tol_for(dt()))) << "h " << dt_name(dt());
  // out from the h the GPU stored (out0 + scale·h·Bᵀ with h as read).
  std::vector<double> out_from_h = wide(out0), h_gpu = wide(h);
  cpu::matmul<double>(out_from_h.data(), h_gpu.data(), b_d.data(), N, OC, R, false, true, kScale, 1.0);
  EXPECT_TRUE(all_close(out, out_from_h, tol_for(dt()))) << "out " << dt_name(dt());
  // The update really is there: out moved away from out0 by the adapter's product.
  EXPECT_FALSE(all_close(out, wide(out0), tol_for(dt())));

  // Backward into nonzero dA, dB (f32) and dinp: dB += scale·doutᵀ·h, dh = scale·dout·B,
  // dA += dhᵀ·inp, dinp += dh·A.
  const std::vector<float> hin = fresh(dt(), N * R, 9, 1.0);  // an independent h
  const DevTensor d_hin = up(hin);
  DeviceBuffer<float> d_da = upload(da0), d_db = upload(db0);
  be.lora_bwd(d_dinp.data(), d_da.data(), d_db.data(), d_dh.data(), d_dout.data(), d_inp.data(), d_hin.data(),
              d_a.data(), d_b.data(), N, C, OC, R, kScale);
  const std::vector<float> dh = down(d_dh), dinp = down(d_dinp), da = download(d_da), db = download(d_db);
  std::vector<double> dinp_ref = wide(dinp0), da_ref = wide(da0), db_ref = wide(db0), dh_ref(N * R),
                      hin_d = wide(hin);
  cpu.lora_bwd(dinp_ref.data(), da_ref.data(), db_ref.data(), dh_ref.data(), dout_d.data(), inp_d.data(),
               hin_d.data(), a_d.data(), b_d.data(), N, C, OC, R, kScale);
  EXPECT_TRUE(all_close(dh, dh_ref, tol_for(dt()))) << "dh " << dt_name(dt());
  EXPECT_TRUE(all_close(db, db_ref, kTolWgrad)) << "dB " << dt_name(dt());
  // dA and dinp from the dh the GPU stored.
  std::vector<double> da_from_dh = wide(da0), dinp_from_dh = wide(dinp0), dh_gpu = wide(dh);
  cpu::matmul<double>(da_from_dh.data(), dh_gpu.data(), inp_d.data(), R, C, N, true, false, 1.0, 1.0);
  cpu::matmul<double>(dinp_from_dh.data(), dh_gpu.data(), a_d.data(), N, C, R, false, false, 1.0, 1.0);
  EXPECT_TRUE(all_close(da, da_from_dh, kTolWgrad)) << "dA " << dt_name(dt());
  EXPECT_TRUE(all_close(dinp, dinp_from_dh, tol_for(dt()))) << "dinp " << dt_name(dt());
  // In f32 the whole chain equals the CPU backend's directly.
  if (dt() == DType::kF32) {
    EXPECT_TRUE(all_close(da, da_ref, kTolWgrad));
    EXPECT_TRUE(all_close(dinp, dinp_ref, forge::testing::kTolF32));
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, LoraOpTest, ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(dt_name(info.param)); });

}  // namespace
}  // namespace forge::cuda::testing
