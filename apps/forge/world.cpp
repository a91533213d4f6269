// open_world and gpu_count (world.h).
#include "world.h"

#include <chrono>

#ifdef FORGE_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include "forge/backend/cuda/runtime.h"
#include "forge/core/error.h"
#include "forge/dist/bootstrap.h"
#include "forge/dist/mpi_comm.h"
#include "forge/dist/tcp_comm.h"

namespace forge::cli {

std::unique_ptr<Communicator> open_world() {
  const LaunchInfo info = detect_launch(process_env());
  if (info.size == 1) return nullptr;
  if (info.launcher == "torchrun") return make_tcp_comm(info, std::chrono::minutes(5));
  std::unique_ptr<Communicator> comm = make_mpi_comm();
  if (comm->size() != info.size || comm->rank() != info.rank)
    throw Error(str(info.launcher, " set rank ", info.rank, " of ", info.size,
                    " but MPI started this process as rank ", comm->rank(), " of ", comm->size(),
                    (info.launcher == "slurm" ? " (srun needs an MPI with PMI support: try "
                                                "srun --mpi=pmix, or mpirun)"
                                              : "")));
  return comm;
}

int gpu_count() {
#ifdef FORGE_HAVE_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
#else
  return 0;
#endif
}

std::vector<std::string> gpus_rank_command(int n, const std::vector<std::string>& command,
                                           const std::vector<std::string>& argv,
                                           const std::vector<std::string>& drop) {
  const LaunchInfo launch = detect_launch(process_env());
  if (launch.launcher != "none")
    throw Error(str("--gpus starts its own ranks; this process is already rank ", launch.rank,
                    " of ", launch.size, " under ", launch.launcher, ": drop --gpus"));
  const int have = gpu_count();
  if (n > have)
    throw Error(str("--gpus ", n, ": this machine has ", have, " GPU", have == 1 ? "" : "s",
                    have == 0 ? " (" + cuda::device_summary() + ")" : ""));
  std::vector<std::string> cmd = {"/proc/self/exe"};
  cmd.insert(cmd.end(), command.begin(), command.end());
  auto dropped = [&](const std::string& arg, bool* with_value) {
    for (const std::string& name : drop)
      if (arg == "--" + name) return *with_value = true;
    if (arg == "--gpus") return *with_value = true;
    *with_value = false;
    if (arg.starts_with("--gpus=")) return true;
    for (const std::string& name : drop)
      if (arg.starts_with("--" + name + "=")) return true;
    return false;
  };
  for (size_t i = 0; i < argv.size(); ++i) {
    bool with_value = false;
    if (dropped(argv[i], &with_value)) {
      if (with_value) ++i;  // and its value
      continue;
    }
    cmd.push_back(argv[i]);
  }
  return cmd;
}

}  // namespace forge::cli
