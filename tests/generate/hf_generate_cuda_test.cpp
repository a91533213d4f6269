// The same golden greedy generations on the GPU, in fp32 (the CPU-parity mode): prefill with
// the training kernels, then the captured decode step with the GPU sampler.
#include "backend/cuda/cuda_testing.h"
#include "generate/hf_generate_golden.h"

namespace forge {
namespace {

TEST(HfGenerateCudaTest, GpuFp32GreedyEqualsTransformers) {
  if (!cuda::available()) GTEST_SKIP() << "no CUDA device: " << cuda::device_summary();
  testing::expect_hf_greedy_generation(
      [](const ModelConfig& cfg, const std::vector<float>& w) { return make_cuda_engine(cfg, w, "fp32"); });
}

// The engine the commands make from a loaded model (its host copy freed once on the GPU).
TEST(HfGenerateCudaTest, GpuFp32GreedyOfAMovedModelEqualsTransformers) {
  if (!cuda::available()) GTEST_SKIP() << "no CUDA device: " << cuda::device_summary();
  testing::expect_hf_greedy_generation([](const ModelConfig& cfg, const std::vector<float>& w) {
    Transformer<float> m(cfg, GradBuffers::kNone);
    m.set_weights(w);
    return make_engine(std::move(m), Device::kCuda, "fp32");
  });
}

}  // namespace
}  // namespace forge
