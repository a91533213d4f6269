// forge bench gemm | train: the GPU benchmarks (bench/*_cuda.cpp). Option parsing lives here so
// that a build without CUDA still answers --help and says plainly why it cannot run them.
#include "args.h"
#include "bench.h"
#include "commands.h"
#include "forge/core/error.h"

namespace forge::cli {

namespace {

const Command kBenchGpu = {
    "bench gemm|train",
    "GPU throughput: cuBLASLt GEMMs of a preset's shapes, or whole training steps",
    {{"preset", "NAME", "model shape (default gpt2-124m)"},
     {"batch", "B", "micro-batch (default 64)"},
     {"seq-len", "T", "sequence length (default 1024)"},
     {"steps", "N", "timed steps for train (default 20)"},
     {"precision", "bf16|fp32", "train precision (default bf16)"},
     {"device", "cuda", "the only device these benchmarks run on"},
     {"json-out", "FILE", "also write the numbers as JSON"}},
    false,
    "",
    "train reports tokens/s, MFU (6N + 6LCT FLOPs per token over 989 TFLOP/s), step time and\n"
    "peak memory, beside llm.c's and torch.compile's figures on the same GPU model (ANCHORS.md)."};

}  // namespace

int bench_gpu(const std::string& what, const Argv& argv) {
  const Args a = parse_args(kBenchGpu, argv);
  if (a.help()) {
    print_help(kBenchGpu);
    return 0;
  }
  if (a.get("device", "cuda") != "cuda") throw Error("bench " + what + " runs on --device cuda only");
  bench::BenchOptions o;
  o.preset = a.get("preset", o.preset);
  o.batch = a.get_int("batch", o.batch);
  o.seq_len = a.get_int("seq-len", o.seq_len);
  o.steps = a.get_int("steps", o.steps);
  o.precision = a.get("precision", o.precision);
  o.json_out = a.get("json-out", "");
  if (o.batch <= 0 || o.seq_len <= 0 || o.steps <= 0) throw Error("--batch, --seq-len and --steps must be positive");
#ifdef FORGE_HAVE_CUDA
  if (what == "gemm") bench::gemm_cuda(o);
  else bench::train_cuda(o);
  return 0;
#else
  throw Error("bench " + what + " needs the CUDA backend, and this forge was built without nvcc");
#endif
}

}  // namespace forge::cli
