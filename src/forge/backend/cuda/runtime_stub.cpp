// Built instead of runtime.cu when Forge is configured without CUDA.
#include "forge/backend/cuda/runtime.h"

namespace forge::cuda {

bool compiled() { return false; }
bool available() { return false; }
std::string device_summary() { return "no CUDA: this forge was built without nvcc"; }

}  // namespace forge::cuda
