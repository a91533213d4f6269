// The Communicator of GPU ranks: NCCL on device buffers, enqueued on one CUDA stream. Built when
// the CUDA backend is and CMake finds nccl.h and libnccl (FORGE_HAVE_NCCL); otherwise
// make_nccl_comm() throws. NCCL headers stay inside nccl_comm.cpp.
#pragma once

#include <memory>

#include "forge/dist/communicator.h"

namespace forge {

// Whether this Forge was built with NCCL.
bool nccl_compiled();

// A communicator over the same ranks as `bootstrap` (a host communicator, MpiComm for ranks that
// mpirun started), using GPU `device` and the CUDA stream `stream` (a cudaStream_t; nullptr is
// the legacy default stream). Rank 0 makes the NCCL unique id and `bootstrap` broadcasts it;
// bootstrap must outlive the result (barrier() and abort() go through it).
//
// Ranks that torchrun started have no MPI to broadcast the id: the hook for them is
// tcp_broadcast(LaunchInfo, ...) (dist/tcp_rendezvous.h), which carries rank 0's id to every
// rank over TCP at MASTER_ADDR:MASTER_PORT. Not wired here yet: that path also needs barrier()
// and abort() without a host communicator, and nothing builds an NcclComm yet (issue 15).
//
// Sets NCCL_NVLS_ENABLE=0 in the environment before ncclCommInitRank unless the user set it: our
// H200 machines fail NVLink SHARP (NVLS) setup, and NCCL reads the variable at init.
//
// Collectives are asynchronous: they return once enqueued on the stream, and buffers are device
// memory. broadcast() and barrier() are the exceptions: broadcast waits for the stream (callers
// pass host-visible sizes), barrier waits for this rank's queued work and then for every rank.
std::unique_ptr<Communicator> make_nccl_comm(Communicator& bootstrap, int device, void* stream);

// Sends `comm`'s collectives to `stream` from now on (the CUDA runner's, so that they order with
// its kernels and land in its captured step graph). Throws forge::Error when `comm` is not a
// communicator that make_nccl_comm() made.
void set_nccl_stream(Communicator& comm, void* stream);

}  // namespace forge
