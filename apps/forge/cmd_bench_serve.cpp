// forge bench serve: option parsing (the benchmark is bench/serve_bench.cpp).
#include <sstream>

#include "args.h"
#include "bench.h"
#include "commands.h"
#include "forge/core/error.h"
#include "forge/core/parse.h"

namespace forge::cli {

namespace {

#ifdef FORGE_HAVE_CUDA
constexpr const char* kDefaultDevice = "cuda";
#else
constexpr const char* kDefaultDevice = "cpu";
#endif

const Command kBenchServe = {
    "bench serve",
    "forge serve under concurrent streams: total tokens/s, latency, time to first token",
    {{"model", "DIR", "model directory to serve (default: --preset with random weights)"},
     {"preset", "NAME", "model shape, random bf16 weights (default smollm2-135m)"},
     {"device", "cuda|cpu", "where to serve (default cuda when built with CUDA, else cpu)"},
     {"precision", "bf16|fp16|fp32", "CUDA compute dtype (default bf16)"},
     {"streams", "1,8,...", "concurrent clients, one table row each (default 1,8,32,128)"},
     {"requests", "N", "requests per row (default 2 x streams, at least 8)"},
     {"max-tokens", "N", "tokens generated per request (default 128)"},
     {"max-batch", "N", "the server's decode slots (default: forge serve's, 8 on cpu, 32 on cuda)"},
     {"context", "N", "KV cache tokens per slot (default: the model's context)"},
     {"no-pipeline", "", "the server waits for each step's ids before enqueuing the next step"},
     {"json-out", "FILE", "also write the numbers as JSON"}},
    false,
    "",
    "The server runs in this process on a loopback port; the load client (serve/load_client.h)\n"
    "sends greedy requests, half streamed, completions and chat mixed. Every answer must be\n"
    "HTTP 200 and well-formed; 'equal to alone' counts answers equal to the one the server gave\n"
    "the same prompt before the load. The server's queue holds the largest row's streams (no\n"
    "503). The last line: 32 streams' tokens/s over 1 stream's."};

}  // namespace

int bench_serve(const Argv& argv) {
  const Args a = parse_args(kBenchServe, argv);
  if (a.help()) {
    print_help(kBenchServe);
    return 0;
  }
  bench::ServeBenchOptions o;
  o.model = a.get("model", "");
  o.preset = a.get("preset", o.preset);
  if (a.has("model") && a.has("preset")) throw Error("--model and --preset: give one of them");
  o.device = a.get("device", kDefaultDevice);
  if (o.device != "cuda" && o.device != "cpu")
    throw Error(str("--device: expected cuda or cpu, got ", quote(o.device)));
  o.precision = a.get("precision", o.precision);
  o.requests = a.get_int("requests", 0, 1, 1 << 20);
  o.max_tokens = a.get_int("max-tokens", o.max_tokens, 1, 1 << 20);
  o.max_batch = a.get_int("max-batch", 0, 1, 1024);
  o.context = a.get_int("context", 0, 1, 1 << 20);
  o.pipeline = !a.has("no-pipeline");
  o.json_out = a.get("json-out", "");
  if (a.has("streams")) {
    o.streams.clear();
    std::stringstream ss(a.get("streams"));
    std::string item;
    while (std::getline(ss, item, ',')) o.streams.push_back(parse_int("--streams", item, 1, 1024));
    if (o.streams.empty()) throw Error("--streams: empty list (expected e.g. 1,8,32)");
  }
  bench::serve_bench(o);
  return 0;
}

}  // namespace forge::cli
