// KV-cache decoding on the GPU against the CPU model: the same weights, the same prompts and
// teacher-forced tokens in several slots at different positions; the logits of the prefill and
// of every decode step within the dtype's tolerance of the CPU's f32 decode (which
// tests/model/decode_test.cpp ties to a full recomputation). GPT-2 (fused strided q|k|v),
// Llama with GQA in both RoPE styles, and a sliding-window ring.
#include <cuda_runtime.h>

#include <vector>

#include "backend/cuda/cuda_testing.h"
#include "forge/model/packed_prompts.h"
#include "forge/model/transformer.h"
#include "forge/model/transformer_cuda.h"
#include "model/small_configs.h"

namespace forge {
namespace {

using cuda::testing::CudaTest;

// Head sizes the decode kernels take (32 and 64), GQA for Llama.
ModelConfig decode_config(Family f) {
  ModelConfig c = testing::small_config(f);
  c.n_embd = 128;
  c.n_head = f == Family::kGpt2 ? 2 : 4;  // HS 64 / 32
  c.n_kv_head = f == Family::kGpt2 ? 2 : 2;
  return c;
}

class DecodeCudaTest : public CudaTest {
 protected:
  std::vector<float> logits_row(CudaTransformer& m, DType dt, int s) {
    const int Vp = m.config().padded_vocab();
    const size_t es = dtype_size(dt);
    std::vector<char> raw(Vp * es);
    ctx().synchronize();
    FORGE_CUDA_CHECK(cudaMemcpy(raw.data(), static_cast<char*>(m.decode_logits()) + s * Vp * es, raw.size(),
                                cudaMemcpyDeviceToHost));
    std::vector<float> out(Vp);
    if (dt == DType::kF32) {
      std::memcpy(out.data(), raw.data(), raw.size());
      return out;
    }
    std::vector<uint16_t> h(Vp);
    std::memcpy(h.data(), raw.data(), raw.size());
    return dt == DType::kF16 ? cuda::testing::from_f16(h) : cuda::testing::from_bf16(h);
  }

