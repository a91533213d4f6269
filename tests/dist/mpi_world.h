// The MPI communicator of the mpi test binary (tests/dist/mpi_test_main.cpp makes it once:
// MPI starts once per process).
#pragma once

#include "forge/dist/communicator.h"

namespace forge::testing {

Communicator& mpi_world();

}  // namespace forge::testing
