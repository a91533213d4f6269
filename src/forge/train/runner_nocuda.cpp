// make_cuda_runner and make_lora_cuda_runner for builds without the CUDA backend.
#include "forge/backend/cuda/runtime.h"
#include "forge/core/error.h"
#include "forge/train/runner.h"

#ifndef FORGE_HAVE_CUDA
namespace forge {

std::unique_ptr<StepRunner> make_cuda_runner(const ModelConfig&, const std::string&,
                                             const CudaSettings&, Communicator*) {
  throw Error("--device cuda: " + cuda::device_summary());
}

std::unique_ptr<StepRunner> make_lora_cuda_runner(const Model<CpuBackend<float>>&, const std::string&,
                                                  const CudaSettings&, Communicator*) {
  throw Error("--device cuda: " + cuda::device_summary());
}

}  // namespace forge
#endif
