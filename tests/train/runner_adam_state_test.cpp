// StepRunner::set_adam_state with empty vectors (train/runner.h): zero moments, as a fresh run
// hands them over without building P zeros on the host. On the CPU runner: moments left by two
// steps are zeroed, and the next step equals that of a runner given explicit zero vectors.
#include <vector>

#include "forge/model/transformer.h"
#include "forge/train/runner.h"
#include "testing.h"

namespace forge {
namespace {

TEST(CpuRunnerAdamState, EmptyVectorsAreZeroMoments) {
  ModelConfig cfg = preset_config("tiny");
  cfg.vocab_size = 16;
  cfg.max_seq_len = 16;
  cfg.n_layer = 1;
  cfg.n_embd = 16;
  cfg.n_head = cfg.n_kv_head = 2;
  cfg.ffn_hidden = 32;
  Transformer<float> init(cfg);
  init.init_weights(9);
  const int B = 2, T = 16;
  auto step = [&](StepRunner& r, int s) {
    const auto x = testing::random_ids(B * T, cfg.vocab_size, 200 + 2 * s);
    const auto y = testing::random_ids(B * T, cfg.vocab_size, 201 + 2 * s);
    r.zero_grad();
    r.micro_step(x.data(), y.data(), B, T, 1.0);
    AdamWParams p;
    p.lr = 1e-2f;
    p.step = s;
    r.optimizer_step(p, 1.0);
  };
  auto a = make_cpu_runner(cfg), b = make_cpu_runner(cfg);
  a->set_weights(init.weights());
  step(*a, 1);
  step(*a, 2);
  const std::vector<float> m = a->adam_m();
  size_t nonzero = 0;
  for (float x : m) nonzero += x != 0.0f;
  ASSERT_GT(nonzero, m.size() / 2);  // the steps left moments to clear
  a->set_adam_state({}, {});
  for (float x : a->adam_m()) ASSERT_EQ(x, 0.0f);
  for (float x : a->adam_v()) ASSERT_EQ(x, 0.0f);
  b->set_weights(a->weights());
  b->set_adam_state(std::vector<float>(m.size(), 0.0f), std::vector<float>(m.size(), 0.0f));
  step(*a, 3);
  step(*b, 3);
  EXPECT_EQ(a->weights(), b->weights());
  EXPECT_EQ(a->adam_m(), b->adam_m());
  EXPECT_EQ(a->adam_v(), b->adam_v());
}

}  // namespace
}  // namespace forge
