// train_timeline: where a training step's time goes on the GPU, kernel by kernel, from CUPTI's
// activity records. The model, the CUDA runner and the step loop are forge bench train's
// (bench/train_bench.h: same preset and --set overrides, same seeded weights, random tokens, one
// step in flight, the step replayed as a CUDA graph after its first two; FORGE_CUDA_GRAPH and
// FORGE_ATTENTION read as the CLI reads them). After the warm-up steps (the graph captured) the
// next --steps steps are recorded; printed: per step the span (first kernel start to last kernel
// end), the kernel time and the gaps, then one row per kernel short name — calls per step, µs per
// step, µs per call, share of the span — sorted by µs per step (top 40 and the rest as "other"),
// then the memcpys and memsets. --csv writes every row, for dev/timeline_diff.py:
//
//   build/train_timeline --preset llama-100m --batch 32 --seq-len 2048 --csv plain.csv
//   build/train_timeline --preset llama-100m --batch 32 --seq-len 2048 --set variant=qwen3 --csv qwen3.csv
//   python3 dev/timeline_diff.py plain.csv qwen3.csv
//
// Options: --preset (llama-100m) --batch (32) --seq-len (2048) --grad-accum (1) --set KEY=VALUE
// (repeatable) --steps (3) --warmup (3) --precision (bf16) --csv FILE --top (40); --zero1 BYTES:
// the data-parallel runner (ZeRO-1) on one NCCL rank with gradient buckets of BYTES
// (dist/buckets.h), and a table of its collectives and copies: time per step, and how much of it
// ran beside other kernels (the reduce-scatters started during the backward).
// (A development tool, not part of forge: built when CMake finds CUDA and CUPTI.)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "cupti_timeline.h"
#include "run_env.h"
#include "train_bench.h"
#include "forge/backend/cuda/check.h"
#include "forge/core/error.h"
#include "forge/core/rng.h"
#include "forge/dist/buckets.h"
#include "forge/dist/communicator.h"
#include "forge/dist/nccl_comm.h"
#include "forge/train/train_config.h"

