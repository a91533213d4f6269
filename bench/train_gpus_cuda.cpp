// forge bench train --gpus N: data-parallel scaling on the GPUs of this machine, measured in one
// invocation. The supervisor (this process) never touches a GPU itself; it starts this bench's
// own command line twice, as `forge train --gpus` starts its ranks (dist/local_launch.h):
//   1. one rank with the plain one-GPU runner (the single-GPU figure), then
//   2. N ranks, each building an NCCL communicator over the torchrun-style environment and the
//      data-parallel runner (ZeRO-1, train/zero1_cuda.h) on GPU LOCAL_RANK, each rank training
//      its own micro-batch of B × T tokens (so the global batch is N × B × T).
// With N = 1 the second run is the ZeRO-1 path on one rank (CudaSettings::zero1_one_rank): what
// the data-parallel machinery costs when there is nothing to communicate.
// Rank 0 of each run writes its numbers (JSON) to a file the supervisor reads; the table gives
// tokens/s of both runs and the scaling efficiency tokens/s(N) ÷ (N × tokens/s(1)).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "bench.h"
#include "forge/core/error.h"
#include "forge/dist/local_launch.h"

namespace forge::bench {

namespace {

nlohmann::json run_ranks(const std::vector<std::string>& rank_argv, int ranks, bool plain,
                         const std::filesystem::path& result) {
  LocalLaunch l;
  l.ranks = ranks;
  l.argv = rank_argv;
  l.argv.insert(l.argv.end(), {"--rank-result", result.string()});
  if (plain) l.argv.push_back("--rank-plain");
  std::fflush(stdout);
  const LaunchOutcome out = run_local_ranks(l);
  if (out.status != 0)
    throw Error(str("forge bench train --gpus: the ", plain ? "one-GPU" : str(ranks, "-GPU"), " run failed: ",
                    out.message));
  std::ifstream in(result);
  if (!in) throw Error("forge bench train --gpus: rank 0 wrote no result to " + result.string());
  return nlohmann::json::parse(in);
}

}  // namespace

void train_gpus_cuda(const BenchOptions& o, int gpus, const std::vector<std::string>& rank_argv) {
  if (o.sft) throw Error("forge bench train: --gpus and --sft do not go together (yet)");
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / str("forge-bench-gpus-", ::getpid());
  fs::create_directories(dir);
  struct Cleanup {
    fs::path d;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(d, ec);
    }
  } cleanup{dir};
  std::printf("forge bench train --gpus %d: 1. one GPU, the plain runner\n\n", gpus);
  const nlohmann::json one = run_ranks(rank_argv, 1, true, dir / "one.json");
  std::printf("\nforge bench train --gpus %d: 2. %d rank(s), ZeRO-1 over NCCL\n\n", gpus, gpus);
  const nlohmann::json many = run_ranks(rank_argv, gpus, false, dir / "many.json");
  const double t1 = one.at("tokens_per_s").get<double>(), tn = many.at("tokens_per_s").get<double>();
  const double eff = tn / (gpus * t1);
  std::printf("\nforge bench train --gpus %d: %s, %s, micro-batch %d x %d per GPU\n", gpus,
              one.at("shape").get<std::string>().c_str(), o.precision.c_str(), o.batch, o.seq_len);
  std::printf("| GPUs | runner | tokens/s | tokens/s per GPU | step (ms) | peak GB (rank 0) | efficiency |\n");
  std::printf("| ---: | --- | ---: | ---: | ---: | ---: | ---: |\n");
  std::printf("| 1 | plain | %.0f | %.0f | %.1f | %.1f | 1.000 |\n", t1, t1, one.at("step_ms").get<double>(),
              one.at("peak_gb").get<double>());
  std::printf("| %d | ZeRO-1, NCCL | %.0f | %.0f | %.1f | %.1f | %.3f |\n", gpus, tn, tn / gpus,
              many.at("step_ms").get<double>(), many.at("peak_gb").get<double>(), eff);
  std::printf("\nefficiency = tokens/s of %d GPU(s) / (%d x tokens/s of one GPU), both measured above.%s\n",
              gpus, gpus,
              gpus == 1 ? " With one GPU the second row is the data-parallel path with nothing to "
                          "communicate: its cost over the plain runner."
                        : "");
  if (!o.json_out.empty())
    std::ofstream(o.json_out) << nlohmann::json{{"bench", "train --gpus"},
                                                {"gpus", gpus},
                                                {"one_gpu", one},
                                                {"data_parallel", many},
                                                {"efficiency", eff}}
                                     .dump(2)
                              << "\n";
}

}  // namespace forge::bench
