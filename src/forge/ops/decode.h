// Inference over a KV cache: the ops of a one-token decode step (Model::decode_step in
// model/transformer.h). The CUDA twins (backend/cuda/decode.h) read every per-step value —
// tokens, positions — from device memory, so a captured CUDA graph replays each step unchanged.
//
// The cache of one layer is two tensors k, v (S, cap, NKV, HS): S slots (one sequence each), cap
// rows per slot, KV heads only (grouped-query attention reads kv head h / (NH / NKV) for query
// head h, as in training). The token at position p of slot s lives in row p % cap: a ring when
// the model has a sliding window and cap = window (Mistral), otherwise the caller keeps p < cap.
// Either way slot s at position p sees rows [0, min(p + 1, cap)) — exactly the keys the training
// attention lets position p see — and the order of the rows does not matter to attention.
//
// One decode step has one row per slot: row s is slot s's next token, at position pos[s].
#pragma once

#include <cstdint>

#include "forge/ops/rope.h"

namespace forge {

struct DecodeShape {
  int S;    // slots (decode rows)
  int NH;   // query heads
  int NKV;  // kv heads, NH % NKV == 0
  int HS;   // head size
  int cap;  // cache rows per slot
};

}  // namespace forge

namespace forge::cpu {

// out (N, C) = wte[tokens[n]] + wpe[pos[n]] (wpe null: token embedding only). Ids and positions
// are the caller's to check.
template <typename T>
void embedding_at(T* out, const int32_t* tokens, const int32_t* pos, const T* wte, const T* wpe, int N, int C);

// RoPE of row n of x to position pos[n], in place: x (N, H, HS) with `stride` elements between
// consecutive rows (0 = H·HS, dense), so q and k may be column slices of one fused projection.
// The same rotation (both pairings, the same frequencies, angles in double) as cpu::rope_fwd at
// t = pos[n].
template <typename T>
void rope_at(T* x, const int32_t* pos, int N, int H, int HS, const Rope& rope, int64_t stride = 0);

// cache_k[s, pos[s] % cap] = k[s] and cache_v[s, pos[s] % cap] = v[s] for s < S: k, v (S, NKV, HS)
// with k_stride, v_stride elements between rows (0 = NKV·HS).
template <typename T>
void kv_append(T* cache_k, T* cache_v, const T* k, const T* v, const int32_t* pos, const DecodeShape& s,
               int64_t k_stride = 0, int64_t v_stride = 0);

// out (S, NH, HS) dense = softmax(q·kᵀ / sqrt(HS)) · v of each slot's query row over its cache rows
// [0, min(pos[s] + 1, cap)); q (S, NH, HS) with q_stride elements between rows (0 = NH·HS).
// Accumulation in T (double on the CPU's double path), max-subtracted softmax.
template <typename T>
void decode_attention(T* out, const T* q, const T* cache_k, const T* cache_v, const int32_t* pos,
                      const DecodeShape& s, int64_t q_stride = 0);

// rope_at of the q (NH heads) and k (NKV heads) of every row at pos[s], then kv_append of k and v:
// one op, as one step of a Llama decode does them. qkv (S, ·) is the fused projection with
// `stride` elements per row: q at column 0, k at NH·HS, v at (NH + NKV)·HS. q and k are rotated
// in place. The CPU composes the three ops; the GPU runs one kernel (backend/cuda/decode_fused.cu).
template <typename T>
void rope_kv_append(T* qkv, int64_t stride, T* cache_k, T* cache_v, const int32_t* pos,
                    const DecodeShape& s, const Rope& rope);

// pos[s] = min(pos[s] + 1, limit) for s < S: the step after a decode (finished slots may keep
// running in a captured graph; the clamp keeps their positions inside the tables).
void advance_positions(int32_t* pos, int S, int32_t limit);

}  // namespace forge::cpu
