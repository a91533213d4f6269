// The ranks of a data-parallel `forge train`, from the launcher that started this process
// (dist/bootstrap.h): mpirun, or Slurm's srun with an MPI that srun can start (PMI/PMIx), gives
// an MpiComm over its ranks; a torchrun-style environment (RANK / WORLD_SIZE / MASTER_ADDR /
// MASTER_PORT: torchrun, or `forge train --gpus N`) gives a TcpComm (dist/tcp_comm.h) whose
// setup waits up to 5 minutes for every rank; no launcher, or a world of one, gives nullptr (one
// process). GPU ranks add an NCCL communicator over the same ranks (cmd_train.cpp).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "forge/dist/communicator.h"

namespace forge::cli {

// Throws forge::Error when the launcher's variables are inconsistent, MPI is not built in (for
// mpirun / srun), MPI's world disagrees with the launcher's (a rank count MPI did not start), or
// the torchrun rendezvous fails.
std::unique_ptr<Communicator> open_world();

// GPUs this process can use (0 without the CUDA backend or a driver).
int gpu_count();

// `--gpus N` (forge train, forge bench train): the command line each of the N ranks runs —
// /proc/self/exe, then `command` (e.g. {"train"}), then argv without --gpus and the options in
// `drop`, each with its value. Throws forge::Error when this process already is a rank under a
// launcher, or the machine has fewer than n GPUs.
std::vector<std::string> gpus_rank_command(int n, const std::vector<std::string>& command,
                                           const std::vector<std::string>& argv,
                                           const std::vector<std::string>& drop = {});

}  // namespace forge::cli
