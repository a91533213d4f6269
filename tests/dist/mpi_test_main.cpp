// main() of forge_mpi_tests, which ctest starts as `mpirun -np 2 --oversubscribe` (label mpi).
// Every rank runs every test; a test must make the same collective calls on every rank whatever
// it finds (compare after communicating), or a failure on one rank hangs the other until the
// ctest timeout. The exit status is non-zero on every rank when a test failed on any.
//
// --abort-from-rank=R: no tests; rank R calls abort() while the others wait in a barrier that
// only the abort can end (the ctest `dist_mpi_abort` checks the status and the message).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>

#include "forge/dist/mpi_comm.h"
#include "mpi_world.h"

namespace forge::testing {

namespace {
Communicator* g_world = nullptr;
}

Communicator& mpi_world() {
  return *g_world;
}

}  // namespace forge::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  std::unique_ptr<forge::Communicator> world = forge::make_mpi_comm();
  forge::testing::g_world = world.get();
  for (int i = 1; i < argc; ++i) {
    const char* kAbort = "--abort-from-rank=";
    if (std::strncmp(argv[i], kAbort, std::strlen(kAbort)) == 0) {
      if (world->rank() == std::atoi(argv[i] + std::strlen(kAbort)))
        world->abort("stopping the run on purpose");
      world->barrier();
      return 0;  // reached only if abort() failed to stop this rank
    }
  }
  double failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  world->allreduce_sum(&failed, 1);
  world.reset();  // MPI_Finalize
  return failed > 0 ? 1 : 0;
}
