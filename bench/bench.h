// Benchmarks behind `forge bench <what>`. Each prints a table that states the shape, dtype,
// device and the comparison figure, and writes the same numbers as JSON when asked. CUDA
// benchmarks live in *_cuda.cpp files, built only with the CUDA backend.
#pragma once

#include <array>
#include <string>
#include <utility>
#include <vector>

#include "forge/dist/communicator.h"
#include "forge/train/runner.h"

namespace forge::bench {

struct BenchOptions {
  std::string preset = "gpt2-124m";
  int batch = 64;         // micro-batch B
  int seq_len = 1024;     // T
  int steps = 20;         // timed steps (after warm-up)
  int warmup = 3;
  std::string precision = "bf16";
  std::string json_out;   // write results here when non-empty
  std::vector<std::pair<std::string, std::string>> overrides;  // train: model key=value over the preset
  CudaSettings cuda;      // attention path, CUDA graphs (the CLI reads FORGE_ATTENTION etc.)
  // bench gemm --rows: the small-N linear kernels at these row counts, on these presets' shapes
  std::vector<int> rows;
  std::vector<std::string> presets;
  bool sweep = false;     // also time every tiling the small-N kernels take
  bool algos = false;     // bench gemm: time every algorithm cuBLASLt's heuristic offers a product
  bool fp8 = false;       // bench gemm: the linear layers' products in FP8 beside bf16
  // bench train --sft: pretraining rows beside SFT rows padded and packed, from synthetic
  // examples of lengths uniform in [sft_min, sft_max] tokens
  bool sft = false;
  int sft_min = 64, sft_max = 1024;
  // bench train --gpus N (bench/train_gpus_cuda.cpp). On a rank that --gpus started: its NCCL
  // communicator (nullptr: the plain one-GPU runner) and where rank 0 writes its numbers.
  Communicator* comm = nullptr;
  std::string rank_result;
};

// forge bench attention: flash attention forward and backward timings.
struct AttentionBenchOptions {
  std::vector<std::array<int, 4>> shapes;  // {B, H, T, D}; empty: the ANCHORS.md shapes
  std::string causal = "both";             // yes, no or both
  int iters = 10;                          // timed calls per measurement (median reported)
  int warmup = 3;                          // untimed calls before them
  std::string json_out;                    // write results here when non-empty
};

// forge bench generate: KV-cache decoding throughput (CPU or CUDA).
struct GenerateBenchOptions {
  std::string preset = "smollm2-135m";
  std::string device = "cuda";
  std::string precision = "bf16";
  int prompt_len = 128;
  int new_tokens = 256;
  std::vector<int> batches = {1, 8, 32, 128};
  int repeats = 3;
  bool graph = true;
  bool pdl = true;  // programmatic dependent launch of the decode kernels (cuda/pdl.cuh)
  bool pipeline = true;  // hand out a step's ids while the next step runs (generate/decode_loop.h)
  GemmAlgo gemm_algo = GemmAlgo::kHeuristic;  // FORGE_GEMM_ALGO (GenOptions::gemm_algo)
  std::string json_out;
};
void generate_bench(const GenerateBenchOptions& o);

// forge bench serve: forge serve under the load client (bench/serve_bench.cpp).
struct ServeBenchOptions {
  std::string model;                     // a model directory; empty: `preset` with random weights
  std::string preset = "smollm2-135m";
  std::string device = "cpu";            // the CLI defaults to cuda when built with CUDA
  std::string precision = "bf16";
  std::vector<int> streams = {1, 8, 32, 128};
  int requests = 0;                      // per row; 0: 2 x streams, at least 8
  int max_tokens = 128;                  // per request
  int max_batch = 0;                     // the server's decode slots (0: its default)
  int context = 0;                       // KV cache tokens per slot (0: the model's context)
  bool pipeline = true;                  // the server's decode loop pipelines its steps
  std::string json_out;
};
void serve_bench(const ServeBenchOptions& o);

// Throw forge::Error when Forge was built without CUDA or no GPU is present.
void gemm_cuda(const BenchOptions& o);
void gemm_fp8_cuda(const BenchOptions& o);  // bench gemm --fp8
void small_gemm_cuda(const BenchOptions& o);  // bench gemm --rows
void train_cuda(const BenchOptions& o);
void train_sft_cuda(const BenchOptions& o);
// bench train --gpus N: the supervisor side. Starts `rank_argv` (this bench's command line for a
// rank, without --gpus and --json-out) first as one plain-runner rank, then as N ranks of the
// data-parallel (ZeRO-1 over NCCL) runner, and prints the scaling table (bench/train_gpus_cuda.cpp).
void train_gpus_cuda(const BenchOptions& o, int gpus, const std::vector<std::string>& rank_argv);  // bench train --sft (bench/train_sft_cuda.cpp)
void attention_cuda(const AttentionBenchOptions& o);

}  // namespace forge::bench
