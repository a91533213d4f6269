// Which rank this process is, from what the launcher that started it set in the environment.
//
//   launcher    rank / size / local rank variables                                 rendezvous
//   mpirun      OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE / OMPI_COMM_WORLD_LOCAL_RANK  MPI
//   torchrun    RANK / WORLD_SIZE / LOCAL_RANK                   MASTER_ADDR, MASTER_PORT
//   Slurm srun  SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID                           none
//
// Precedence when several are set: mpirun, then torchrun, then Slurm — the launcher closest to
// the process wins. Inside a Slurm allocation, `mpirun` and `srun torchrun` start processes that
// inherit the allocation's SLURM_* variables (SLURM_PROCID of the batch step or of the torchrun
// agent, not of this process), while the OMPI_* or RANK variables were set for this very process.
// A launcher counts as present when any one of its rank or size variables is set; then all three
// of its rank, size and local-rank variables (and torchrun's MASTER_ADDR / MASTER_PORT) must be
// set and consistent, else a one-line forge::Error names the variable and the value. None
// present: a world of one (launcher "none").
//
// Caveat: a command run directly in an `sbatch` script (not under srun) sees the batch step's
// SLURM_PROCID=0 and SLURM_NTASKS of the whole allocation, and would wait for ranks that never
// start; start ranks with srun (or mpirun), as Slurm intends.
//
// Pure: the environment comes in as a lookup function, so that tests feed maps and nothing in
// the library reads the process's environment (the CLI passes std::getenv).
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace forge {

struct LaunchInfo {
  std::string launcher = "none";  // "none", "mpirun", "torchrun" or "slurm"
  int rank = 0;                   // 0 .. size − 1
  int size = 1;                   // ranks in the world, >= 1
  int local_rank = 0;             // rank on this machine, 0 .. size − 1
  std::string master_addr;        // torchrun: host of rank 0's rendezvous; empty otherwise
  int master_port = 0;            // torchrun: its TCP port, 1 .. 65535; 0 otherwise
};

// The value of an environment variable, or nullopt when it is not set.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

// Throws forge::Error for a missing companion variable, a value that is not a base-10 integer,
// a size below 1, a rank or local rank not below the size, or a port outside 1 .. 65535.
LaunchInfo detect_launch(const EnvLookup& env);

// The process's environment as an EnvLookup (std::getenv); for the CLI.
EnvLookup process_env();

}  // namespace forge
