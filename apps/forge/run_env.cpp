#include "run_env.h"

#include <cstdlib>
#include <string>

#include "forge/core/error.h"

namespace forge::cli {

CudaSettings cuda_settings_from_env() {
  CudaSettings s;
  if (const char* a = std::getenv("FORGE_ATTENTION")) s.attention = parse_attention_path(a);
  if (const char* g = std::getenv("FORGE_CUDA_GRAPH")) {
    const std::string v = g;
    if (v != "0" && v != "1") throw Error(str("FORGE_CUDA_GRAPH=", quote(v), " (expected 0 or 1)"));
    s.graphs = v == "1";
  }
  if (const char* w = std::getenv("FORGE_GEMM_ALGO")) {
    const std::string v = w;
    if (!parse_gemm_algo(v, s.gemm_algo))
      throw Error(str("FORGE_GEMM_ALGO=", quote(v), " (expected heuristic, timed or timed-any)"));
  }
  if (const char* q = std::getenv("FORGE_QKV")) {
    const std::string v = q;
    if (v != "fused" && v != "separate") throw Error(str("FORGE_QKV=", quote(v), " (expected fused or separate)"));
    s.fuse_qkv = v == "fused";
  }
  if (const char* f = std::getenv("FORGE_FP8")) {
    const std::string v = f;
    if (!parse_fp8_recipe(v, s.fp8)) throw Error(str("FORGE_FP8=", quote(v), " (expected off, rows, rows-e5m2 or rows-dx)"));
  }
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
