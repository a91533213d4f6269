// forge bench train --sft: supervised fine-tuning throughput on the GPU beside pretraining, in
// one run of one model shape. Three layouts of B × T rows, each on a fresh runner:
//   pretrain  random tokens, every position trained (what forge bench train measures);
//   sft pad   one example a row, the rest of the row padding (forge train --sft);
//   sft pack  examples placed greedily in rows, attention kept inside each example and
//             positions restarting (forge train --sft --pack; data/sft_data.h's packed layout).
// The examples are synthetic: lengths uniform in [--sft-lengths MIN,MAX] tokens, random ids, the
// first quarter of each a prompt (untrained) and the rest its response (trained). The rows come
// from the same SftData code the trainer uses, built before the timed steps (the data loader is
// not what is measured).
// Reported per layout: rows' tokens/s (B·T / step time), example tokens/s (the non-padding
// tokens / step time: the useful throughput), and that as a fraction of pretraining's tokens/s —
// the figure the SFT issue's goal (≥ 90% with packing) is about.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "bench.h"
#include "forge/backend/cuda/runtime.h"
#include "forge/core/error.h"
#include "forge/core/rng.h"
#include "forge/data/sft_data.h"
#include "train_bench.h"

namespace forge::bench {

namespace {

struct Batch {
  std::vector<int32_t> x, y, pos, seg;
  int64_t tokens = 0;  // non-padding input tokens
};

struct LayoutResult {
  std::string name;
  double step_ms = 0, row_tps = 0, example_tps = 0, fill = 0, loss = 0, peak_gb = 0;
};

std::vector<SftRow> synthetic_examples(int64_t count, int lo, int hi, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  std::vector<SftRow> rows(static_cast<size_t>(count));
  for (SftRow& r : rows) {
    const int n = lo + static_cast<int>(rng.below(static_cast<uint64_t>(hi - lo + 1)));
    r.ids.resize(static_cast<size_t>(n));
    r.trained.assign(static_cast<size_t>(n), 0);
    for (int i = 0; i < n; ++i) {
      r.ids[i] = static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab)));
      r.trained[i] = i >= n / 4;  // the prompt: the first quarter
    }
  }
  return rows;
}

// `count` batches of B rows of T from the data, in its epoch order.
std::vector<Batch> make_batches(SftData& data, int count, int B, int T, int32_t pad) {
  std::vector<Batch> out(static_cast<size_t>(count));
  uint64_t position = 0;
  const size_t n = static_cast<size_t>(B) * T;
  for (Batch& b : out) {
    b.x.assign(n, pad), b.y.assign(n, -1);
    if (data.packed()) b.pos.assign(n, 0), b.seg.assign(n, 0);
    const uint64_t from = position;
    data.next_batch(position, B, b.x.data(), b.y.data(), data.packed() ? b.pos.data() : nullptr,
                    data.packed() ? b.seg.data() : nullptr);
    b.tokens = data.input_tokens(from, position);
  }
  return out;
}

LayoutResult run_layout(const std::string& name, const ModelConfig& cfg, const BenchOptions& o,
                        const std::vector<Batch>& batches) {
  const int B = o.batch, T = o.seq_len;
  std::unique_ptr<StepRunner> runner = train_bench_runner(cfg, o, train_bench_levels(o)[0]);
  StepReport last;
  const std::vector<double> ms = time_train_steps(
      *runner,
      [&](int s) {
        const Batch& b = batches[static_cast<size_t>(s)];
        if (!b.pos.empty()) runner->set_token_layout(b.pos.data(), b.seg.data());
        runner->micro_step(b.x.data(), b.y.data(), B, T, 1.0);
      },
      o.warmup, o.steps, &last);
  LayoutResult r;
  r.name = name;
  r.step_ms = ms[ms.size() / 2];
  int64_t tokens = 0;  // over the timed steps
  for (int s = o.warmup; s < o.warmup + o.steps; ++s) tokens += batches[static_cast<size_t>(s)].tokens;
  const double rows_tokens = static_cast<double>(B) * T;
  const double mean_tokens = static_cast<double>(tokens) / o.steps;
  r.row_tps = rows_tokens / (r.step_ms * 1e-3);
  r.example_tps = mean_tokens / (r.step_ms * 1e-3);
  r.fill = mean_tokens / rows_tokens;
  for (double l : last.micro_losses) r.loss += l;
  r.peak_gb = runner->peak_device_bytes() / 1e9;
  return r;
}

}  // namespace

