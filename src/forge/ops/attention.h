// Scaled dot-product attention: the naive reference (materialises the T×T probabilities) and the
// CPU twin of the flash kernels (saves one log-sum-exp per row and recomputes P backward).
// q (B, T, NH, HS); k, v (B, T, NKV, HS); NH % NKV == 0 and query head h reads kv head
// h / (NH / NKV) (grouped-query attention by index, no copies). Scale 1/sqrt(HS).
// causal: query i sees keys j ≤ i. window > 0 (sliding window, Mistral): additionally
// j > i − window. window 0 = unlimited.
// Segments (packed rows, several examples in one row): seg (B, T) gives each token a segment id,
// a segment being a run of equal ids in a row; query i then also sees only keys of its own
// segment (j ≥ the segment's first token), so causality and the window hold within a segment.
#pragma once

#include <cstdint>

namespace forge {

struct AttentionShape {
  int B, T, NH, NKV, HS;
  bool causal = true;
  int window = 0;
};

// Token strides: elements between consecutive tokens of one tensor, so q, k and v may be column
// slices of one fused (B, T, 3C) qkv buffer (GPT-2). 0 = dense: NH·HS for q and out, NKV·HS for
// k and v. dq, dk, dv use the strides of q, k, v; dout uses out's.
struct AttentionStrides {
  int64_t q = 0, k = 0, v = 0, o = 0;
};

// Which attention kernels a GPU run uses, a setting of the run: kAuto = the flash kernels where
// the dtype and head size allow them (Hopper's wgmma kernels for head sizes 64 and 128, mma.sync
// otherwise) and the unfused path elsewhere (fp32: exact parity with the CPU); the others force
// one path, for comparisons (kFlashWgmma where it cannot run is refused). kFlashWgmmaSplit: the
// wgmma kernels with head size 64's backward as two kernels (dQ; dK, dV) instead of one, the
// comparison for the one-kernel backward. The CPU always runs its flash twin.
enum class AttentionPath { kAuto, kUnfused, kFlashMma, kFlashWgmma, kFlashWgmmaSplit };

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

// The CPU twin of cuda::flash_attention_fwd/bwd: the same contract, which is what the model runs
// on either backend. out (B, T, NH, HS); lse (B, NH, T) = ln Σ_visible exp(q·k/sqrt(HS)) per
// query row (lowest() for a row with no visible key, whose output is 0). q, k, v and out may be
// strided views (AttentionStrides). probs (B, NH, T, T), when non-null, also receives the
// probabilities of the visible keys (masked entries are left as they were). seg (B, T), when
// non-null, masks keys of other segments (see the top of this file).
template <typename T>
void flash_attention_fwd(T* out, T* lse, const T* q, const T* k, const T* v, const AttentionShape& s,
                         const AttentionStrides& st = {}, T* probs = nullptr, const int32_t* seg = nullptr);

// Writes (does not accumulate) dq, dk, dv, recomputing the probabilities from q, k and lse, or
// reading them from probs (what the forward wrote) when non-null. seg: the forward's.
template <typename T>
void flash_attention_bwd(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                         const T* out, const T* lse, const AttentionShape& s,
                         const AttentionStrides& st = {}, const T* probs = nullptr,
                         const int32_t* seg = nullptr);

}  // namespace forge::cpu
