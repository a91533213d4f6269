// Fused softmax + cross-entropy over a (possibly padded) vocabulary.
// logits (N, Vp) of which the first V columns are real; the Vp − V padded columns are never
// predicted: they are left out of the softmax and get zero gradient. targets (N) in [0, V) or
// −1 (ignore_index: loss 0, gradient 0). Max-subtracted, sums in double.
#pragma once

#include <cstdint>

namespace forge::cpu {

// losses (N): −log softmax(logits[i, :V])[targets[i]], 0 where ignored.
template <typename T>
void cross_entropy_fwd(T* losses, const T* logits, const int32_t* targets, int N, int V, int Vp);

// dlogits (N, Vp) = dloss · (softmax − onehot(target)) on real columns of non-ignored rows,
// 0 elsewhere. Overwrites (does not accumulate); dlogits may alias logits (in place).
template <typename T>
void cross_entropy_bwd(T* dlogits, const T* logits, const int32_t* targets, T dloss, int N,
                       int V, int Vp);

// The LM head fused with the loss, the CPU twin of cuda::lm_head_cross_entropy: x (N, C) final
// hidden states, w (Vp, C) head weight (its padded rows finite), targets (N), −1 = ignore.
// losses (N) = −log softmax(x·wᵀ)[target] over the first V columns (0 where ignored). With dx
// and dw non-null, also the backward of Σ losses · dloss: dx (N, C) += dloss·(softmax −
// onehot)·w and dw (Vp, C) += its transpose product (dw may be null with dx not: a frozen
// head, LoRA's base, whose product is skipped). The logits exist one fixed chunk of rows
// at a time (the chunk size, not the thread count, sets the order dw is summed in).
template <typename T>
void lm_head_cross_entropy(T* losses, T* dx, T* dw, const T* x, const T* w, const int32_t* targets,
                           T dloss, int N, int C, int V, int Vp);

}  // namespace forge::cpu
