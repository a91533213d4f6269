// CLI-level overrides from the environment, read in one place (the library reads none):
//   FORGE_ATTENTION=auto|flash|unfused|flash-mma|flash-wgmma   attention kernels of a GPU run
//   FORGE_CUDA_GRAPH=0|1                                        0: every GPU step runs eagerly
#pragma once

#include "forge/train/runner.h"

namespace forge::cli {

// The default CudaSettings with the environment's overrides; throws forge::Error for a value
// it does not know.
CudaSettings cuda_settings_from_env();

}  // namespace forge::cli
