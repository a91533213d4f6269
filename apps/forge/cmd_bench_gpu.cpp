// forge bench gemm | train | attention: the GPU benchmarks (bench/*_cuda.cpp). Option parsing
// lives here so that a build without CUDA still answers --help and says plainly why it cannot
// run them.
#include <array>
#include <limits>
#include <sstream>

#include "args.h"
#include "forge/dist/bootstrap.h"
#include "forge/dist/nccl_comm.h"
#include "world.h"
#include "bench.h"
#include "commands.h"
#include "run_env.h"
#include "forge/backend/cuda/small_gemm.h"
#include "forge/core/error.h"
#include "forge/core/parse.h"

namespace forge::cli {

namespace {

const Command kBenchGpu = {
    "bench gemm|train",
    "GPU throughput: cuBLASLt GEMMs of a preset's shapes, or whole training steps",
    {{"preset", "NAME", "model shape (default gpt2-124m)"},
     {"batch", "B", "micro-batch (default 64)"},
     {"seq-len", "T", "sequence length (default 1024)"},
     {"steps", "N", "timed steps for train (default 20)"},
     {"precision", "bf16|fp32|fp16", "train precision (default bf16)"},
     {"set", "KEY=VALUE", "train: a model setting over the preset (forge train --help lists them), "
      "e.g. --set variant=qwen3; --set recompute=none|attn|mlp|full, repeated: one row per level; --set dp_bucket=BYTES: the --gpus ranks' gradient buckets", true},
     {"sft", "", "train: SFT rows padded and packed (forge train --sft [--pack]) beside pretraining rows"},
     {"sft-lengths", "MIN,MAX", "train --sft: the synthetic examples' token counts (default 64,1024)"},
     {"rows", "N", "gemm: the small-N linear kernels vs cuBLASLt at these row counts (1..32)", true},
     {"sweep", "", "gemm --rows: also time every tiling of the small-N kernels"},
     {"fp8", "", "gemm: the linear layers' and the LM head's products in FP8 (e4m3 / e5m2, TN) beside bf16, and the casts FP8 adds"},
     {"algos", "", "gemm: time every algorithm cuBLASLt's heuristic offers each product and whether it gives the heuristic's bits (FORGE_GEMM_ALGO=timed picks the fastest of those)"},
     {"gpus", "N", "train: data-parallel scaling: one GPU, then N ranks (ZeRO-1 over NCCL) of B x T each"},
     {"rank-result", "FILE", "(set by --gpus for the ranks it starts) rank 0 writes its numbers here"},
     {"rank-plain", "", "(set by --gpus) this rank runs the plain one-GPU runner"},
     {"device", "cuda", "the only device these benchmarks run on"},
     {"json-out", "FILE", "also write the numbers as JSON"}},
    false,
    "",
    "train --gpus N starts this command as one rank (the plain one-GPU runner), then as N ranks of\n"
    "the data-parallel runner (as forge train --gpus does), and prints tokens/s of both and the\n"
    "scaling efficiency tokens/s(N) / (N x tokens/s(1)); --gpus 1 measures the ZeRO-1 path on\n"
    "one rank against the plain runner.\n"
    "train reports tokens/s, MFU (6N + 6LCT FLOPs per token over 989 TFLOP/s), step time and\n"
    "peak memory, beside llm.c's and torch.compile's figures on the same GPU model (ANCHORS.md),\n"
    "one row per --set recompute=LEVEL given (default none).\n"
    "gemm times each product of one training step of the preset as the CUDA backend calls it\n"
    "(epilogues included); --algos adds every candidate of cuBLASLt's heuristic and what the\n"
    "fastest would save a step; --fp8 times the linear layers' and the LM head's products in\n"
    "FP8 beside bf16.\n"
    "gemm --rows 1 8 32 times a decode step's linear layers (smollm2-135m and gpt2-124m, or\n"
    "--preset) with the small-N kernels and with cuBLASLt, weights read from HBM.\n"
    "train --sft times the same model on SFT rows, padded and packed, built from synthetic examples\n"
    "by the trainer's own SFT data code, and reports example (non-padding) tokens/s beside the\n"
    "pretraining rows' tokens/s of the same run."};

const Command kBenchAttention = {
    "bench attention",
    "flash attention forward and backward TFLOP/s beside PyTorch's flash and cuDNN kernels",
    {{"shapes", "BxHxTxD,...",
      "shapes to run (default 4x16x4096x128,8x12x2048x64,2x32x8192x128)"},
     {"causal", "yes|no|both", "masking (default both)"},
     {"iters", "N", "timed calls per measurement, median reported (default 10)"},
     {"device", "cuda", "the only device this benchmark runs on"},
     {"json-out", "FILE", "also write the numbers as JSON"}},
    false,
    "",
    "bf16, dense (B, T, H, D) q/k/v/out with as many kv heads as query heads. FLOPs: forward\n"
    "4*B*H*T^2*D, backward 2.5x the forward, halved when causal (the formula of the PyTorch\n"
    "figures in shared/ANCHORS.md, printed beside each row). On 8x12x2048x64 the unfused v1\n"
    "kernels (attention_fwd/bwd, materialising the probabilities) are timed as well. On\n"
    "Hopper, head size 64's rows 'wgmma split' time the backward as two kernels (dQ; dK, dV)\n"
    "beside the one-kernel backward of the 'flash wgmma' rows."};

// "4x16x4096x128,8x12x2048x64" -> {{4, 16, 4096, 128}, {8, 12, 2048, 64}}.
std::vector<std::array<int, 4>> parse_shapes(const std::string& list) {
  std::vector<std::array<int, 4>> shapes;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    std::array<int, 4> s{};
    char x1 = 0, x2 = 0, x3 = 0;
    std::istringstream is(item);
    if (!(is >> s[0] >> x1 >> s[1] >> x2 >> s[2] >> x3 >> s[3]) || x1 != 'x' || x2 != 'x' ||
        x3 != 'x' || !is.eof() || s[0] <= 0 || s[1] <= 0 || s[2] <= 0 || s[3] <= 0)
      throw Error("--shapes: '" + item +
                  "' is not BxHxTxD with positive integers (e.g. 4x16x4096x128)");
    shapes.push_back(s);
  }
  if (shapes.empty())
    throw Error("--shapes: empty list (expected e.g. 4x16x4096x128,8x12x2048x64)");
  return shapes;
}

int bench_attention(const Argv& argv) {
  const Args a = parse_args(kBenchAttention, argv);
  if (a.help()) {
    print_help(kBenchAttention);
    return 0;
  }
  if (a.get("device", "cuda") != "cuda") throw Error("bench attention runs on --device cuda only");
  bench::AttentionBenchOptions o;
  if (a.has("shapes")) o.shapes = parse_shapes(a.get("shapes"));
  o.causal = a.get("causal", o.causal);
  if (o.causal != "yes" && o.causal != "no" && o.causal != "both")
    throw Error("--causal must be yes, no or both, not '" + o.causal + "'");
  o.iters = a.get_int("iters", o.iters, 1, std::numeric_limits<int>::max());
  o.json_out = a.get("json-out", "");
#ifdef FORGE_HAVE_CUDA
  bench::attention_cuda(o);
  return 0;
#else
  throw Error("bench attention needs the CUDA backend, and this forge was built without nvcc");
#endif
}

#ifdef FORGE_HAVE_CUDA
// A rank that bench train --gpus started: the plain runner on GPU LOCAL_RANK (--rank-plain), or
// the data-parallel runner over an NCCL communicator of every rank (a world of one: the ZeRO-1
// path forced on one rank). Ranks other than 0 print only errors.
void train_rank(bench::BenchOptions o, bool plain) {
  const LaunchInfo info = detect_launch(process_env());
  o.cuda.device = info.local_rank;
  if (info.rank != 0 && !std::freopen("/dev/null", "w", stdout))
    throw Error("cannot redirect the standard output of a rank other than 0 to /dev/null");
  if (plain) return bench::train_cuda(o);
  std::unique_ptr<Communicator> world = open_world();
  LocalComm one;
  std::unique_ptr<Communicator> nccl;  // destroyed before world
  try {
    nccl = make_nccl_comm(world ? *world : one, info.local_rank, nullptr);
    o.cuda.zero1_one_rank = true;  // only matters for a world of one
    o.comm = nccl.get();
    bench::train_cuda(o);
  } catch (const std::exception& e) {
    if (nccl) nccl->abort(str("forge bench train: error: ", e.what()));
    if (world) world->abort(str("forge bench train: error: ", e.what()));
    throw;
  }
}
#endif

}  // namespace

