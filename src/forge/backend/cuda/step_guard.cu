// The numerical guard's kernel and the fault-injection hook (ops.h, ops/step_guard.h): one
// thread each, a few microseconds per step, enqueued inside the step a CUDA graph captures.
#include <cuda_runtime.h>

#include "forge/backend/cuda/check.h"
#include "forge/backend/cuda/context.h"
#include "forge/backend/cuda/ops.h"
#include "forge/core/error.h"

namespace forge::cuda {
namespace {

__global__ void step_guard_kernel(StepGuardState* state, const double* losses, int n,
                                  const float* global_sq, bool loss_scaled) {
  step_guard_update(*state, losses, n, *global_sq, loss_scaled);
}

__global__ void inject_step_fault_kernel(float* grad, double* loss, const int32_t* faults) {
  if (faults[0] != 0) grad[0] = __int_as_float(0x7fc00000);  // quiet NaN
  if (faults[1] != 0) loss[0] = __longlong_as_double(0x7ff8000000000000ll);
}

}  // namespace

void step_guard_check(Context& ctx, StepGuardState* state, const double* losses, int n,
                      const float* global_sq, bool loss_scaled) {
  FORGE_CHECK(n >= 0 && (n == 0 || losses != nullptr), "[step_guard_check] ", n, " losses");
  step_guard_kernel<<<1, 1, 0, ctx.stream()>>>(state, losses, n, global_sq, loss_scaled);
  FORGE_CUDA_CHECK_LAUNCH();
}

void inject_step_fault(Context& ctx, float* grad, double* loss, const int32_t* faults) {
  inject_step_fault_kernel<<<1, 1, 0, ctx.stream()>>>(grad, loss, faults);
  FORGE_CUDA_CHECK_LAUNCH();
}

}  // namespace forge::cuda
