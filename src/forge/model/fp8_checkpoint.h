// FP8 checkpoints: transformers' fine-grained "fp8" quantization (Qwen3-*-FP8, DeepSeek-V3 style),
// read by dequantizing. config.json carries
//   "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
//                           "weight_block_size": [128, 128]}
// and each quantized linear weight W (rows, cols) is an F8_E4M3 tensor beside an F32 / BF16
// tensor "<name>_scale_inv" of ⌈rows/128⌉ × ⌈cols/128⌉ block scales: W = fp8(W) · scale_inv of
// its block. Embeddings, norms and the LM head stay 16-bit. Forge multiplies in f32, as
// transformers' dequantizing path does, and from then on the model is an ordinary one: it
// computes and saves in its own precisions (a save has no quantization_config).
//
// Refused, each with one line naming it: any other quant_method (bitsandbytes, GPTQ, AWQ, ...),
// another fmt, static activation scales (their input_scale tensors quantize activations, which
// Forge does not), a weight_block_size that is not two positive integers.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace forge {

struct Fp8Blocks {
  int rows = 0, cols = 0;  // weight_block_size; 0: not an FP8 checkpoint
  explicit operator bool() const { return rows > 0; }
};

// config.json's quantization_config: none gives {}; the FP8 scheme above its block size;
// anything else throws forge::Error "quantization_config: ..." naming what is not supported.
Fp8Blocks fp8_quantization(const nlohmann::json& config);

// The block-scale tensor's name for a quantized weight's name.
inline std::string fp8_scale_name(const std::string& weight) { return weight + "_scale_inv"; }

// w (rows, cols), decoded from FP8, times its block's scale: s is (⌈rows/b.rows⌉, ⌈cols/b.cols⌉).
void apply_fp8_block_scales(float* w, int64_t rows, int64_t cols, const float* s, Fp8Blocks b);

// "FP8 weights (E4M3, 128x128 blocks), dequantized to f32 on load": what forge inspect lists.
std::string fp8_feature(Fp8Blocks b);

}  // namespace forge
