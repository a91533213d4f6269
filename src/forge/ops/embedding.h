// Token (+ learned position) embedding.
#pragma once

#include <cstdint>

namespace forge::cpu {

// out (B, T, C) = wte[tokens[b, t]] + wpe[p(b, t)]. wte (V, C); wpe (maxT, C) or null (Llama: no
// learned positions). tokens (B, T) must be in [0, V): the data layer checks ids on load.
// Positions p: pos (B, T) when given (packed rows: restarting per example, in [0, maxT)), else t.
template <typename T>
void embedding_fwd(T* out, const int32_t* tokens, const T* wte, const T* wpe, int B, int T_,
                   int C, const int32_t* pos = nullptr);

// Accumulates (+=): dwte (V, C) gathers dout rows by token; dwpe (maxT, C) sums over the batch
// (dwpe may be null) at the positions the forward used (pos, or t). Deterministic: a fixed
// order, no atomics.
template <typename T>
void embedding_bwd(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int B, int T_, int C,
                   const int32_t* pos = nullptr);

}  // namespace forge::cpu
