// Rank 0 hands a small blob (the NCCL unique id) to every other rank over TCP: the rendezvous
// of ranks that torchrun started (MASTER_ADDR / MASTER_PORT, dist/bootstrap.h), where no MPI
// exists to broadcast it. Plain POSIX sockets.
//
// Protocol (all integers big-endian):
//   peer → rank 0   hello: magic "FRGT", protocol version 1, the peer's rank, its world size
//   rank 0 → peer   reply: magic "FRGT", status (0 ok, 1 refused), u64 length, then that many
//                   bytes: the blob, or the one-line reason rank 0 refused the world
// Rank 0 listens on every interface (IPv6 and IPv4 where the host has both, else IPv4) at
// `port` with SO_REUSEADDR, as torchrun's own store does, accepts size − 1 peers, checks each
// hello (magic, version, rank in 1 .. size − 1, not seen before, the same world size) and only
// then sends the blob to all. A bad hello makes rank 0 send the refusal to every peer connected
// so far and throw forge::Error naming the problem; those peers throw it too.
//
// Peers resolve `addr` with getaddrinfo (host names, IPv4 and IPv6 literals, "localhost") and
// retry the connection until the deadline, so rank 0 may start after them.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "forge/dist/bootstrap.h"

namespace forge {

// The largest blob the protocol carries (a peer refuses a longer reply as garbage).
inline constexpr size_t kTcpRendezvousMaxBlob = 1 << 20;

// Every rank returns rank 0's `blob` byte for byte (rank 0 returns its own; other ranks' `blob`
// is ignored). A world of one returns `blob` without touching the network. Throws forge::Error
// on bad arguments, a name that does not resolve, a refused hello, or when `timeout` passes
// first: "... at ADDR:PORT timed out after N ms: rank R ..." with, on rank 0, how many peers
// arrived.
std::vector<uint8_t> tcp_broadcast(const std::string& addr, int port, int rank, int size,
                                   const std::vector<uint8_t>& blob,
                                   std::chrono::milliseconds timeout);

// tcp_broadcast at a torchrun launch's MASTER_ADDR:MASTER_PORT with its rank and world size;
// the hook through which the NCCL communicator of torchrun-launched ranks gets its unique id
// (nccl_comm.h). Throws forge::Error unless `launch.launcher` is "torchrun".
std::vector<uint8_t> tcp_broadcast(const LaunchInfo& launch, const std::vector<uint8_t>& blob,
                                   std::chrono::milliseconds timeout);

}  // namespace forge
