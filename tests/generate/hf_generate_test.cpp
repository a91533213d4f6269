// Forge's KV-cache greedy generation on the CPU equals transformers' generate() on the golden
// models (gpt2, llama with GQA, llama tied, mistral with a sliding window shorter than every
// sequence), ids for ids.
#include "generate/hf_generate_golden.h"

namespace forge {
namespace {

TEST(HfGenerateTest, CpuGreedyEqualsTransformers) {
  testing::expect_hf_greedy_generation(
      [](const ModelConfig& cfg, const std::vector<float>& w) { return make_cpu_engine(cfg, w); });
}

// The engine the commands make: a model loaded without gradient buffers, moved in, not copied.
TEST(HfGenerateTest, CpuGreedyOfAMovedInferenceModelEqualsTransformers) {
  testing::expect_hf_greedy_generation([](const ModelConfig& cfg, const std::vector<float>& w) {
    Transformer<float> m(cfg, GradBuffers::kNone);
    m.set_weights(w);
    return make_engine(std::move(m), Device::kCpu, "bf16");  // the CPU computes in f32 whatever dtype says
  });
}

}  // namespace
}  // namespace forge
