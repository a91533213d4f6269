// What forge bench train, forge bench train --sft and dev/train_timeline share
// (bench/train_bench_cuda.cpp).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench.h"
#include "forge/model/config.h"
#include "forge/train/runner.h"

namespace forge::bench {

// The preset with --set overrides (shape: its name and the overrides; recompute=LEVEL, a training
// setting, is checked and left to train_bench_levels) and max_seq_len ≥ --seq-len;
// throws forge::Error without a GPU.
ModelConfig train_bench_config(const BenchOptions& o, std::string* shape);
// The recompute levels of the --set recompute=LEVEL options, in order ({none} without any):
// forge bench train times each, one row per level; --sft takes the first.
std::vector<Recompute> train_bench_levels(const BenchOptions& o);
// A CUDA runner of o.precision with the table's seeded initial weights, at that recompute level.
std::unique_ptr<StepRunner> train_bench_runner(const ModelConfig& cfg, const BenchOptions& o, Recompute level);
// warmup + steps optimizer steps (micro_steps(s) queues step s's micro-batches), one step in
// flight as in training; returns the timed steps' wall times (ms, sorted) and the last report.
std::vector<double> time_train_steps(StepRunner& runner, const std::function<void(int)>& micro_steps,
                                     int warmup, int steps, StepReport* last);

}  // namespace forge::bench
