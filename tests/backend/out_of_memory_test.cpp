// The GPU out-of-memory line (backend/out_of_memory.h), which the CUDA allocator throws and the
// CUDA checks print: one line with the bytes asked for, the device's use and total as
// cudaMemGetInfo reports them, and the settings to lower. Host code: it runs in the CPU build.
#include "forge/backend/out_of_memory.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

namespace forge {
namespace {

TEST(OutOfMemoryMessage, NamesTheRequestTheDeviceUseAndWhatToLower) {
  DeviceMemoryReport r;
  r.device = 1;
  r.requested = size_t{3} << 30;
  r.total_bytes = size_t{140} << 30;
  r.free_bytes = size_t{1} << 29;  // 139.5 GiB in use
  r.forge_bytes = size_t{120} << 30;
  const std::string m = out_of_memory_message(r);
  EXPECT_EQ(std::count(m.begin(), m.end(), '\n'), 0) << m;
  for (const char* needle :
       {"CUDA out of memory on device 1: ", "asked for 3.00 GiB (3221225472 bytes)",
        "139.50 GiB of 140.00 GiB in use", "(forge holds 120.00 GiB)", "batch_size", "--batch",
        "seq_len", "--seq-len", "grad_accum", "recompute=mlp, attn or full", "--precision bf16"})
    EXPECT_NE(m.find(needle), std::string::npos) << needle << "\n" << m;
}

// Inside a library call the size is not known: the call is named instead, and Forge's own
// share is left out when the caller does not know it.
TEST(OutOfMemoryMessage, WithoutASizeItNamesTheCall) {
  DeviceMemoryReport r;
  r.where = "cudaGraphInstantiate(&exec_, graph, 0)";
  r.total_bytes = size_t{80} << 30;
  r.free_bytes = size_t{80} << 30;
  const std::string m = out_of_memory_message(r);
  EXPECT_NE(m.find("an allocation failed in cudaGraphInstantiate(&exec_, graph, 0); 0.00 GiB of "
                   "80.00 GiB in use;"),
            std::string::npos)
      << m;
  EXPECT_EQ(m.find("asked for"), std::string::npos) << m;
  EXPECT_EQ(m.find("forge holds"), std::string::npos) << m;
}

}  // namespace
}  // namespace forge
