// CLI-level overrides from the environment, read in one place (the library reads none):
//   FORGE_ATTENTION=auto|flash|unfused|flash-mma|flash-wgmma|flash-wgmma-split
//                                                               attention kernels of a GPU run
//   FORGE_QKV=fused|separate                                    separate: the Llama family's q, k, v
//                                                               as three products (A/B comparison)
//   FORGE_CUDA_GRAPH=0|1                                        0: every GPU step runs eagerly
//   FORGE_GEMM_ALGO=heuristic|timed|timed-any                   timed (the default): cuBLASLt's
//                                                               algorithm per shape timed on its
//                                                               first call among those with the
//                                                               heuristic's bits; timed-any:
//                                                               among all (not bit-reproducible
//                                                               across processes)
//   FORGE_FP8=off|rows|rows-e5m2|rows-dx                        rows: the blocks' forward and dX
//                                                               products in FP8, per-row scales
//                                                               (core/fp8_recipe.h; bf16, Hopper);
//                                                               rows-dx: also GPT-2's q|k|v and fc
//                                                               dX
//   FORGE_FAULT_INJECT=nan_grad@STEP,nan_loss@FIRST-LAST,kill@STEP  a testing hook: faults injected
//                                                               into training steps (forge
//                                                               train; train/fault_inject.h)
#pragma once

#include "forge/train/fault_inject.h"
#include "forge/train/runner.h"

namespace forge::cli {

// The default CudaSettings with the environment's overrides; throws forge::Error for a value
// it does not know.
CudaSettings cuda_settings_from_env();

// FORGE_FAULT_INJECT's plan (empty when unset); throws forge::Error for a malformed one.
FaultPlan fault_plan_from_env();

}  // namespace forge::cli
