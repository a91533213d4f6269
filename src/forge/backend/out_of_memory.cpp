#include "forge/backend/out_of_memory.h"

#include <cstdio>

#include "forge/core/error.h"

namespace forge {

namespace {

std::string gib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f GiB", static_cast<double>(bytes) / 1073741824.0);
  return buf;
}

}  // namespace

std::string out_of_memory_message(const DeviceMemoryReport& r) {
  const std::string asked =
      r.requested > 0 ? str("asked for ", gib(r.requested), " (", r.requested, " bytes)")
                      : str("an allocation failed", r.where.empty() ? "" : " in " + r.where);
  const size_t used = r.total_bytes >= r.free_bytes ? r.total_bytes - r.free_bytes : 0;
  return str("CUDA out of memory on device ", r.device, ": ", asked, "; ", gib(used), " of ",
             gib(r.total_bytes), " in use",
             r.forge_bytes > 0 ? str(" (forge holds ", gib(r.forge_bytes), ")") : std::string(),
             "; lower batch_size / --batch or seq_len / --seq-len (grad_accum keeps the tokens "
             "per step), train with recompute=mlp, attn or full (the backward recomputes "
             "activations), or train in --precision bf16 instead of fp32");
}

}  // namespace forge
