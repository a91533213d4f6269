// Rotary position embedding, applied in place to q or k laid out (B, T, H, HS).
// Frequencies: inv_freq_i = base^(−2i/HS), i in [0, HS/2), then rescaled as Rope::scaling says;
// angle = (pos0 + t) · inv_freq_i. Two pairings of the HS channels:
//  - kRotateHalf: channel i pairs with i + HS/2 (Hugging Face Llama / Mistral / Qwen / SmolLM2
//    weights are stored for this one);
//  - kInterleaved: channel 2i pairs with 2i + 1 (GPT-J / Meta's original Llama code).
// Each pair (x0, x1) → (x0·cos − x1·sin, x0·sin + x1·cos).
#pragma once

#include <cstdint>
#include <vector>

namespace forge {

enum class RopeStyle { kRotateHalf, kInterleaved };

// Hugging Face's rope_type values that Forge computes exactly (transformers'
// modeling_rope_utils): none ("default"), "linear" (inv_freq / factor), "llama3" (Llama 3.1's
// wavelength-dependent blend), "dynamic" (NTK-aware; within original_max_positions — the only
// contexts Forge runs such a model at — it is the unscaled default).
enum class RopeScaling { kNone, kLinear, kLlama3, kDynamic };

// Everything an op needs to know about RoPE: aggregate, so Rope{theta, style} reads as before.
struct Rope {
  float theta = 10000.0f;  // base
  RopeStyle style = RopeStyle::kRotateHalf;
  RopeScaling scaling = RopeScaling::kNone;
  float factor = 1.0f;                 // linear, llama3, dynamic
  float low_freq_factor = 1.0f;        // llama3
  float high_freq_factor = 4.0f;       // llama3
  int original_max_positions = 0;      // llama3, dynamic: the pretraining context
};

// inv_freq_i (HS/2 values) in double, with the scaling applied: the one place the frequencies
// are computed, for every backend (the GPU kernels take this table from the host).
std::vector<double> rope_inv_freq(const Rope& rope, int HS);

}  // namespace forge

namespace forge::cpu {

// RoPE of x (B, T, H, HS) in place, positions pos0 + t, or pos[b, t] when pos (B, T) is given
// (packed rows: positions restarting per example; pos0 is then ignored); frequencies
// rope_inv_freq(rope, HS). ld: elements from one position's H heads to the next's (a view into a
// fused q|k|v row: the elements between are untouched); 0: H·HS (dense).
template <typename T>
void rope_fwd(T* x, int B, int T_, int H, int HS, const Rope& rope, int pos0 = 0,
              const int32_t* pos = nullptr, int64_t ld = 0);

// The backward of a rotation is the inverse rotation, also in place on dx (B, T, H, HS).
template <typename T>
void rope_bwd(T* dx, int B, int T_, int H, int HS, const Rope& rope, int pos0 = 0,
              const int32_t* pos = nullptr, int64_t ld = 0);

// rope_bwd of dx (B, T, H, HS) in place (pos0 = 0), then dbias (H·HS) += Σ_(b,t) dx[b, t, :]: the
// bias gradient of the q or k projection (Qwen2), one op with the rotation so that the GPU
// takes it from the rotation's pass (cuda::rope_bias_bwd). dbias nullptr: rope_bwd alone. ld: the
// row stride of dx (a view into a fused q|k|v row), 0: H·HS.
template <typename T>
void rope_bias_bwd(T* dx, T* dbias, int B, int T_, int H, int HS, const Rope& rope,
                   const int32_t* pos = nullptr, int64_t ld = 0);

}  // namespace forge::cpu
