// Dynamic loss scaling for f16 training (PyTorch's GradScaler; the seeds' section 7): the loss
// gradient is multiplied by `scale` so that small activation gradients do not flush to zero in
// f16 (smallest subnormal 6e-8); AdamW divides it back out before clipping. When the scaled
// gradients overflowed (Σ g² is inf or NaN) the step is skipped — weights and Adam moments are
// left untouched — and the scale halves; after `growth_interval` finite steps in a row it
// doubles. bf16 and f32 have f32's exponent range and need none of this.
//
// The state lives in device memory and is updated by a one-thread kernel after AdamW, so the
// step stays free of host syncs and replays as a CUDA graph; loss_scale_update() below is that
// kernel's body, and the CPU twin the tests compare against.
#pragma once

#include <cmath>
#include <cstdint>

#include "forge/core/host_device.h"

namespace forge {

struct LossScaleOptions {
  float init_scale = 65536.0f;  // 2^16, PyTorch's default
  int growth_interval = 2000;   // finite steps in a row before the scale doubles
};

// 32 bytes, read by every AdamW thread and copied back to the host with each step's report.
struct LossScaleState {
  float scale = 65536.0f;    // what the next step's dloss is multiplied by (a power of two)
  float step_scale = 0.0f;   // the scale the last updated step's gradients carried
  int32_t good_steps = 0;    // finite steps since the scale last changed
  int32_t skipped = 0;       // 1: the last updated step overflowed and was skipped
  int32_t skipped_total = 0; // steps skipped so far: Adam's t lags the step count by this much
  int32_t growth_interval = 2000;
  int32_t pad[2] = {0, 0};
};

inline LossScaleState loss_scale_init(const LossScaleOptions& o) {
  LossScaleState s;
  s.scale = o.init_scale;
  s.growth_interval = o.growth_interval;
  return s;
}

// After a step whose scaled gradients had Σ g² = sum_sq. Powers of two stay exact under the
// halving and doubling, so unscaling (a division by `scale`) loses nothing.
FORGE_HOST_DEVICE inline void loss_scale_update(LossScaleState& s, float sum_sq) {
  s.step_scale = s.scale;
#if defined(__CUDA_ARCH__)
  const bool finite = isfinite(sum_sq);
#else
  const bool finite = std::isfinite(sum_sq);
#endif
  if (!finite) {
    s.scale *= 0.5f;
    s.good_steps = 0;
    s.skipped = 1;
    ++s.skipped_total;
    return;
  }
  s.skipped = 0;
  if (++s.good_steps >= s.growth_interval) {
    s.scale *= 2.0f;
    s.good_steps = 0;
  }
}

}  // namespace forge
