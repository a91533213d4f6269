// The numerical guard of a training step: a step whose loss or global gradient norm is not
// finite (inf or NaN) does not update anything — weights, Adam's m and v stay bit for bit — and
// is counted. Adam's t counts the updates taken, so after k skipped steps step s uses
// t = s + 1 − k, as PyTorch's does when a step's optimizer.step() is not called (the f16 loss
// scaler's skips, ops/loss_scale.h, subtract the same way; the two counts never overlap).
//
// The CUDA runner queues its steps without host syncs and reads a step's loss one step late,
// so the decision is made on the device: a one-thread kernel writes this state after Σ g² and
// before AdamW, every AdamW thread reads `skipped`, and the kernel's t subtracts
// `skipped_total`. step_guard_update() is that kernel's body and the CPU runner's rule.
#pragma once

#include <cmath>
#include <cstdint>

#include "forge/ops/loss_scale.h"  // FORGE_HOST_DEVICE

namespace forge {

struct StepGuardState {
  int32_t skipped = 0;        // 1: the last guarded step's update was skipped
  int32_t skipped_total = 0;  // updates skipped so far by the guard
};

FORGE_HOST_DEVICE inline bool step_guard_finite(double x) {
#if defined(__CUDA_ARCH__)
  return isfinite(x);
#else
  return std::isfinite(x);
#endif
}

// After a step with per-micro-batch loss sums `losses` (n) and Σ g² = sum_sq. With f16 loss
// scaling (`loss_scaled`) a non-finite Σ g² with finite losses is an overflow that the loss
// scaler owns (it skips the update and halves the scale), so only the losses are checked here.
FORGE_HOST_DEVICE inline void step_guard_update(StepGuardState& s, const double* losses, int n,
                                                float sum_sq, bool loss_scaled) {
  bool finite = loss_scaled || step_guard_finite(sum_sq);
  for (int i = 0; i < n; ++i) finite = finite && step_guard_finite(losses[i]);
  s.skipped = finite ? 0 : 1;
  if (!finite) ++s.skipped_total;
}

}  // namespace forge
