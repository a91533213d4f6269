// The CUDA twins of the KV-cache decode ops (ops/decode.h): same contracts and layouts, on the
// Context's stream, dtypes kF32, kBF16 and kF16 (void* tensors hold `dt` elements). Every
// per-step value — tokens, positions — is an int32 array in device memory that the kernels read,
// and no op synchronises or allocates, so a decode step captured in a cuda::Graph replays with
// new tokens and positions written into those arrays. No CUDA headers here (ops.h's rule).
#pragma once

#include <cstddef>
#include <cstdint>

#include "forge/core/dtype.h"
#include "forge/ops/decode.h"
#include "forge/ops/rope.h"

namespace forge::cuda {

class Context;

// out (N, C) = wte[tokens[n]] + wpe[pos[n]] (wpe null: token embedding only).
void embedding_at(Context& ctx, DType dt, void* out, const int32_t* tokens, const int32_t* pos,
                  const void* wte, const void* wpe, int N, int C);

// RoPE of row n of x (N, H, HS), `stride` elements between rows (0 = H·HS), to position pos[n],
// in place; rope_fwd's angle method (decode.cu), so it agrees with rope_fwd at t = pos[n].
void rope_at(Context& ctx, DType dt, void* x, const int32_t* pos, int N, int H, int HS,
             const Rope& rope, int64_t stride = 0);

// cache_k, cache_v (S, cap, NKV, HS): row pos[s] % cap of slot s = k[s], v[s] (S, NKV, HS) with
// k_stride, v_stride elements between rows (0 = NKV·HS).
void kv_append(Context& ctx, DType dt, void* cache_k, void* cache_v, const void* k, const void* v,
               const int32_t* pos, const DecodeShape& s, int64_t k_stride = 0,
               int64_t v_stride = 0);

// Head sizes decode_attention supports: 32, 64, 80, 96, 128.
bool decode_attention_supported(int HS);
// Blocks the KV length of one (slot, kv head) is split across, a function of the shape alone
// (so a captured graph stays valid for every position); 1 = no second reduction kernel.
int decode_attention_splits(const DecodeShape& s);
// Scratch decode_attention needs for its per-split partial results and the splits' arrival
// counters (0 when splits = 1). The counters must be zero before the first call (the caller
// zeroes the scratch once when it allocates it); every call leaves them zero.
size_t decode_attention_scratch_bytes(const DecodeShape& s);

// out (S, NH, HS) dense = softmax(q·kᵀ / sqrt(HS))·v of each slot's query row over its cache rows
// [0, min(pos[s] + 1, cap)); q (S, NH, HS) with q_stride elements between rows (0 = NH·HS).
// f32 accumulation. scratch: decode_attention_scratch_bytes(s) bytes of device memory (may be
// null when that is 0); the caches must be 16-byte aligned. Throws forge::Error for a head size
// outside decode_attention_supported or a bad shape.
void decode_attention(Context& ctx, DType dt, void* out, const void* q, const void* cache_k,
                      const void* cache_v, const int32_t* pos, const DecodeShape& s,
                      int64_t q_stride, void* scratch);

// rope_kv_append (or, rope null, kv_append of the k and v columns) followed by decode_attention
// of the q columns: one kernel on the supported head sizes (decode_attention.cu: q rotated as it
// is read, the new k and v row taken from qkv by the split that holds it and written to the
// cache), else the three ops. qkv (S, stride): q at column 0, k at NH·HS, v at (NH + NKV)·HS;
// its q and k columns are scratch after the call (rotated or not). scratch as decode_attention.
// With PDL on, the kernel may read pos and the caches (all rows but pos % cap) before the kernel
// launched just before it has finished: a PDL-launched kernel that writes them must not sit
// between the previous copy or plain launch in the stream and this call (a decode step's
// kernels do not; advance_positions is a plain launch).
void rope_decode_attention(Context& ctx, DType dt, void* out, void* qkv, int64_t stride,
                           void* cache_k, void* cache_v, const int32_t* pos, const DecodeShape& s,
                           const Rope* rope, void* scratch);

// The same contract for any head size (decode_generic.cu): one block per query row, scores in
// shared memory (cap <= 51,200 rows), untuned. CudaBackend uses it where
// decode_attention_supported(HS) is false. No scratch.
void decode_attention_generic(Context& ctx, DType dt, void* out, const void* q, const void* cache_k,
                              const void* cache_v, const int32_t* pos, const DecodeShape& s,
                              int64_t q_stride);

// rope_at(q) + rope_at(k) + kv_append in one kernel (decode_fused.cu); contract in ops/decode.h.
void rope_kv_append(Context& ctx, DType dt, void* qkv, int64_t stride, void* cache_k, void* cache_v,
                    const int32_t* pos, const DecodeShape& s, const Rope& rope);

// pos[s] = min(pos[s] + 1, limit) for s < S, on the device.
void advance_positions(Context& ctx, int32_t* pos, int S, int32_t limit);

// Shared by the decode .cu files: a one-line error for a bad shape; a row stride (0 = width)
// checked against the row's width.
void check_decode_shape(const DecodeShape& s, const char* op);
int64_t decode_row_stride(int64_t stride, int64_t width, const char* op, const char* what);

}  // namespace forge::cuda
