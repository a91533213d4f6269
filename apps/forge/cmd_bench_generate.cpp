// forge bench generate: option parsing (the benchmark is bench/generate_bench.cpp).
#include <limits>
#include <sstream>

#include "args.h"
#include "bench.h"
#include "commands.h"
#include "forge/core/error.h"
#include "forge/core/parse.h"
#include "run_env.h"

namespace forge::cli {

namespace {

const Command kBenchGenerate = {
    "bench generate",
    "KV-cache decoding: time to first token and tokens/s at several batch sizes",
    {{"preset", "NAME", "model shape, random weights (default smollm2-135m)"},
     {"device", "cuda|cpu", "where to run (default cuda)"},
     {"precision", "bf16|fp16|fp32", "CUDA compute dtype (default bf16)"},
     {"prompt-len", "N", "prompt tokens per request (default 128)"},
     {"new-tokens", "N", "generated tokens per request (default 256)"},
     {"batches", "1,8,...", "batch sizes, one table row each (default 1,8,32,128)"},
     {"repeats", "N", "timed runs per row, median reported (default 3)"},
     {"no-graph", "", "launch every decode step's kernels one by one (no step graph)"},
     {"no-pdl", "", "launch each decode kernel after the one before ends (no programmatic dependent launch)"},
     {"no-pipeline", "", "wait for each step's ids before enqueuing the next step"},
     {"json-out", "FILE", "also write the numbers as JSON"}},
    false,
    "",
    "Greedy decoding without stop ids, so every request yields --new-tokens ids. Beside the\n"
    "table: the ANCHORS.md figures of a compiled PyTorch static-cache decoder and of\n"
    "transformers' generate on the same GPU model."};

}  // namespace

int bench_generate(const Argv& argv) {
  const Args a = parse_args(kBenchGenerate, argv);
  if (a.help()) {
    print_help(kBenchGenerate);
    return 0;
  }
  const int int_max = std::numeric_limits<int>::max();
  bench::GenerateBenchOptions o;
  o.preset = a.get("preset", o.preset);
  o.device = a.get("device", o.device);
  if (o.device != "cuda" && o.device != "cpu") throw Error(str("--device: expected cuda or cpu, got ", quote(o.device)));
  o.precision = a.get("precision", o.precision);
  o.prompt_len = a.get_int("prompt-len", o.prompt_len, 1, 1 << 20);
  o.new_tokens = a.get_int("new-tokens", o.new_tokens, 1, 1 << 20);
  o.repeats = a.get_int("repeats", o.repeats, 1, int_max);
  o.graph = !a.has("no-graph");
  o.pdl = !a.has("no-pdl");
  o.pipeline = !a.has("no-pipeline");
  o.gemm_algo = cuda_settings_from_env().gemm_algo;
  o.json_out = a.get("json-out", "");
  if (a.has("batches")) {
    o.batches.clear();
    std::stringstream ss(a.get("batches"));
    std::string item;
    while (std::getline(ss, item, ','))
      o.batches.push_back(parse_int("--batches", item, 1, 4096));
    if (o.batches.empty()) throw Error("--batches: empty list (expected e.g. 1,8,32)");
  }
  bench::generate_bench(o);
  return 0;
}

}  // namespace forge::cli
