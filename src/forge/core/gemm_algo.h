// How the CUDA backend picks cuBLASLt's algorithm for each product shape (a plan: gemm.cu).
// A setting of CUDA runs, read by the CLI from FORGE_GEMM_ALGO; here so that backend-agnostic
// settings (train/runner.h, generate/generator.h) can carry it.
#pragma once

#include <string>

namespace forge {

enum class GemmAlgo {
  // cuBLASLt's heuristic's first algorithm (a cuda::Context's default, and GenOptions': forge
  // generate and serve).
  kHeuristic,
  // The plan's first eager call runs every candidate the heuristic offers on the call's own
  // operands and keeps the fastest of those whose output (and GELU aux output) equals the
  // heuristic's first algorithm's bit for bit. So the results are the heuristic's, in every
  // process, whichever candidate wins the timing. Products with too few outputs for the
  // comparison to tell summation orders apart keep the first (gemm.cu). The default of the
  // CLI's CudaSettings (forge train, eval, quickstart, bench train, bench generate).
  kTimed,
  // The fastest candidate, whatever its bits: another process may time differently, pick
  // another algorithm and differ in the last bits.
  kTimedAny,
};

// "heuristic", "timed", "timed-any".
inline const char* gemm_algo_name(GemmAlgo a) {
  switch (a) {
    case GemmAlgo::kTimed:
      return "timed";
    case GemmAlgo::kTimedAny:
      return "timed-any";
    default:
      return "heuristic";
  }
}

// The inverse of gemm_algo_name; false for any other string.
inline bool parse_gemm_algo(const std::string& s, GemmAlgo& out) {
  for (GemmAlgo a : {GemmAlgo::kHeuristic, GemmAlgo::kTimed, GemmAlgo::kTimedAny})
    if (s == gemm_algo_name(a)) {
      out = a;
      return true;
    }
  return false;
}

}  // namespace forge
