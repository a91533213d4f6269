// The golden transformers models (tests/data/hf_golden, tools/make_hf_golden.py) on the GPU in
// fp32: logits and the mean loss within 1e-4 relative of what transformers computed, for every
// family (gpt2, llama, mistral, qwen2, qwen3, llama with attention biases and scaled RoPE). The
// CPU twin is tests/model/hf_golden_test.cpp (which also checks gradient norms).
#include <cuda_runtime.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "backend/cuda/cuda_testing.h"
#include "forge/model/model_dir.h"
#include "forge/model/transformer_cuda.h"
#include "generate/hf_generate_golden.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

class HfGoldenCudaTest : public cuda::testing::CudaTest {};

TEST_F(HfGoldenCudaTest, Fp32LogitsAndLossEqualTransformers) {
  int checked = 0;
  for (const auto& e : fs::directory_iterator(testing::source_dir() / "tests/data/hf_golden")) {
    if (!fs::exists(e.path() / "golden.json")) continue;
    SCOPED_TRACE(e.path().filename().string());
    std::ifstream f(e.path() / "golden.json");
    const nlohmann::json g = nlohmann::json::parse(f);
    const int B = g["batch"], T = g["seq_len"], V = g["vocab_size"];
    const Transformer<float> cpu = load_model_dir(e.path().string());
    CudaModelOptions o;
    o.dtype = DType::kF32;
    CudaTransformer gpu(cpu.config(), ctx(), o);
    gpu.set_weights(cpu.weights());
    std::vector<int32_t> ids(static_cast<size_t>(B) * T), targets(ids.size());
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t) ids[b * T + t] = g["ids"][b][t].get<int32_t>();
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t) targets[b * T + t] = t + 1 < T ? ids[b * T + t + 1] : -1;

    auto dx = upload(ids), dy = upload(targets);
    gpu.forward(dx.data(), dy.data(), nullptr, B, T);
    std::vector<float> losses(ids.size());
    ctx().synchronize();
    FORGE_CUDA_CHECK(
        cudaMemcpy(losses.data(), gpu.losses(), losses.size() * 4, cudaMemcpyDeviceToHost));
    double sum = 0;
    for (float l : losses) sum += l;
    const double loss = sum / (B * (T - 1)), want_loss = g["loss"].get<double>();
    EXPECT_NEAR(loss, want_loss, 1e-4 * std::fabs(want_loss)) << "loss";

    gpu.forward_logits(dx.data(), B, T);
    const int Vp = cpu.config().padded_vocab();
    std::vector<float> all(static_cast<size_t>(B) * T * Vp), got, want;
    ctx().synchronize();
    FORGE_CUDA_CHECK(cudaMemcpy(all.data(), gpu.logits(), all.size() * 4, cudaMemcpyDeviceToHost));
    double scale = 0;
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t)
        for (int v = 0; v < V; ++v) {
          got.push_back(all[(static_cast<size_t>(b) * T + t) * Vp + v]);
          want.push_back(g["logits"][b][t][v].get<float>());
          scale = std::max(scale, std::fabs(static_cast<double>(want.back())));
        }
    // As the CPU test: 1e-4 relative, with a floor of 1e-4 of the largest logit.
    EXPECT_TRUE(testing::all_close(got, want, {1e-4 * scale, 1e-4})) << "logits";
    ++checked;
  }
  EXPECT_EQ(checked, 11) << "expected the eleven golden models of tools/make_hf_golden.py";
}

}  // namespace
}  // namespace forge
