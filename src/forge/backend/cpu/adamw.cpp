// CPU AdamW, PyTorch-exact (torch.optim.AdamW, foreach=False, capturable=False).
// PyTorch computes the scalar factors on the host in Python floats (double): the decay factor
// 1 − lr·wd, the bias corrections 1 − β1ᵗ and 1 − β2ᵗ, step_size = lr / (1 − β1ᵗ) and
// sqrt(1 − β2ᵗ). We do the same once, outside the loop, and round each to T where it meets a
// tensor, then apply the element update in T in PyTorch's order:
//   p ← p·(1 − lr·wd)                                     (param.mul_)
//   m ← m + (1 − β1)·(g − m)                              (exp_avg.lerp_, weight < 0.5 branch)
//   v ← v·β2 + (1 − β2)·g·g                               (exp_avg_sq.mul_().addcmul_())
//   p ← p − step_size·m / (sqrt(v) / sqrt(1 − β2ᵗ) + eps) (param.addcdiv_)
// Elements are independent, so the parallel loop is deterministic.
#include "forge/ops/adamw.h"

#include <cmath>

#include "forge/core/error.h"

namespace forge::cpu {

template <typename T>
void adamw_update(T* param, T* m, T* v, const T* grad, int64_t n, const AdamWParams& p) {
  FORGE_CHECK(p.step >= 1, "[adamw_update] step is 1-based, got ", p.step);
  const double lr = p.lr, beta1 = p.beta1, beta2 = p.beta2;
  const double t = static_cast<double>(p.step);
  const double bias_correction1 = 1.0 - std::pow(beta1, t);
  const double bias_correction2 = 1.0 - std::pow(beta2, t);
  const T decay = static_cast<T>(1.0 - lr * static_cast<double>(p.weight_decay));
  const T one_minus_beta1 = static_cast<T>(1.0 - beta1);
  const T beta2_t = static_cast<T>(beta2);
  const T one_minus_beta2 = static_cast<T>(1.0 - beta2);
  const T step_size = static_cast<T>(lr / bias_correction1);
  const T bias_correction2_sqrt = static_cast<T>(std::sqrt(bias_correction2));
  const T eps = static_cast<T>(p.eps);
  const T grad_scale = static_cast<T>(p.grad_scale);
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i) {
    const T g = grad[i] * grad_scale;
    const T pi = param[i] * decay;
    const T mi = m[i] + one_minus_beta1 * (g - m[i]);
    const T vi = v[i] * beta2_t + one_minus_beta2 * g * g;
    const T denom = std::sqrt(vi) / bias_correction2_sqrt + eps;
    param[i] = pi - step_size * mi / denom;
    m[i] = mi;
    v[i] = vi;
  }
}

template void adamw_update<float>(float*, float*, float*, const float*, int64_t,
                                  const AdamWParams&);
template void adamw_update<double>(double*, double*, double*, const double*, int64_t,
                                   const AdamWParams&);

}  // namespace forge::cpu

namespace forge {

AdamWFactors adamw_factors(const AdamWParams& p, uint64_t sr_seed) {
  FORGE_CHECK(p.step >= 1, "[adamw_factors] step is 1-based, got ", p.step);
  // Term for term the expressions of adamw_update above, with T = float.
  const double lr = p.lr, beta1 = p.beta1, beta2 = p.beta2;
  const double t = static_cast<double>(p.step);
  const double bias_correction1 = 1.0 - std::pow(beta1, t);
  const double bias_correction2 = 1.0 - std::pow(beta2, t);
  AdamWFactors f{};
  f.decay = static_cast<float>(1.0 - lr * static_cast<double>(p.weight_decay));
  f.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  f.beta2 = static_cast<float>(beta2);
  f.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  f.step_size = static_cast<float>(lr / bias_correction1);
  f.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  f.eps = p.eps;
  f.grad_scale = p.grad_scale;
  f.sr_seed = sr_seed;
  f.lr = p.lr;
  f.beta1 = p.beta1;
  f.step = p.step;
  return f;
}

}  // namespace forge
