// Elementwise activations and the residual add.
#pragma once

#include <cstdint>

namespace forge::cpu {

// GELU, tanh form (GPT-2's "gelu_new"): 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
template <typename T>
void gelu_fwd(T* out, const T* inp, int64_t n);
// Accumulates (+=) dinp.
template <typename T>
void gelu_bwd(T* dinp, const T* inp, const T* dout, int64_t n);

// SwiGLU gate: out = silu(gate) · up, silu(z) = z·σ(z).
template <typename T>
void swiglu_fwd(T* out, const T* gate, const T* up, int64_t n);
// Writes dgate and dup (not +=: the model's only caller had zeroed both first, two passes over
// (N, FF) and a read of each in the op, ~3 ms of a SmolLM2-135M step on the H200).
template <typename T>
void swiglu_bwd(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t n);
// The same over `rows` rows of `ff` elements whose gate, up, dgate and dup rows lie `ld` elements
// apart (out and dout are dense (rows, ff)): the halves of one fused gate|up product, (rows, 2·ff)
// with ld = 2·ff. Element for element the same arithmetic as the dense ops, so the same bits.
template <typename T>
void swiglu_fwd_rows(T* out, const T* gate, const T* up, int64_t rows, int ff, int64_t ld);
template <typename T>
void swiglu_bwd_rows(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t rows, int ff,
                     int64_t ld);

// out = a + b (out may alias a or b).
template <typename T>
void residual_fwd(T* out, const T* a, const T* b, int64_t n);
// Accumulates (+=) dout into da and db.
template <typename T>
void residual_bwd(T* da, T* db, const T* dout, int64_t n);

}  // namespace forge::cpu
