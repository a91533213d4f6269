// open_world (world.h).
#include "world.h"

#include "forge/core/error.h"
#include "forge/dist/bootstrap.h"
#include "forge/dist/mpi_comm.h"

namespace forge::cli {

std::unique_ptr<Communicator> open_world() {
  const LaunchInfo info = detect_launch(process_env());
  if (info.size == 1) return nullptr;
  if (info.launcher == "torchrun")
    throw Error(str("torchrun-style environment (RANK=", info.rank, ", WORLD_SIZE=", info.size,
                    "): CPU ranks communicate over MPI; start them with mpirun or srun"));
  std::unique_ptr<Communicator> comm = make_mpi_comm();
  if (comm->size() != info.size || comm->rank() != info.rank)
    throw Error(str(info.launcher, " set rank ", info.rank, " of ", info.size,
                    " but MPI started this process as rank ", comm->rank(), " of ", comm->size(),
                    (info.launcher == "slurm" ? " (srun needs an MPI with PMI support: try "
                                                "srun --mpi=pmix, or mpirun)"
                                              : "")));
  return comm;
}

}  // namespace forge::cli