  void expect_matches_cpu(const ModelConfig& cfg, DType dt, testing::Tol tol, const std::vector<int>& prompt_len,
                          int steps, int capacity, bool perturb = false, bool packed_gpu = false) {
    Transformer<float> cpu(cfg);
    cpu.init_weights(21);
    if (perturb) testing::perturb_weights(cpu.weights(), cpu.table(), 22);
    CudaTransformer gpu(cfg, ctx(), CudaModelOptions{dt, {}, AttentionPath::kAuto});
    gpu.set_weights(cpu.weights_host());
    const int S = static_cast<int>(prompt_len.size()), Vp = cfg.padded_vocab();
    cpu.plan_decode(S, capacity);
    gpu.plan_decode(S, capacity);
    std::vector<std::vector<int32_t>> seq(S);
    std::vector<PrefillSeg> segs;
    std::vector<int32_t> tokens;  // packed_gpu: all prompts in one row, last slot first
    for (int s = 0; s < S; ++s) {
      seq[s] = testing::random_ids(prompt_len[s] + steps, cfg.vocab_size, 300 + s);
      cpu.prefill(s, seq[s].data(), prompt_len[s]);
      if (!packed_gpu) {
        auto d = upload(seq[s]);
        gpu.prefill(s, d.data(), prompt_len[s]);
      }
    }
    if (packed_gpu) {
      for (int s = S - 1; s >= 0; --s) {
        segs.push_back({s, prompt_len[s]});
        tokens.insert(tokens.end(), seq[s].begin(), seq[s].begin() + prompt_len[s]);
      }
      auto dt_ = upload(tokens), dl = upload(packed_prompt_layout(segs.data(), S));  // positions, segment ids
      gpu.prefill_packed(segs.data(), S, dt_.data(), TokenLayout{dl.data(), dl.data() + tokens.size()});
      ctx().synchronize();
    }
    auto check = [&](const std::string& what) {
      for (int s = 0; s < S; ++s) {
        const std::vector<float> want(cpu.decode_logits() + s * Vp, cpu.decode_logits() + (s + 1) * Vp);
        EXPECT_TRUE(testing::all_close(logits_row(gpu, dt, s), want, tol)) << what << ", slot " << s;
      }
    };
    check("prefill");
    std::vector<int32_t> tok(S);
    for (int i = 0; i < steps; ++i) {
      for (int s = 0; s < S; ++s) tok[s] = cpu.decode_tokens()[s] = seq[s][prompt_len[s] + i];
      FORGE_CUDA_CHECK(cudaMemcpyAsync(gpu.decode_tokens(), tok.data(), S * 4, cudaMemcpyHostToDevice, ctx().stream()));
      ctx().synchronize();
      cpu.decode_step();
      gpu.decode_step();
      check("step " + std::to_string(i));
    }
    std::vector<int32_t> pos(S);
    ctx().synchronize();
    FORGE_CUDA_CHECK(cudaMemcpy(pos.data(), gpu.decode_positions(), S * 4, cudaMemcpyDeviceToHost));
    for (int s = 0; s < S; ++s) EXPECT_EQ(pos[s], cpu.decode_positions()[s]);
  }
};

// fp32: the CPU-parity mode; the two differ by summation order (GEMMs, attention) only.
constexpr testing::Tol kTolF32Decode{1e-4, 1e-3};

TEST_F(DecodeCudaTest, Gpt2MatchesCpu) {
  expect_matches_cpu(decode_config(Family::kGpt2), DType::kF32, kTolF32Decode, {3, 9, 1}, 8, 32);
  expect_matches_cpu(decode_config(Family::kGpt2), DType::kBF16, cuda::testing::kTolBf16, {3, 9, 1}, 8, 32);
}

TEST_F(DecodeCudaTest, LlamaGqaBothRopeStylesMatchCpu) {
  for (RopeStyle st : {RopeStyle::kRotateHalf, RopeStyle::kInterleaved}) {
    ModelConfig cfg = decode_config(Family::kLlama);
    cfg.rope_style = st;
    SCOPED_TRACE(rope_style_name(st));
    expect_matches_cpu(cfg, DType::kF32, kTolF32Decode, {5, 2, 12, 7}, 10, 32);
    expect_matches_cpu(cfg, DType::kBF16, cuda::testing::kTolBf16, {5, 2, 12, 7}, 10, 32);
    expect_matches_cpu(cfg, DType::kF16, cuda::testing::kTolF16, {5, 2, 12, 7}, 10, 32);
  }
}

TEST_F(DecodeCudaTest, SlidingWindowRingMatchesCpu) {
  ModelConfig cfg = decode_config(Family::kLlama);
  cfg.sliding_window = 6;  // prompts longer than the window, and steps that wrap the ring
  expect_matches_cpu(cfg, DType::kF32, kTolF32Decode, {9, 3}, 14, 32);
  expect_matches_cpu(cfg, DType::kBF16, cuda::testing::kTolBf16, {9, 3}, 14, 32);
}

// Qwen2 (fused q|k|v bias), Qwen3 (in-place head norms, head size 64 over 128 channels),
// Llama with attention biases and llama3 RoPE scaling, with perturbed biases and gains.
TEST_F(DecodeCudaTest, HfFamilyVariantsMatchCpu) {
  for (const auto& [name, cfg] : testing::llama_family_variants(decode_config(Family::kLlama))) {
    SCOPED_TRACE(name);
    expect_matches_cpu(cfg, DType::kF32, kTolF32Decode, {5, 2, 12}, 10, 32, true);
    expect_matches_cpu(cfg, DType::kBF16, cuda::testing::kTolBf16, {5, 2, 12}, 10, 32, true);
  }
}

// Several prompts prefilled in one packed row (Model::prefill_packed: segment masks in the
// training attention, each prompt's keys and values to its own slot) against the CPU's prompts
// prefilled one by one; then decode steps from those caches.
TEST_F(DecodeCudaTest, PackedPrefillMatchesCpu) {
  expect_matches_cpu(decode_config(Family::kGpt2), DType::kF32, kTolF32Decode, {3, 9, 1}, 6, 32, false, true);
  expect_matches_cpu(decode_config(Family::kGpt2), DType::kBF16, cuda::testing::kTolBf16, {3, 9, 1}, 6, 32, false,
                     true);
  ModelConfig cfg = decode_config(Family::kLlama);
  expect_matches_cpu(cfg, DType::kBF16, cuda::testing::kTolBf16, {5, 2, 12, 7}, 6, 32, false, true);
  cfg.sliding_window = 6;
  expect_matches_cpu(cfg, DType::kBF16, cuda::testing::kTolBf16, {9, 3}, 8, 32, false, true);
}

}  // namespace
}  // namespace forge