namespace {

using forge::Error;
using forge::dev::ActivityRecord;

struct Options {
  forge::bench::BenchOptions bench;
  int grad_accum = 1;
  int top = 40;
  std::string csv;
  int64_t zero1 = 0;  // --zero1 BYTES: the bucket size; 0: the plain runner
};

int positive(const std::string& key, const std::string& v) {
  size_t used = 0;
  int n = 0;
  try {
    n = std::stoi(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != v.size() || n < 1) throw Error(key + ": expected a positive integer, got '" + v + "'");
  return n;
}

Options parse(int argc, char** argv) {
  Options o;
  o.bench.preset = "llama-100m";
  o.bench.batch = 32;
  o.bench.seq_len = 2048;
  o.bench.steps = 3;
  o.bench.warmup = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string key = argv[i];
    if (i + 1 >= argc) throw Error(key + ": missing value (or unknown option)");
    const std::string v = argv[++i];
    if (key == "--preset") o.bench.preset = v;
    else if (key == "--batch") o.bench.batch = positive(key, v);
    else if (key == "--seq-len") o.bench.seq_len = positive(key, v);
    else if (key == "--grad-accum") o.grad_accum = positive(key, v);
    else if (key == "--steps") o.bench.steps = positive(key, v);
    else if (key == "--warmup") o.bench.warmup = positive(key, v);
    else if (key == "--precision") o.bench.precision = v;
    else if (key == "--csv") o.csv = v;
    else if (key == "--top") o.top = positive(key, v);
    else if (key == "--zero1") {
      forge::TrainConfig tc;  // the dp_bucket setting's syntax ("16MiB", "1")
      tc.apply_override("dp_bucket", v);
      o.zero1 = tc.dp_bucket;
    }
    else if (key == "--set") {
      const size_t eq = v.find('=');
      if (eq == std::string::npos || eq == 0) throw Error("--set: expected KEY=VALUE, got '" + v + "'");
      o.bench.overrides.emplace_back(v.substr(0, eq), v.substr(eq + 1));
    } else {
      throw Error("unknown option '" + key + "'");
    }
  }
  // The first steps run eagerly and capture the graph (train/runner_cuda.cpp): at least 2.
  if (o.bench.warmup < 2) throw Error("--warmup: at least 2 (the step's graph is captured on the second)");
  return o;
}

// The recorded steps' kernels, one vector per step. With a CUDA graph, a step starts at each
// replay of the graph node that ran first; eagerly, every step launches the same kernels, so the
// records split evenly. Empty when neither gives `steps` steps.
std::vector<std::vector<ActivityRecord>> split_steps(const std::vector<ActivityRecord>& kernels, int steps) {
  std::vector<std::vector<ActivityRecord>> out;
  if (kernels.empty()) return out;
  const ActivityRecord& first = kernels.front();
  if (first.graph_id != 0) {
    for (const ActivityRecord& k : kernels) {
      if (k.graph_id == first.graph_id && k.node_id == first.node_id) out.emplace_back();
      out.back().push_back(k);
    }
    if (static_cast<int>(out.size()) == steps) return out;
    out.clear();
  }
  if (kernels.size() % steps != 0) return out;
  const size_t per = kernels.size() / steps;
  for (int s = 0; s < steps; ++s) out.emplace_back(kernels.begin() + s * per, kernels.begin() + (s + 1) * per);
  return out;
}

struct Row {
  std::string kind, name;
  double calls = 0, us = 0, bytes = 0;  // per step
};

std::string csv_quoted(const std::string& s) {
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

// --zero1: NCCL's kernels and the copies (the collectives of a one-rank world, the top bucket's
// staging), per name: µs per step, and the part of it during which some other kernel ran.
void print_comm_overlap(const std::vector<std::vector<ActivityRecord>>& steps,
                        const std::vector<ActivityRecord>& copies, int N) {
  auto is_comm = [](const ActivityRecord& r) {
    return r.kind != ActivityRecord::kKernel || r.name.find("nccl") != std::string::npos;
  };
  std::vector<std::pair<uint64_t, uint64_t>> busy;  // other kernels' intervals, merged
  std::vector<const ActivityRecord*> comm;
  for (const auto& k : steps)
    for (const ActivityRecord& r : k) {
      if (is_comm(r)) comm.push_back(&r);
      else busy.emplace_back(r.start, r.end);
    }
  for (const ActivityRecord& r : copies) comm.push_back(&r);
  std::sort(busy.begin(), busy.end());
  std::vector<std::pair<uint64_t, uint64_t>> merged;
  for (const auto& b : busy) {
    if (!merged.empty() && b.first <= merged.back().second) merged.back().second = std::max(merged.back().second, b.second);
    else merged.push_back(b);
  }
  std::map<std::string, std::pair<double, double>> by;  // name → (µs, µs beside other kernels)
  std::map<std::string, std::vector<double>> starts;    // name → ms into its step, first step
  const uint64_t step0 = steps[0].front().start, step1 = steps.size() > 1 ? steps[1].front().start : ~uint64_t{0};
  for (const ActivityRecord* r : comm) {
    double beside = 0;
    auto it = std::lower_bound(merged.begin(), merged.end(), std::make_pair(r->start, uint64_t{0}));
    if (it != merged.begin()) --it;
    for (; it != merged.end() && it->first < r->end; ++it)
      if (it->second > r->start) beside += (std::min(it->second, r->end) - std::max(it->first, r->start)) * 1e-3;
    const std::string name = (r->kind == ActivityRecord::kKernel ? "" : "copy: ") + r->name;
    auto& e = by[name];
    e.first += r->us() / N;
    e.second += beside / N;
    if (r->start >= step0 && r->start < step1) starts[name].push_back((r->start - step0) * 1e-6);
  }
  for (const ActivityRecord& r : steps[0])
    if (r.name.find("adamw") != std::string::npos) {
      std::printf("\nfirst step: the optimizer's first kernel starts %.1f ms into it (span %.1f ms)\n",
                  (r.start - step0) * 1e-6, (steps[0].back().end - step0) * 1e-6);
      break;
    }
  std::printf("\n| ZeRO-1 collective or copy | µs/step | beside other kernels | starts (ms into the first step) |\n"
              "| --- | ---: | ---: | --- |\n");
  for (const auto& [name, e] : by) {
    std::string at;
    auto& v = starts[name];
    std::sort(v.begin(), v.end());
    for (size_t i = 0; i < v.size() && i < 16; ++i) at += forge::str(i ? " " : "", std::lround(v[i] * 10) / 10.0);
    std::printf("| %s | %.1f | %.1f (%.0f%%) | %s |\n", name.c_str(), e.first, e.second,
                e.first > 0 ? 100 * e.second / e.first : 0.0, at.c_str());
  }
}

int run(const Options& o) {
  using namespace forge;
  std::string shape;
  const ModelConfig cfg = bench::train_bench_config(o.bench, &shape);
  // Recording from before the runner exists, so that no graph is instantiated unseen; the
  // warm-up steps' records are dropped by time below.
  dev::CuptiRecorder recorder(/*name_len=*/100, /*copies=*/true);
  recorder.start();
  bench::BenchOptions bo = o.bench;
  LocalComm boot;
  std::unique_ptr<Communicator> nccl;
  if (o.zero1 > 0) {
    nccl = make_nccl_comm(boot, bo.cuda.device, nullptr);
    bo.comm = nccl.get();
    bo.cuda.zero1_one_rank = true;
    bo.cuda.bucket_elems = bucket_elems_of_bytes(o.zero1);
  }
  std::unique_ptr<StepRunner> runner = bench::train_bench_runner(cfg, bo, bench::train_bench_levels(bo)[0]);
  const int B = o.bench.batch, T = o.bench.seq_len, accum = o.grad_accum;
  const size_t n = static_cast<size_t>(B) * T;
  std::vector<int32_t> x(n + 1);  // random tokens; targets are the inputs shifted by one
  Rng rng(5);
  for (auto& t : x) t = static_cast<int32_t>(rng.below(cfg.vocab_size));
  uint64_t t0 = 0;
  StepReport last;
  const std::vector<double> ms = bench::time_train_steps(
      *runner,
      [&](int s) {
        if (s == o.bench.warmup) {  // the warm-up steps are done (their reports were taken)
          FORGE_CUDA_CHECK(cudaDeviceSynchronize());
          t0 = dev::CuptiRecorder::now();
        }
        for (int a = 0; a < accum; ++a) runner->micro_step(x.data(), x.data() + 1, B, T, 1.0 / accum);
      },
      o.bench.warmup, o.bench.steps, &last);
  FORGE_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<ActivityRecord> all = recorder.stop();
  std::vector<ActivityRecord> kernels, copies;
  for (ActivityRecord& r : all) {
    if (r.start < t0) continue;
    (r.kind == ActivityRecord::kKernel ? kernels : copies).push_back(std::move(r));
  }
  const int N = o.bench.steps;
  const auto steps = split_steps(kernels, N);
  if (steps.empty())
    throw Error(str(kernels.size(), " kernels recorded do not split into ", N,
                    " steps (graph node repeats or equal counts)"));

  std::printf("train_timeline: %s, %s, micro-batch %d x %d, %d micro-batch(es)/step; %s\n", shape.c_str(),
              o.bench.precision.c_str(), B, T, accum, runner->describe().c_str());
  std::printf("%d steps recorded after %d warm-up; %s\n", N, o.bench.warmup,
              steps.front().front().graph_id != 0 ? "CUDA graph replays" : "eager steps");
  double span = 0, busy = 0;
  for (size_t s = 0; s < steps.size(); ++s) {
    const auto& k = steps[s];
    const double sp = (k.back().end - k.front().start) * 1e-3;
    double b = 0;
    for (const ActivityRecord& r : k) b += r.us();
    const double period = s + 1 < steps.size() ? (steps[s + 1].front().start - k.front().start) * 1e-3 : 0;
    std::printf("  step %zu: %zu kernels, span %.1f µs, kernel time %.1f µs (%.1f%%), gaps %.1f µs", s + 1,
                k.size(), sp, b, 100 * b / sp, sp - b);
    if (period > 0) std::printf(", to the next step's first kernel %.1f µs", period);
    std::printf("\n");
    span += sp / N;
    busy += b / N;
  }
  std::printf("mean: span %.1f µs, kernel time %.1f µs, gaps %.1f µs; wall time per step (bench's clock, "
              "under CUPTI) median %.2f ms\n\n",
              span, busy, span - busy, ms[ms.size() / 2]);

  // Rows by name: every recorded kernel, memcpy and memset, per step.
  std::map<std::pair<std::string, std::string>, Row> by;
  for (const auto& k : steps)
    for (const ActivityRecord& r : k) {
      Row& row = by[{"kernel", r.name}];
      row.calls += 1.0 / N;
      row.us += r.us() / N;
    }
  for (const ActivityRecord& r : copies) {
    Row& row = by[{r.kind == ActivityRecord::kMemcpy ? "memcpy" : "memset", r.name}];
    row.calls += 1.0 / N;
    row.us += r.us() / N;
    row.bytes += static_cast<double>(r.bytes) / N;
  }
  std::vector<Row> rows;
  for (auto& [key, row] : by) {
    row.kind = key.first;
    row.name = key.second;
    rows.push_back(row);
  }
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.us > b.us; });

