// The GPU model against the CPU reference model: same weights, same tokens → same loss and the
// same gradient for every parameter (fp32 mode within 1e-4 relative, bf16 and f16 within 2e-2,
// as the CUDA backend issue asks), ten AdamW steps that track the CPU loss curve, and
// bit-identical reruns.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include "backend/cuda/cuda_testing.h"
#include "forge/core/error.h"
#include "forge/model/transformer.h"
#include "forge/model/transformer_cuda.h"
#include "forge/ops/adamw.h"
#include "forge/ops/grad_norm.h"

namespace forge {
namespace {

using cuda::testing::CudaTest;

ModelConfig small(Family f) {
  ModelConfig c;
  c.family = f;
  c.vocab_size = 100;  // padded to 128
  c.max_seq_len = 32;
  c.n_layer = 2;
  c.n_embd = 64;
  c.n_head = 4;
  c.n_kv_head = f == Family::kGpt2 ? 4 : 2;
  c.ffn_hidden = f == Family::kGpt2 ? 256 : 96;
  c.tie_embeddings = f == Family::kGpt2;
  return c;
}

class CudaModelTest : public CudaTest {
 protected:
  struct Result {
    double loss;
    std::vector<float> grads;
  };
  Result gpu_step(CudaTransformer& m, const std::vector<int32_t>& x, const std::vector<int32_t>& y, int B, int T) {
    auto dx = upload(x), dy = upload(y);
    const float dloss = 1.0f / static_cast<float>(B * T);
    auto dl = upload(std::vector<float>{dloss});
    m.zero_grad();
    m.forward(dx.data(), dy.data(), dl.data(), B, T);
    m.backward();
    std::vector<float> losses(B * T);
    ctx().synchronize();
    FORGE_CUDA_CHECK(cudaMemcpy(losses.data(), m.losses(), losses.size() * 4, cudaMemcpyDeviceToHost));
    double sum = 0;
    for (float l : losses) sum += l;
    return {sum / (B * T), m.grads_host()};
  }
};

void expect_grad_norms_close(const ParamTable& t, const std::vector<float>& gpu, const std::vector<float>& cpu, double rtol) {
  for (const auto& p : t.params()) {
    const double a = cpu::global_norm(gpu.data() + p.offset, p.numel());
    const double b = cpu::global_norm(cpu.data() + p.offset, p.numel());
    EXPECT_NEAR(a, b, rtol * b + 1e-7) << p.name;
  }
}

TEST_F(CudaModelTest, Fp32LossAndEveryGradientMatchTheCpu) {
  for (Family f : {Family::kGpt2, Family::kLlama}) {
    const ModelConfig cfg = small(f);
    Transformer<float> ref(cfg);
    ref.init_weights(7);
    CudaTransformer gpu(ctx(), cfg, DType::kF32);
    gpu.set_weights(ref.weights());
    const int B = 3, T = 17;
    auto x = testing::random_ids(B * T, cfg.vocab_size, 1), y = testing::random_ids(B * T, cfg.vocab_size, 2);
    ref.zero_grad();
    const double lc = ref.forward(x.data(), y.data(), B, T);
    ref.backward(1.0);
    const Result r = gpu_step(gpu, x, y, B, T);
    EXPECT_NEAR(r.loss, lc, 1e-4 * lc) << cfg.family_name();
    expect_grad_norms_close(ref.table(), r.grads, ref.grads(), 1e-4);
  }
}

TEST_F(CudaModelTest, Bf16LossAndGradientNormsWithinTwoPercent) {
  for (Family f : {Family::kGpt2, Family::kLlama}) {
    const ModelConfig cfg = small(f);
    Transformer<float> ref(cfg);
    ref.init_weights(8);
    CudaTransformer gpu(ctx(), cfg, DType::kBF16);
    gpu.set_weights(ref.weights());
    const int B = 4, T = 32;
    auto x = testing::random_ids(B * T, cfg.vocab_size, 3), y = testing::random_ids(B * T, cfg.vocab_size, 4);
    ref.zero_grad();
    const double lc = ref.forward(x.data(), y.data(), B, T);
    ref.backward(1.0);
    const Result r = gpu_step(gpu, x, y, B, T);
    EXPECT_NEAR(r.loss, lc, 2e-2 * lc) << cfg.family_name();
    expect_grad_norms_close(ref.table(), r.grads, ref.grads(), 2e-2);
  }
}

TEST_F(CudaModelTest, TenStepsTrackTheCpuAndRerunsAreBitIdentical) {
  const ModelConfig cfg = small(Family::kLlama);
  Transformer<float> ref(cfg);
  ref.init_weights(9);
  const int B = 4, T = 32, steps = 10;
  cpu::AdamWParams p;
  p.lr = 3e-3f;
  std::vector<float> m(ref.num_params()), v(ref.num_params());
  std::vector<double> cpu_losses;
  for (int s = 0; s < steps; ++s) {
    // One fixed batch every step: memorising it makes the loss fall, so the curve has a shape.
    auto x = testing::random_ids(B * T, cfg.vocab_size, 100), y = x;
    std::rotate(y.begin(), y.begin() + 1, y.end());
    ref.zero_grad();
    cpu_losses.push_back(ref.forward(x.data(), y.data(), B, T));
    ref.backward(1.0);
    const double norm = cpu::global_norm(ref.grads().data(), ref.num_params());
    p.step = s + 1;
    p.grad_scale = static_cast<float>(cpu::clip_scale(norm, 1.0));
    cpu::AdamWParams q = p;
    for (const auto& info : ref.table().params()) {
      q.weight_decay = info.decay ? 0.1f : 0.0f;
      cpu::adamw_update(ref.weights().data() + info.offset, m.data() + info.offset, v.data() + info.offset,
                        ref.grads().data() + info.offset, info.numel(), q);
    }
  }
  std::vector<double> runs[2];
  for (auto& losses : runs) {
    Transformer<float> init(cfg);
    init.init_weights(9);
    CudaTransformer gpu(ctx(), cfg, DType::kF32);
    gpu.set_weights(init.weights());
    for (int s = 0; s < steps; ++s) {
      auto x = testing::random_ids(B * T, cfg.vocab_size, 100), y = x;
      std::rotate(y.begin(), y.begin() + 1, y.end());
      losses.push_back(gpu_step(gpu, x, y, B, T).loss);
      cpu::AdamWParams q = p;
      q.step = s + 1;
      q.grad_scale = 1.0f;  // the GPU computes the clip factor itself
      q.weight_decay = 0.1f;
      gpu.optimizer_step(q, 1.0f, 0);
    }
  }
  for (int s = 0; s < steps; ++s) {
    EXPECT_NEAR(runs[0][s], cpu_losses[s], 1e-4 * cpu_losses[s]) << "step " << s;
    EXPECT_EQ(runs[0][s], runs[1][s]) << "step " << s;  // deterministic, bit for bit
  }
  EXPECT_LT(cpu_losses.back(), cpu_losses.front());
}

// f16 (fp16 training): the gradients come out multiplied by the loss scale (2^16 at the start),
// so they are divided by it before comparing. Small configs (head size 16) take the unfused
// attention, head size 64 the flash kernels in f16; GPT-2 and Llama (GQA, RoPE) each. Same 2e-2
// bound as bf16: f16 has 3 more mantissa bits, but the fp16 logits and the scaled backward add
// their own roundings, and the bound is the issue's.
TEST_F(CudaModelTest, F16LossAndGradientNormsWithinTwoPercent) {
  for (Family f : {Family::kGpt2, Family::kLlama})
    for (bool hs64 : {false, true}) {
      ModelConfig cfg = small(f);
      if (hs64) {
        cfg.n_embd = 128;
        cfg.n_head = 2;
        cfg.n_kv_head = f == Family::kGpt2 ? 2 : 1;
      }
      Transformer<float> ref(cfg);
      ref.init_weights(11);
      CudaTransformer gpu(ctx(), cfg, DType::kF16);
      EXPECT_EQ(gpu.flash_attention(), hs64);
      gpu.set_weights(ref.weights());
      const int B = 4, T = 32;
      auto x = testing::random_ids(B * T, cfg.vocab_size, 12), y = testing::random_ids(B * T, cfg.vocab_size, 13);
      ref.zero_grad();
      const double lc = ref.forward(x.data(), y.data(), B, T);
      ref.backward(1.0);
      Result r = gpu_step(gpu, x, y, B, T);
      const float scale = gpu.loss_scale_host().scale;
      EXPECT_EQ(scale, 65536.0f);
      for (float& g : r.grads) g /= scale;
      const std::string what = str(cfg.family_name(), " HS=", cfg.head_dim());
      EXPECT_NEAR(r.loss, lc, 2e-2 * lc) << what;
      SCOPED_TRACE(what);
      expect_grad_norms_close(ref.table(), r.grads, ref.grads(), 2e-2);
    }
}

// Head size 64 in bf16 takes the flash-attention path (GPT-2 reading q/k/v in place from the
// fused projection, Llama with GQA, and a sliding window); the same 2e-2 bound as the unfused
// bf16 path, and flash against unfused on the GPU must agree as closely.
TEST_F(CudaModelTest, Bf16FlashAttentionModelMatchesTheCpuAndTheUnfusedPath) {
  struct Case {
    Family f;
    int window;
  };
  for (const Case c : {Case{Family::kGpt2, 0}, Case{Family::kLlama, 0}, Case{Family::kLlama, 9}}) {
    ModelConfig cfg = small(c.f);
    cfg.n_embd = 128;
    cfg.n_head = 2;  // head size 64
    cfg.n_kv_head = c.f == Family::kGpt2 ? 2 : 1;
    cfg.sliding_window = c.window;
    Transformer<float> ref(cfg);
    ref.init_weights(10);
    const int B = 3, T = 29;  // T not a multiple of the 64-row tiles
    auto x = testing::random_ids(B * T, cfg.vocab_size, 5), y = testing::random_ids(B * T, cfg.vocab_size, 6);
    ref.zero_grad();
    const double lc = ref.forward(x.data(), y.data(), B, T);
    ref.backward(1.0);
    CudaTransformer flash(ctx(), cfg, DType::kBF16);
    ASSERT_TRUE(flash.flash_attention());
    flash.set_weights(ref.weights());
    const Result rf = gpu_step(flash, x, y, B, T);
    ::setenv("FORGE_ATTENTION", "unfused", 1);
    CudaTransformer unfused(ctx(), cfg, DType::kBF16);
    ::unsetenv("FORGE_ATTENTION");
    ASSERT_FALSE(unfused.flash_attention());
    unfused.set_weights(ref.weights());
    const Result ru = gpu_step(unfused, x, y, B, T);
    const std::string what = str(cfg.family_name(), " window ", c.window);
    EXPECT_NEAR(rf.loss, lc, 2e-2 * lc) << what;
    EXPECT_NEAR(rf.loss, ru.loss, 2e-2 * ru.loss) << what;
    expect_grad_norms_close(ref.table(), rf.grads, ref.grads(), 2e-2);
    expect_grad_norms_close(ref.table(), rf.grads, ru.grads, 2e-2);
  }
}

}  // namespace
}  // namespace forge
