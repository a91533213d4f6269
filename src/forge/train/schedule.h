// Learning-rate schedule: linear warm-up, then cosine decay to min_lr_frac · lr (llm.c /
// nanoGPT). Warm-up uses (step + 1) / warmup so step 0 already takes a (small) step.
#pragma once

#include <cmath>

namespace forge {

struct LrSchedule {
  double lr = 1e-3;
  int warmup_steps = 0;
  int total_steps = 1;
  double min_lr_frac = 0.1;

  double at(int step) const {
    if (step < warmup_steps) return lr * (step + 1) / warmup_steps;
    const double min_lr = lr * min_lr_frac;
    if (total_steps <= warmup_steps) return lr;
    double ratio = static_cast<double>(step - warmup_steps) / (total_steps - warmup_steps);
    ratio = ratio < 0 ? 0 : (ratio > 1 ? 1 : ratio);
    return min_lr + 0.5 * (1.0 + std::cos(M_PI * ratio)) * (lr - min_lr);
  }
};

}  // namespace forge