  std::printf("| kernel | calls/step | µs/step | µs/call | share of span |\n| --- | ---: | ---: | ---: | ---: |\n");
  int shown = 0;
  Row other{"kernel", "other", 0, 0, 0};
  for (const Row& r : rows) {
    if (r.kind != "kernel") continue;
    if (shown++ < o.top)
      std::printf("| %s | %g | %.1f | %.2f | %.2f%% |\n", r.name.c_str(), r.calls, r.us, r.us / r.calls,
                  100 * r.us / span);
    else
      other.calls += r.calls, other.us += r.us;
  }
  if (other.calls > 0)
    std::printf("| other (%d names) | %g | %.1f | %.2f | %.2f%% |\n", shown - o.top, other.calls, other.us,
                other.us / other.calls, 100 * other.us / span);
  std::printf("| all kernels | %zu | %.1f | | %.2f%% |\n", steps.front().size(), busy, 100 * busy / span);
  std::printf("\n| copy | calls/step | bytes/call | µs/step |\n| --- | ---: | ---: | ---: |\n");
  for (const Row& r : rows)
    if (r.kind != "kernel")
      std::printf("| %s | %g | %.0f | %.1f |\n", r.name.c_str(), r.calls, r.bytes / r.calls, r.us);

  if (o.zero1 > 0) print_comm_overlap(steps, copies, N);

  if (!o.csv.empty()) {
    std::ofstream f(o.csv);
    if (!f) throw Error("--csv: cannot write '" + o.csv + "'");
    f << "kind,name,calls_per_step,us_per_step,us_per_call,share_of_span\n";
    char line[128];
    for (const Row& r : rows) {
      std::snprintf(line, sizeof line, ",%g,%.3f,%.4f,%.6f\n", r.calls, r.us, r.us / r.calls, r.us / span);
      f << r.kind << "," << csv_quoted(r.name) << line;
    }
    f << "step,span," << 1 << "," << span << "," << span << ",1\n";
    if (!f) throw Error("--csv: write to '" + o.csv + "' failed");
    std::printf("\nwrote %zu rows to %s\n", rows.size() + 1, o.csv.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Options o = parse(argc, argv);
    o.bench.cuda = forge::cli::cuda_settings_from_env();
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_timeline: %s\n", e.what());
    return 1;
  }
}
