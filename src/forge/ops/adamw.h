// AdamW over a flat buffer, PyTorch-exact (torch.optim.AdamW, foreach=False):
//   p ← p·(1 − lr·wd);  m ← m + (1−β1)(g − m);  v ← β2·v + (1−β2)·g²
//   p ← p − (lr / (1−β1ᵗ)) · m / (sqrt(v)/sqrt(1−β2ᵗ) + eps)
// t is 1-based; eps outside the sqrt; decay decoupled (the caller passes wd = 0 for 1-D
// tensors: biases and norm gains). g = grad · grad_scale (clipping and loss-scale folded in).
#pragma once

#include <cstdint>

namespace forge::cpu {

struct AdamWParams {
  float lr = 3e-4f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;
  int64_t step = 1;         // t, 1-based
  float grad_scale = 1.0f;  // multiplies every gradient element before use
};

template <typename T>
void adamw_update(T* param, T* m, T* v, const T* grad, int64_t n, const AdamWParams& p);

}  // namespace forge::cpu
