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
  return s;
}

}  // namespace forge::cli
