#include "run_env.h"

#include <cstdlib>
#include <optional>
#include <string>

#include "forge/core/error.h"

namespace forge::cli {

namespace {

// A two-valued setting: nullopt when `name` is unset, false for `off`, true for `on`; any other
// value is a one-line error naming both.
std::optional<bool> env_switch(const char* name, const char* off, const char* on) {
  const char* e = std::getenv(name);
  if (e == nullptr) return std::nullopt;
  const std::string v = e;
  if (v != off && v != on) throw Error(str(name, "=", quote(v), " (expected ", off, " or ", on, ")"));
  return v == on;
}

}  // namespace

CudaSettings cuda_settings_from_env() {
  CudaSettings s;
  if (const char* a = std::getenv("FORGE_ATTENTION")) s.attention = parse_attention_path(a);
  if (const auto g = env_switch("FORGE_CUDA_GRAPH", "0", "1")) s.graphs = *g;
  if (const auto h = env_switch("FORGE_HEAD_NORM_ROPE", "head", "position"))
    s.head_norm_rope = *h ? HeadNormRopeSplit::kPerPosition : HeadNormRopeSplit::kPerHead;
  if (const auto a = env_switch("FORGE_ADAMW", "tensor", "multi")) s.multi_tensor_adamw = *a;
  if (const auto w = env_switch("FORGE_WGRAD_FINISH", "kernel", "fused")) s.fused_wgrad_finish = *w;
  return s;
}

FaultPlan fault_plan_from_env() {
  const char* spec = std::getenv("FORGE_FAULT_INJECT");
  if (spec == nullptr) return {};
  try {
    return parse_fault_plan(spec);
  } catch (const Error& e) {
    throw Error(str("FORGE_FAULT_INJECT: ", e.what()));
  }
}

}  // namespace forge::cli
