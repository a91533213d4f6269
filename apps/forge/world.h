// The ranks of a data-parallel `forge train`, from the launcher that started this process
// (dist/bootstrap.h): mpirun, or Slurm's srun with an MPI that srun can start (PMI/PMIx), gives
// an MpiComm over its ranks; a torchrun-style environment (RANK / WORLD_SIZE) is refused for CPU
// ranks, which talk over MPI only; no launcher, or a world of one, gives nullptr (one process).
#pragma once

#include <memory>

#include "forge/dist/communicator.h"

namespace forge::cli {

// Throws forge::Error when the launcher's variables are inconsistent, MPI is not built in, or
// MPI's world disagrees with the launcher's (a rank count MPI did not start).
std::unique_ptr<Communicator> open_world();

}  // namespace forge::cli
