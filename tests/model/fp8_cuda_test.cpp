// FP8 products in training (CudaModelOptions::fp8, core/fp8_recipe.h): one forward and backward
// of small GPT-2 and Llama models (every width a multiple of 16, as the FP8 kernels need; an MLP
// wide enough that the last MLP product's dX takes FP8 too, with GPT-2's DGELU epilogue) with
// the recipe on against the same step in plain bf16, from the same weights and tokens (the LM
// head's logits and dx products run in FP8 too, x's rows from the final norm; GPT-2's q|k|v and
// fc dX products too under rows-dx, their bias gradients summed by the output gradients' casts). FP8
// products change the numbers — the test checks they did (the path ran) — but the loss and the
// gradients stay close: E4M3 keeps 3 mantissa bits against bf16's 7, so each operand is within
// 2^-4 relative, and over a step the loss moves by well under 1% and the gradient vector keeps a
// cosine similarity above 0.99 (the bounds below; measured values are in the failure messages).
#include <cuda_runtime.h>

#include <cmath>
#include <string>
#include <vector>

#include "backend/cuda/op_testing.h"
#include "forge/core/error.h"
#include "forge/model/transformer.h"
#include "forge/model/transformer_cuda.h"
#include "model/small_configs.h"

namespace forge {
namespace {

using cuda::testing::CudaTest;
using testing::small_config;

struct Outcome {
  double loss = 0;
  std::vector<float> grads;
};

class Fp8CudaTest : public CudaTest {
 protected:
  bool hopper() const { return ctx_->props().major >= 9; }

  Outcome run(const ModelConfig& cfg, Fp8Recipe fp8) {
    Transformer<float> init(cfg);
    init.init_weights(3);
    testing::perturb_weights(init.weights(), init.table(), 4);
    CudaModelOptions o;
    o.dtype = DType::kBF16;
    o.fp8 = fp8;
    CudaTransformer m(cfg, ctx(), o);
    m.set_weights(init.weights());
    m.zero_grad();
    const int B = 4, T = 32;  // N = 128 rows
    auto dx = upload(testing::random_ids(B * T, cfg.vocab_size, 10));
    auto dy = upload(testing::random_ids(B * T, cfg.vocab_size, 11));
    auto dl = upload(std::vector<float>{1.0f / static_cast<float>(B * T)});
    m.forward(dx.data(), dy.data(), dl.data(), B, T, TokenLayout{});
    m.backward();
    std::vector<float> losses(static_cast<size_t>(B) * T);
    ctx().synchronize();
    FORGE_CUDA_CHECK(cudaMemcpy(losses.data(), m.losses(), losses.size() * sizeof(float),
                                cudaMemcpyDeviceToHost));
    Outcome out;
    for (float l : losses) out.loss += l / losses.size();
    out.grads = m.grads_host();
    biases_.clear();  // GPT-2's q|k|v and MLP fc biases: their dX products' casts sum them
    const ParamTable table(cfg);
    for (int l = 0; l < cfg.n_layer && cfg.family == Family::kGpt2; ++l) {
      const LayerOffsets& o = table.layer(l);
      biases_.push_back({o.qkv_b, 3 * cfg.n_embd});
      biases_.push_back({o.fc_b, cfg.ffn_hidden});
    }
    return out;
  }

  std::vector<std::pair<int64_t, int>> biases_;  // (offset, size) of the last run's checked biases
};

double cosine(const std::vector<float>& a, const std::vector<float>& b, int64_t off, int64_t n) {
  double dot = 0, n1 = 0, n2 = 0;
  for (int64_t i = off; i < off + n; ++i) {
    dot += double{a[i]} * b[i];
    n1 += double{a[i]} * a[i];
    n2 += double{b[i]} * b[i];
  }
  return dot / std::sqrt(n1 * n2);
}

ModelConfig fp8_config(Family f) {
  ModelConfig c = small_config(f);
  c.n_embd = 256;  // RMSNorm rows of ≤ 128 share warps, whose kernels write no E4M3 rows
  c.n_head = 4;  // head size 64: the flash kernels (Qwen3's variant: 128)
  c.n_kv_head = 2;
  if (f == Family::kGpt2) {  // rows-dx: q|k|v's and fc's dX (OUT = C) in FP8, biases from the casts
    c.n_embd = kFp8MinOutWithBiasSum;
    c.n_head = c.n_kv_head = c.n_embd / 64;
  }
  c.ffn_hidden = kFp8MinOutForCast;  // Llama's down projection's dX in FP8 too (output this wide)
  return c;
}

TEST_F(Fp8CudaTest, AStepStaysCloseToBf16) {
  if (!hopper()) GTEST_SKIP() << "FP8 products need compute capability 9.0";
  std::vector<std::pair<std::string, ModelConfig>> cases = {{"gpt2", fp8_config(Family::kGpt2)},
                                                            {"llama", fp8_config(Family::kLlama)}};
  for (auto& [name, cfg] : testing::llama_family_variants(fp8_config(Family::kLlama)))
    cases.emplace_back(name, cfg);
  for (const auto& [name, cfg] : cases) {
    std::vector<float> rows_grads;
    for (Fp8Recipe r : {Fp8Recipe::kRows, Fp8Recipe::kRowsE5M2, Fp8Recipe::kRowsDx}) {
      SCOPED_TRACE(name + " " + fp8_recipe_name(r));
      const Outcome bf16 = run(cfg, Fp8Recipe::kOff), fp8 = run(cfg, r);
      if (r == Fp8Recipe::kRows) rows_grads = fp8.grads;
      if (r == Fp8Recipe::kRowsDx && cfg.family == Family::kGpt2) {  // its dX products ran in FP8
        size_t other = 0;
        for (size_t i = 0; i < rows_grads.size(); ++i) other += rows_grads[i] != fp8.grads[i];
        EXPECT_GT(other, rows_grads.size() / 2) << "rows-dx gave rows' gradients";
      }
      EXPECT_LT(std::fabs(fp8.loss - bf16.loss), 0.01 * std::fabs(bf16.loss))
          << fp8.loss << " vs " << bf16.loss;
      double dot = 0, n1 = 0, n2 = 0;
      size_t differ = 0;
      for (size_t i = 0; i < bf16.grads.size(); ++i) {
        dot += double{bf16.grads[i]} * fp8.grads[i];
        n1 += double{bf16.grads[i]} * bf16.grads[i];
        n2 += double{fp8.grads[i]} * fp8.grads[i];
        differ += bf16.grads[i] != fp8.grads[i];
      }
      EXPECT_GT(dot / std::sqrt(n1 * n2), 0.99);
      EXPECT_GT(differ, bf16.grads.size() / 2) << "the FP8 products did not run";
      for (const auto& [off, n] : biases_)  // a bias gradient lost or doubled would be far off
        EXPECT_GT(cosine(bf16.grads, fp8.grads, off, n), 0.99) << "bias at " << off;
    }
  }
}

TEST_F(Fp8CudaTest, RefusedOutsideBf16) {
  if (!hopper()) GTEST_SKIP() << "FP8 products need compute capability 9.0";
  CudaModelOptions o;
  o.dtype = DType::kF32;
  o.fp8 = Fp8Recipe::kRows;
  EXPECT_THROW(CudaTransformer(fp8_config(Family::kGpt2), ctx(), o), Error);
}

}  // namespace
}  // namespace forge
