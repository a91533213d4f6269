// Scaled dot-product attention, naive reference (materialises the T×T probabilities).
// q (B, T, NH, HS); k, v (B, T, NKV, HS); NH % NKV == 0 and query head h reads kv head
// h / (NH / NKV) (grouped-query attention by index, no copies). Scale 1/sqrt(HS).
// causal: query i sees keys j ≤ i. window > 0 (sliding window, Mistral): additionally
// j > i − window. window 0 = unlimited.
#pragma once

namespace forge {

struct AttentionShape {
  int B, T, NH, NKV, HS;
  bool causal = true;
  int window = 0;
};

}  // namespace forge

namespace forge::cpu {

// out (B, T, NH, HS); att (B, NH, T, T) receives the probabilities (0 where masked), kept for
// the backward. A row with no visible key (not possible with causal masking) gets zeros.
template <typename T>
void attention_fwd(T* out, T* att, const T* q, const T* k, const T* v, const AttentionShape& s);

// Accumulates (+=) into dq (B, T, NH, HS), dk and dv (B, T, NKV, HS).
template <typename T>
void attention_bwd(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                   const T* att, const AttentionShape& s);

}  // namespace forge::cpu
