// make_cpu_runner with no communicator or a world of one is the single-process runner, bit for
// bit: checked against the single-process step written out here from the model and the ops
// (Σ g², clipping, the guard, AdamW per tensor with decay on >= 2-D tensors), which is what the
// runner did before it learned ZeRO-1.
#include <gtest/gtest.h>

#include <cmath>

#include "forge/dist/communicator.h"
#include "forge/model/transformer.h"
#include "forge/ops/grad_norm.h"
#include "forge/train/runner.h"
#include "model/small_configs.h"

namespace forge {
namespace {

struct Batch {
  std::vector<int32_t> x, y;
};

Batch batch(const ModelConfig& cfg, int B, int T, int step, int micro) {
  const uint64_t seed = 1000 + 10 * step + micro;
  return {testing::random_ids(B * T, cfg.vocab_size, seed),
          testing::random_ids(B * T, cfg.vocab_size, seed + 5000)};
}

TEST(CpuRunnerLocal, NoCommunicatorAndAWorldOfOneMatchTheSingleProcessStepBitForBit) {
  for (const Family f : {Family::kGpt2, Family::kLlama}) {
    const ModelConfig cfg = testing::small_config(f);
    Transformer<float> ref(cfg);
    ref.init_weights(3);
    const size_t n = ref.num_params();
    std::vector<float> m(n, 0.0f), v(n, 0.0f);
    LocalComm local;
    auto plain = make_cpu_runner(cfg);
    auto world1 = make_cpu_runner(cfg, &local);
    EXPECT_EQ(world1->describe(), "cpu fp32");
    for (auto* r : {plain.get(), world1.get()}) r->set_weights(ref.weights());

    const int B = 2, T = 8, micro = 2, steps = 4;
    const double max_norm = 0.5;  // small enough that clipping acts
    for (int s = 0; s < steps; ++s) {
      AdamWParams p;
      p.lr = 1e-2f;
      p.step = s + 1;
      // The reference step.
      ref.zero_grad();
      std::vector<double> ref_losses;
      for (int k = 0; k < micro; ++k) {
        const Batch b = batch(cfg, B, T, s, k);
        ref_losses.push_back(ref.loss_and_grad(b.x.data(), b.y.data(), B, T, 1.0 / micro));
      }
      const double norm = cpu::global_norm(ref.grads().data(), n);
      AdamWParams q = p;
      q.grad_scale = static_cast<float>(clip_scale(norm, max_norm));
      for (const auto& info : ref.table().params()) {
        q.weight_decay = info.decay ? p.weight_decay : 0.0f;
        cpu::adamw_update(ref.weights().data() + info.offset, m.data() + info.offset,
                          v.data() + info.offset, ref.grads().data() + info.offset, info.numel(),
                          q);
      }
      // The runners.
      for (auto* r : {plain.get(), world1.get()}) {
        r->zero_grad();
        for (int k = 0; k < micro; ++k) {
          const Batch b = batch(cfg, B, T, s, k);
          r->micro_step(b.x.data(), b.y.data(), B, T, 1.0 / micro);
        }
        r->optimizer_step(p, max_norm);
        const StepReport rep = r->take_report();
        EXPECT_FALSE(rep.skipped);
        EXPECT_EQ(rep.micro_losses, ref_losses) << "step " << s;
        EXPECT_EQ(rep.grad_norm, norm) << "step " << s;
        EXPECT_LT(clip_scale(norm, max_norm), 1.0);
      }
    }
    for (auto* r : {plain.get(), world1.get()}) {
      EXPECT_EQ(r->weights(), ref.weights());
      EXPECT_EQ(r->adam_m(), m);
      EXPECT_EQ(r->adam_v(), v);
    }
  }
}

}  // namespace
}  // namespace forge
