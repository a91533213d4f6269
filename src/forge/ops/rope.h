// Rotary position embedding, applied in place to q or k laid out (B, T, H, HS).
// Frequencies: inv_freq_i = base^(−2i/HS), i in [0, HS/2); angle = (pos0 + t) · inv_freq_i.
// Two pairings of the HS channels:
//  - kRotateHalf: channel i pairs with i + HS/2 (Hugging Face Llama / Mistral / SmolLM2 weights
//    are stored for this one);
//  - kInterleaved: channel 2i pairs with 2i + 1 (GPT-J / Meta's original Llama code).
// Each pair (x0, x1) → (x0·cos − x1·sin, x0·sin + x1·cos).
#pragma once

namespace forge {

enum class RopeStyle { kRotateHalf, kInterleaved };

}  // namespace forge

namespace forge::cpu {

template <typename T>
void rope_fwd(T* x, int B, int T_, int H, int HS, float base, RopeStyle style, int pos0 = 0);

// The backward of a rotation is the inverse rotation, also in place on dx (B, T, H, HS).
template <typename T>
void rope_bwd(T* dx, int B, int T_, int H, int HS, float base, RopeStyle style, int pos0 = 0);

}  // namespace forge::cpu
