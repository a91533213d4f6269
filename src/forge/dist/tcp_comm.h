// The host Communicator of ranks that torchrun (or `forge train --gpus N`) started: no MPI, so
// the collectives go over TCP through rank 0 (a star). For the trainer's few numbers per step
// (losses, the stop flag, barriers), the NCCL unique id (broadcast), and CPU ranks' ZeRO-1 (which
// moves whole gradient buffers through rank 0: correct, not fast — mpirun is the fast CPU path).
//
// Setup: rank 0 listens on a port the system picks and hands it to the others through the TCP
// rendezvous at MASTER_ADDR:MASTER_PORT (tcp_rendezvous.h, which checks the world: sizes, ranks,
// protocol); each peer then connects to MASTER_ADDR at that port and says its rank. The
// connections stay open for the run.
//
// Collectives: every peer sends rank 0 a frame (the operation, its byte count, the data); rank 0
// reads them in rank order, checks that every rank called the same collective with the same size
// (else it stops the world, naming the rank), computes, and sends each peer a byte and the
// result (the byte makes a barrier, which has no result, wait for rank 0). Sums are
// added in rank order (rank 0's values, then rank 1's, ...): deterministic, and identical on all
// ranks since rank 0 computes them once. Data travels in the host's byte order: every rank must
// run on the same architecture.
//
// Failure: a rank whose connection closes (its process ended) is named by the rank that notices:
// "forge: rank 0: lost rank 2 (its connection closed: that rank ended; see its own message)";
// that rank then ends too (exit status 1), and so does every other, in turn. abort() prints
// "forge: rank R: message" and ends this process at once (status 1).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "forge/dist/bootstrap.h"
#include "forge/dist/communicator.h"

namespace forge {

// Throws forge::Error when the setup fails or does not finish within `timeout` (the
// rendezvous's messages name what was missing). launch.launcher must be "torchrun".
std::unique_ptr<Communicator> make_tcp_comm(const LaunchInfo& launch, std::chrono::milliseconds timeout);

}  // namespace forge
