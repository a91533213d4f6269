// open_world and gpu_count (world.h).
#include "world.h"

#include <chrono>

#ifdef FORGE_HAVE_CUDA
#include <cuda_runtime.h>
#endif

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

}  // namespace forge::cli
