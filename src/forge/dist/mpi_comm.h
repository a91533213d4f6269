// The Communicator of CPU ranks started by mpirun (OpenMPI from Debian: libopenmpi-dev,
// openmpi-bin). Built when CMake finds MPI (FORGE_HAVE_MPI); otherwise make_mpi_comm() throws.
// mpi.h stays inside mpi_comm.cpp: nothing else in Forge compiles against MPI.
#pragma once

#include <memory>

#include "forge/dist/communicator.h"

namespace forge {

// Whether this Forge was built with MPI.
bool mpi_compiled();

// Initialises MPI (MPI_THREAD_FUNNELED: OpenMP threads compute, only the calling thread talks)
// unless the program already did, and returns a communicator over a duplicate of
// MPI_COMM_WORLD; local_rank() is the rank among the ranks sharing this machine's memory.
// Destroying the communicator that initialised MPI finalises it, and MPI cannot start twice in
// one process: make one per process and keep it for the run. A failed MPI call prints the call
// and MPI's message and aborts (mpirun then stops the other ranks). Throws forge::Error when
// Forge was built without MPI or MPI was already finalised.
std::unique_ptr<Communicator> make_mpi_comm();

}  // namespace forge