void train_sft_cuda(const BenchOptions& o) {
  std::string shape;
  const ModelConfig cfg = train_bench_config(o, &shape);
  const int B = o.batch, T = o.seq_len;
  const int lo = std::min(o.sft_min, T + 1), hi = std::min(o.sft_max, T + 1);
  if (lo < 2 || lo > hi)
    throw Error(str("--sft-lengths: need 2 <= MIN <= MAX, got ", o.sft_min, ",", o.sft_max));
  const int count = o.warmup + o.steps;  // batches: one per step
  // Enough examples for `count` packed batches (rows hold at least T / hi examples, padded
  // batches B each), plus one row's worth of slack.
  const int64_t per_row = std::max<int64_t>(1, (T + hi - 1) / std::max(1, lo));
  const int64_t examples = static_cast<int64_t>(B) * (count + 1) * per_row;
  const std::vector<SftRow> rows = synthetic_examples(examples, lo, hi, cfg.vocab_size, 7);
  std::printf("forge bench train --sft: %s, %s, micro-batch %d x %d, recompute %s, %lld synthetic "
              "examples of %d..%d tokens (a quarter prompt); median of %d steps after %d warm-up\n",
              shape.c_str(), o.precision.c_str(), B, T, recompute_name(train_bench_levels(o)[0]),
              static_cast<long long>(examples), lo, hi, o.steps, o.warmup);
  std::fflush(stdout);

  std::vector<LayoutResult> results;
  {  // pretraining rows: every position a token and a target
    Batch b;
    const size_t n = static_cast<size_t>(B) * T;
    std::vector<int32_t> x(n + 1);
    Rng rng(5);
    for (auto& t : x) t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(cfg.vocab_size)));
    b.x.assign(x.begin(), x.end() - 1), b.y.assign(x.begin() + 1, x.end());
    b.tokens = static_cast<int64_t>(n);
    results.push_back(run_layout("pretrain", cfg, o, std::vector<Batch>(static_cast<size_t>(count), b)));
  }
  for (const bool pack : {false, true}) {
    SftSettings s;
    s.seq_len = T;
    s.val_frac = 0;
    s.seed = 11;
    s.pack = pack;
    SftData data(rows, s);
    const std::vector<Batch> batches = make_batches(data, count, B, T, 0);
    results.push_back(run_layout(pack ? "sft pack" : "sft pad", cfg, o, batches));
  }

  const double base = results[0].row_tps;
  std::printf("\n%-10s %12s %14s %8s %10s %12s %10s %10s\n", "layout", "rows tok/s", "example tok/s",
              "filled", "step (ms)", "of pretrain", "peak (GB)", "loss");
  for (const LayoutResult& r : results)
    std::printf("%-10s %12.0f %14.0f %7.1f%% %10.1f %11.1f%% %10.1f %10.4f\n", r.name.c_str(), r.row_tps,
                r.example_tps, 100 * r.fill, r.step_ms, 100 * r.example_tps / base, r.peak_gb, r.loss);
  std::printf("\nexample tok/s: the rows' non-padding tokens per second; 'of pretrain' divides it by "
              "the pretraining rows' tokens/s of this run (device %s).\n",
              cuda::device_summary().c_str());
  if (!o.json_out.empty()) {
    nlohmann::json j{{"bench", "train --sft"}, {"preset", o.preset}, {"shape", shape},
                     {"precision", o.precision}, {"batch", B}, {"seq_len", T},
                     {"recompute", recompute_name(train_bench_levels(o)[0])},
                     {"sft_lengths", {lo, hi}}};
    for (const LayoutResult& r : results)
      j["layouts"][r.name] = {{"rows_tokens_per_s", r.row_tps}, {"example_tokens_per_s", r.example_tps},
                              {"filled", r.fill}, {"step_ms", r.step_ms}, {"peak_gb", r.peak_gb},
                              {"loss", r.loss}};
    std::ofstream(o.json_out) << j.dump(2) << "\n";
  }
}

}  // namespace forge::bench
