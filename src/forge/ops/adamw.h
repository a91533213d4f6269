// AdamW over a flat buffer, PyTorch-exact (torch.optim.AdamW, foreach=False):
//   p ← p·(1 − lr·wd);  m ← m + (1−β1)(g − m);  v ← β2·v + (1−β2)·g²
//   p ← p − (lr / (1−β1ᵗ)) · m / (sqrt(v)/sqrt(1−β2ᵗ) + eps)
// t is 1-based; eps outside the sqrt; decay decoupled (the caller passes wd = 0 for 1-D
// tensors: biases and norm gains). g = grad · grad_scale (clipping and loss-scale folded in).
#pragma once

#include <cstdint>

namespace forge {

struct AdamWParams {
  float lr = 3e-4f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;
  int64_t step = 1;         // t, 1-based
  float grad_scale = 1.0f;  // multiplies every gradient element before use
};

// The scalars of one f32 update, computed on the host in double exactly as adamw_update does and
// rounded once to f32. The CUDA kernel reads them from device memory rather than taking them as
// arguments, so a captured CUDA graph replays with each step's lr and t.
struct AdamWFactors {
  float decay;                  // 1 − lr·wd
  float one_minus_beta1;        // 1 − β1
  float beta2;                  // β2
  float one_minus_beta2;        // 1 − β2
  float step_size;              // lr / (1 − β1ᵗ)
  float bias_correction2_sqrt;  // sqrt(1 − β2ᵗ)
  float eps;
  float grad_scale;
  uint64_t sr_seed;  // CUDA: stochastic rounding of a bf16 working copy (0: round to nearest)
  // What step_size and bias_correction2_sqrt were made of, for f16 loss scaling: after skipped
  // steps the CUDA kernel recomputes both with t − (steps skipped), as PyTorch's GradScaler,
  // which skips optimizer.step() and so Adam's t, would (ops/loss_scale.h).
  float lr;
  float beta1;
  int64_t step;  // t
};
AdamWFactors adamw_factors(const AdamWParams& p, uint64_t sr_seed = 0);

}  // namespace forge

namespace forge::cpu {

template <typename T>
void adamw_update(T* param, T* m, T* v, const T* grad, int64_t n, const AdamWParams& p);

}  // namespace forge::cpu