int bench_gpu(const std::string& what, const Argv& argv) {
  if (what == "attention") return bench_attention(argv);
  const Args a = parse_args(kBenchGpu, argv);
  if (a.help()) {
    print_help(kBenchGpu);
    return 0;
  }
  if (a.get("device", "cuda") != "cuda") throw Error("bench " + what + " runs on --device cuda only");
  bench::BenchOptions o;
  o.preset = a.get("preset", o.preset);
  o.batch = a.get_int("batch", o.batch, 1, std::numeric_limits<int>::max());
  o.seq_len = a.get_int("seq-len", o.seq_len, 1, std::numeric_limits<int>::max());
  o.steps = a.get_int("steps", o.steps, 1, std::numeric_limits<int>::max());
  o.precision = a.get("precision", o.precision);
  o.json_out = a.get("json-out", "");
  for (const std::string& kv : a.all("set")) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) throw Error("--set: expected KEY=VALUE, got '" + kv + "'");
    o.overrides.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
  }
  o.cuda = cuda_settings_from_env();
  for (const std::string& r : a.all("rows")) o.rows.push_back(parse_int("--rows", r, 1, cuda::kSmallLinearMaxRows));
  o.presets = a.has("preset") ? std::vector<std::string>{o.preset}
                              : std::vector<std::string>{"smollm2-135m", "gpt2-124m"};
  o.sweep = a.has("sweep");
  o.algos = a.has("algos");
  o.fp8 = a.has("fp8");
  o.sft = a.has("sft");
  if (a.has("sft-lengths")) {
    const std::string v = a.get("sft-lengths", "");
    const size_t comma = v.find(',');
    if (comma == std::string::npos) throw Error("--sft-lengths: expected MIN,MAX, got '" + v + "'");
    o.sft_min = parse_int("--sft-lengths", v.substr(0, comma), 2, 1 << 30);
    o.sft_max = parse_int("--sft-lengths", v.substr(comma + 1), o.sft_min, 1 << 30);
  }
  if ((o.sft || a.has("sft-lengths")) && what != "train") throw Error("--sft and --sft-lengths go with bench train");
  if (o.sweep && o.rows.empty()) throw Error("--sweep goes with gemm --rows (e.g. --rows 1 8 32 --sweep)");
  if (o.algos && (what != "gemm" || !o.rows.empty())) throw Error("--algos goes with bench gemm (without --rows)");
  if (o.fp8 && (what != "gemm" || !o.rows.empty() || o.algos))
    throw Error("--fp8 goes with bench gemm (without --rows or --algos)");
  if ((a.has("gpus") || a.has("rank-result") || a.has("rank-plain")) && what != "train")
    throw Error("--gpus goes with bench train");
  if (a.has("gpus") && o.sft) throw Error("bench train: --gpus and --sft do not go together (yet)");
  if (a.has("rank-plain") && !a.has("rank-result")) throw Error("--rank-plain goes with --rank-result");
#ifdef FORGE_HAVE_CUDA
  if (a.has("gpus")) {
    const int gpus = parse_int("--gpus", a.get("gpus"), 1, 4096);
    bench::train_gpus_cuda(o, gpus, gpus_rank_command(gpus, {"bench", "train"}, argv, {"json-out"}));
    return 0;
  }
  if (a.has("rank-result")) {
    o.rank_result = a.get("rank-result");
    train_rank(o, a.has("rank-plain"));
    return 0;
  }
  if (what == "gemm" && !o.rows.empty()) bench::small_gemm_cuda(o);
  else if (what == "gemm" && o.fp8) bench::gemm_fp8_cuda(o);
  else if (what == "gemm") bench::gemm_cuda(o);
  else bench::train_cuda(o);
  return 0;
#else
  throw Error("bench " + what + " needs the CUDA backend, and this forge was built without nvcc");
#endif
}

}  // namespace forge::cli
