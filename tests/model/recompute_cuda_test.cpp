// Activation recomputation (model/recompute.h) on the GPU: at every level the CUDA model's losses
// and gradients (LoRA: the adapters') equal recompute=none's bit for bit, in bf16 (flash
// attention, GPT-2's fused GELU, the fused residual + norm recomputed at the narrow widths where
// the plain norm kernel rounds differently) and fp32 (the unfused attention); packed rows; and
// the CUDA runner's captured step graph at each level trains the same weights as none's.
#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/op_testing.h"
#include "forge/core/error.h"
#include "forge/model/lora.h"
#include "forge/model/transformer.h"
#include "forge/model/transformer_cuda.h"
#include "forge/train/runner.h"
#include "model/packed_layout.h"
#include "model/small_configs.h"

namespace forge {
namespace {

using cuda::testing::CudaTest;
using cuda::testing::same_bits;
using testing::small_config;

constexpr Recompute kLevels[] = {Recompute::kAttn, Recompute::kMlp, Recompute::kFull};

// Head size 64 (flash attention's shapes): 2 heads of 128 channels.
ModelConfig head64(Family f) {
  ModelConfig c = small_config(f);
  c.n_embd = 128;
  c.n_head = 2;
  c.n_kv_head = f == Family::kGpt2 ? 2 : 1;
  return c;
}

struct Case {
  std::string name;
  ModelConfig cfg;
  DType dt = DType::kBF16;
  bool packed = false;
  bool lora = false;
};

struct Outcome {
  std::vector<float> losses, grads;
};

class RecomputeCudaTest : public CudaTest {
 protected:
  // Two micro-batches of different shapes accumulated, at `level`, from the same weights.
  Outcome run(const Case& c, Recompute level) {
    Transformer<float> init(c.cfg);
    init.init_weights(3);
    testing::perturb_weights(init.weights(), init.table(), 4);
    CudaModelOptions o;
    o.dtype = c.dt;
    CudaTransformer m(c.cfg, ctx(), o);
    m.set_weights(init.weights());
    if (c.lora) {
      init.attach_lora(parse_lora_spec("r=4,alpha=8,targets=q,k,v,o,gate,up,down"), 5);
      const std::vector<float> noise = testing::random_normal<float>(init.adapter_weights().size(), 6, 0.1);
      for (size_t i = 0; i < noise.size(); ++i) init.adapter_weights()[i] += noise[i];
      m.attach_lora(init.adapter_table()->lora(), 5);
      m.backend().set_adapter_weights(init.adapter_weights());
    }
    m.set_recompute(level);
    Outcome out;
    m.zero_grad();
    const std::pair<int, int> shapes[] = {{3, 32}, {2, 24}};
    for (int i = 0; i < 2; ++i) {
      const auto [B, T] = shapes[i];
      auto y = testing::random_ids(B * T, c.cfg.vocab_size, 20 + i);
      y[2] = -1;
      const testing::PackedLayout lay = testing::random_packed_layout(B, T, 9, 30 + i);
      auto dx = upload(testing::random_ids(B * T, c.cfg.vocab_size, 10 + i)), dy = upload(y);
      auto dpos = upload(lay.pos), dseg = upload(lay.seg);
      auto dl = upload(std::vector<float>{1.0f / static_cast<float>(B * T)});
      m.forward(dx.data(), dy.data(), dl.data(), B, T,
                c.packed ? TokenLayout{dpos.data(), dseg.data()} : TokenLayout{});
      m.backward();
      std::vector<float> losses(static_cast<size_t>(B) * T);
      ctx().synchronize();
      FORGE_CUDA_CHECK(cudaMemcpy(losses.data(), m.losses(), losses.size() * sizeof(float), cudaMemcpyDeviceToHost));
      out.losses.insert(out.losses.end(), losses.begin(), losses.end());
    }
    out.grads = c.lora ? m.backend().adapter_grads_host() : m.grads_host();
    return out;
  }
};

TEST_F(RecomputeCudaTest, EveryLevelMatchesNoneBitForBit) {
  std::vector<Case> cases = {{"gpt2", small_config(Family::kGpt2)},
                             {"llama", small_config(Family::kLlama)},
                             {"gpt2-hs64", head64(Family::kGpt2)},
                             {"llama-hs64", head64(Family::kLlama)},
                             {"gpt2-fp32", small_config(Family::kGpt2), DType::kF32},
                             {"llama-fp32", small_config(Family::kLlama), DType::kF32},
                             {"gpt2-packed", head64(Family::kGpt2), DType::kBF16, true},
                             {"llama-packed", head64(Family::kLlama), DType::kBF16, true},
                             {"llama-lora", head64(Family::kLlama), DType::kBF16, true, true}};
  for (auto& [name, cfg] : testing::llama_family_variants(head64(Family::kLlama))) cases.push_back({name, cfg});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const Outcome none = run(c, Recompute::kNone);
    ASSERT_FALSE(none.grads.empty());
    for (Recompute level : kLevels) {
      SCOPED_TRACE(recompute_name(level));
      const Outcome r = run(c, level);
      EXPECT_TRUE(same_bits(r.losses, none.losses));
      EXPECT_TRUE(same_bits(r.grads, none.grads));
    }
  }
}

// The runner at each level, its step captured as a CUDA graph from the second step on: the same
// losses, weights and peak memory no higher than none's.
TEST_F(RecomputeCudaTest, RunnerGraphStepsMatchNone) {
  for (Family f : {Family::kGpt2, Family::kLlama}) {
    ModelConfig cfg = head64(f);
    cfg.n_layer = 4;  // the per-layer savings well above the shared set's cost
    SCOPED_TRACE(cfg.family_name());
    Transformer<float> init(cfg);
    init.init_weights(7);
    auto train = [&](Recompute level, size_t* peak) {
      std::unique_ptr<StepRunner> r = make_cuda_runner(cfg, "bf16", CudaSettings{});
      r->set_weights(init.weights());
      r->set_recompute(level);
      std::vector<double> losses;
      const int B = 4, T = 32;
      for (int s = 0; s < 4; ++s) {
        r->zero_grad();
        auto x = testing::random_ids(B * T, cfg.vocab_size, 100 + s), y = testing::random_ids(B * T, cfg.vocab_size, 200 + s);
        r->micro_step(x.data(), y.data(), B, T, 1.0);
        AdamWParams p;
        p.lr = 1e-3f;
        p.step = s + 1;
        r->optimizer_step(p, 1.0);
      }
      for (int s = 0; s < 4; ++s) losses.push_back(r->take_report().micro_losses.at(0));
      *peak = r->peak_device_bytes();
      return std::make_pair(losses, r->weights());
    };
    size_t peak_none = 0;
    const auto none = train(Recompute::kNone, &peak_none);
    for (Recompute level : kLevels) {
      SCOPED_TRACE(recompute_name(level));
      size_t peak = 0;
      const auto r = train(level, &peak);
      EXPECT_EQ(r.first, none.first);
      EXPECT_TRUE(same_bits(r.second, none.second));
      EXPECT_LE(peak, peak_none);
    }
  }
}

}  // namespace
}  // namespace forge
