// What every build can ask about CUDA, whether or not the CUDA backend was compiled in
// (runtime.cu when it was, runtime_stub.cpp when it was not). Nothing here needs CUDA headers.
#pragma once

#include <string>

namespace forge::cuda {

// True when the CUDA backend is compiled in.
bool compiled();
// True when compiled in and at least one device is usable. Never throws.
bool available();
// "NVIDIA H200 (sm_90, 132 SMs, 139.7 GiB)" or why there is no device.
std::string device_summary();

}  // namespace forge::cuda
