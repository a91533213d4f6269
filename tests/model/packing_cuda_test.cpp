// Packed rows on the GPU (model/transformer.h's TokenLayout in device memory): the CUDA model's
// loss and gradients with a random packed layout against the CPU model with the same layout —
// GPT-2 (learned positions at pos[b, t]), Llama (RoPE at pos[b, t], GQA) and the Llama-shaped
// variants (Qwen2 biases, Qwen3 q/k norms, llama3-scaled RoPE, SmolLM3's layer without RoPE); in
// fp32 every gradient element, in bf16 every parameter's gradient norm. Segment masks come from
// the attention kernels; positions from embedding and RoPE.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/cuda_testing.h"
#include "forge/model/transformer.h"
#include "forge/model/transformer_cuda.h"
#include "forge/ops/grad_norm.h"
#include "model/packed_layout.h"
#include "model/small_configs.h"

namespace forge {
namespace {

using cuda::testing::CudaTest;

class CudaPackingTest : public CudaTest {
 protected:
  // Forward + backward of the mean loss with the layout (device copies), as the runner does.
  double gpu_step(CudaTransformer& m, const std::vector<int32_t>& x, const std::vector<int32_t>& y,
                  const testing::PackedLayout& lay, int B, int T, int64_t count) {
    auto dx = upload(x), dy = upload(y), dpos = upload(lay.pos), dseg = upload(lay.seg);
    auto dl = upload(std::vector<float>{1.0f / static_cast<float>(count)});
    m.zero_grad();
    m.forward(dx.data(), dy.data(), dl.data(), B, T, TokenLayout{dpos.data(), dseg.data()});
    m.backward();
    std::vector<float> losses(static_cast<size_t>(B) * T);
    ctx().synchronize();
    FORGE_CUDA_CHECK(
        cudaMemcpy(losses.data(), m.losses(), losses.size() * 4, cudaMemcpyDeviceToHost));
    double sum = 0;
    for (float l : losses) sum += l;
    return sum / static_cast<double>(count);
  }
  void expect_packed_step_matches_cpu(DType dt, double rtol);
};

// One packed batch per model: B = 3 rows of T = 32 in segments of 1 to 12 tokens, a few targets
// ignored (prompts) and each segment's last target ignored (as the SFT packer leaves them).
// fp32 (rtol 1e-4): the loss and every gradient element within rtol of the CPU's, with a floor
// of rtol · (the tensor's largest element) / 10 for sums of cancelling terms; the CPU's unpacked
// gradients are checked to fail that comparison, so a GPU that ignored the layout would fail.
// bf16 (rtol 2e-2): the loss and every parameter's gradient norm (activations rounded to 8 bits).
void CudaPackingTest::expect_packed_step_matches_cpu(DType dt, double rtol) {
  std::vector<std::pair<std::string, ModelConfig>> cfgs = {
      {"gpt2", testing::small_config(Family::kGpt2)},
      {"llama", testing::small_config(Family::kLlama)}};
  for (const auto& v : testing::llama_family_variants(testing::small_config(Family::kLlama)))
    cfgs.push_back(v);
  uint64_t seed = 300;
  for (const auto& [name, cfg] : cfgs) {
    SCOPED_TRACE(name);
    const int B = 3, T = 32;
    Transformer<float> ref(cfg);
    ref.init_weights(seed++);
    testing::perturb_weights(ref.weights(), ref.table(), seed++);
    const testing::PackedLayout lay = testing::random_packed_layout(B, T, 12, seed++);
    const std::vector<int32_t> x = testing::random_ids(B * T, cfg.vocab_size, seed++);
    std::vector<int32_t> y = testing::random_ids(B * T, cfg.vocab_size, seed++);
    for (int i = 0; i < B * T; ++i) {
      const bool last = i % T == T - 1 || lay.seg[i + 1] != lay.seg[i];
      if (last || i % 7 == 3) y[i] = -1;
    }
    const int64_t count = std::count_if(y.begin(), y.end(), [](int32_t t) { return t >= 0; });
    ref.zero_grad();
    ref.loss_and_grad(x.data(), y.data(), B, T);
    const std::vector<float> plain = ref.grads();  // unpacked
    ref.zero_grad();
    const double want = ref.loss_and_grad(x.data(), y.data(), B, T, 1.0,
                                          TokenLayout{lay.pos.data(), lay.seg.data()});
    bool layout_matters = false;

    CudaModelOptions o;
    o.dtype = dt;
    CudaTransformer gpu(cfg, ctx(), o);
    gpu.set_weights(ref.weights());
    const double got = gpu_step(gpu, x, y, lay, B, T, count);
    EXPECT_NEAR(got, want, rtol * want);
    const std::vector<float> g = gpu.grads_host();
    const std::vector<float>& c = ref.grads();
    for (const auto& p : ref.table().params()) {
      const std::vector<float> a(g.begin() + p.offset, g.begin() + p.offset + p.numel());
      const std::vector<float> b(c.begin() + p.offset, c.begin() + p.offset + p.numel());
      if (dt == DType::kF32) {
        double mx = 0;
        for (float v : b) mx = std::max(mx, std::fabs(static_cast<double>(v)));
        const testing::Tol tol{rtol * mx / 10 + 1e-12, rtol};
        EXPECT_TRUE(testing::all_close(a, b, tol)) << p.name;
        const std::vector<float> u(plain.begin() + p.offset,
                                   plain.begin() + p.offset + p.numel());
        layout_matters = layout_matters || !testing::all_close(u, b, tol);
      } else {
        const double na = cpu::global_norm(a.data(), a.size());
        const double nb = cpu::global_norm(b.data(), b.size());
        EXPECT_NEAR(na, nb, rtol * nb + 1e-7) << p.name;
      }
    }
    if (dt == DType::kF32) {
      EXPECT_TRUE(layout_matters) << "unpacked gradients would pass too";
    }
  }
}

TEST_F(CudaPackingTest, Fp32PackedLossAndEveryGradientMatchTheCpu) {
  expect_packed_step_matches_cpu(DType::kF32, 1e-4);
}

TEST_F(CudaPackingTest, Bf16PackedLossAndGradientNormsWithinTwoPercent) {
  expect_packed_step_matches_cpu(DType::kBF16, 2e-2);
}

}  // namespace
}  // namespace forge
