// TcpComm (dist/tcp_comm.h).
#include "forge/dist/tcp_comm.h"

#include <poll.h>
#include <sys/socket.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "forge/core/error.h"
#include "forge/dist/socket_io.h"
#include "forge/dist/tcp_rendezvous.h"

namespace forge {

namespace {

using namespace net;

constexpr uint32_t kHello = 0x46524748;  // "FRGH"

enum Op : uint32_t { kSumF32 = 1, kSumF64, kGather, kBroadcast, kBarrier };

const char* op_name(uint64_t op) {
  switch (op) {
    case kSumF32: return "allreduce_sum(f32)";
    case kSumF64: return "allreduce_sum(f64)";
    case kGather: return "allgather";
    case kBroadcast: return "broadcast";
    case kBarrier: return "barrier";
    default: return "an unknown collective";
  }
}

// Collectives wait as long as the slowest rank takes (a validation, a checkpoint).
Clock::time_point forever() {
  return Clock::now() + std::chrono::hours(24 * 365);
}

class TcpComm final : public Communicator {
 public:
  TcpComm(const LaunchInfo& l, std::chrono::milliseconds timeout)
      : rank_(l.rank), size_(l.size), local_rank_(l.local_rank) {
    const auto deadline = Clock::now() + timeout;
    const bool v6 = l.master_addr.find(':') != std::string::npos;
    const std::string endpoint = str(v6 ? "[" : "", l.master_addr, v6 ? "]" : "", ":", l.master_port);
    if (rank_ == 0) {
      Socket listener = listen_any(0, size_, "(any)");
      std::vector<uint8_t> blob;
      put_u32(blob, static_cast<uint32_t>(local_port(listener.fd())));
      tcp_broadcast(l, blob, timeout);
      peers_.resize(size_);
      for (int got = 1; got < size_;) {
        if (!wait_for(listener.fd(), POLLIN, deadline))
          throw Error(str("tcp communicator at ", endpoint, ": timed out after ", timeout.count(),
                          " ms: rank 0 heard from ", got - 1, " of ", size_ - 1, " peers"));
        Socket conn(::accept4(listener.fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
        if (!conn.valid()) continue;
        uint8_t hello[8];
        if (read_all(conn.fd(), hello, sizeof hello, deadline) != Io::kDone) continue;
        const uint64_t r = get_be(hello + 4, 4);
        if (get_be(hello, 4) != kHello || r < 1 || r >= static_cast<uint64_t>(size_) || peers_[r].valid())
          continue;  // not one of ours (the rendezvous already checked the world)
        peers_[r] = std::move(conn);
        ++got;
      }
      return;
    }
    const std::vector<uint8_t> blob = tcp_broadcast(l, {}, timeout);
    if (blob.size() != 4) throw Error(str("tcp communicator at ", endpoint, ": malformed port from rank 0"));
    const int port = static_cast<int>(get_be(blob.data(), 4));
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    AddrInfoList list;
    const std::string service = std::to_string(port);
    if (const int gai = ::getaddrinfo(l.master_addr.c_str(), service.c_str(), &hints, &list.head))
      throw Error(str("tcp communicator: cannot resolve MASTER_ADDR ", quote(l.master_addr), ": ",
                      ::gai_strerror(gai)));
    for (;;) {
      Socket s = try_connect(list.head, deadline);
      if (s.valid()) {
        hub_ = std::move(s);
        break;
      }
      if (Clock::now() >= deadline)
        throw Error(str("tcp communicator at ", l.master_addr, ":", port, ": rank ", rank_,
                        " cannot reach rank 0"));
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::vector<uint8_t> hello;
    put_u32(hello, kHello);
    put_u32(hello, static_cast<uint32_t>(rank_));
    if (write_all(hub_.fd(), hello.data(), hello.size(), deadline) != Io::kDone)
      throw Error(str("tcp communicator: rank ", rank_, " lost rank 0 while saying hello"));
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  std::string describe() const override { return str("tcp rank ", rank_, " of ", size_); }

  void allreduce_sum(float* buf, size_t n) override { sum(kSumF32, buf, n); }
  void allreduce_sum(double* buf, size_t n) override { sum(kSumF64, buf, n); }
  void reduce_scatter_sum(const float* in, float* out, size_t shard) override {
    std::vector<float> all(in, in + shard * size_);
    sum(kSumF32, all.data(), all.size());
    std::memcpy(out, all.data() + rank_ * shard, shard * sizeof(float));
  }
  void allgather(const float* in, float* out, size_t shard) override {
    const size_t bytes = shard * sizeof(float);
    collective(kGather, in, bytes, out, bytes * size_, [&](std::vector<std::vector<uint8_t>>& from) {
      std::memcpy(out, in, bytes);
      for (int r = 1; r < size_; ++r) std::memcpy(out + r * shard, from[r].data(), bytes);
    });
  }
  void broadcast(void* buf, size_t n, int root) override {
    FORGE_CHECK(root >= 0 && root < size_, "[broadcast] root ", root, " in a world of ", size_);
    // Every rank sends its bytes (one frame shape for all); rank 0 keeps the root's.
    collective(kBroadcast, buf, n, buf, n, [&](std::vector<std::vector<uint8_t>>& from) {
      if (root != 0) std::memcpy(buf, from[root].data(), n);
    });
  }
  void barrier() override {
    collective(kBarrier, nullptr, 0, nullptr, 0, [](std::vector<std::vector<uint8_t>>&) {});
  }
  [[noreturn]] void abort(const std::string& message) override {
    std::fprintf(stderr, "forge: rank %d: %s\n", rank_, message.c_str());
    std::fflush(nullptr);
    std::_Exit(1);  // the others see the connection close and end in turn
  }

 private:
  template <typename T>
  void sum(Op op, T* buf, size_t n) {
    collective(op, buf, n * sizeof(T), buf, n * sizeof(T), [&](std::vector<std::vector<uint8_t>>& from) {
      for (int r = 1; r < size_; ++r) {
        const T* x = reinterpret_cast<const T*>(from[r].data());
        for (size_t i = 0; i < n; ++i) buf[i] += x[i];
      }
    });
  }

  // Peers: send (op, in), receive out_bytes into out. Rank 0: receive every peer's frame (in
  // rank order), check it, run `reduce` (which writes rank 0's result into out), send out.
  template <typename Reduce>
  void collective(Op op, const void* in, size_t in_bytes, void* out, size_t out_bytes, Reduce reduce) {
    if (size_ == 1) {  // sums, broadcast and barrier of one rank change nothing
      if (op == kGather && in_bytes > 0) std::memcpy(out, in, in_bytes);
      return;
    }
    const auto deadline = forever();
    if (rank_ != 0) {
      std::vector<uint8_t> head;
      put_u32(head, op);
      put_u64(head, in_bytes);
      uint8_t ack = 0;  // every reply starts with one byte, so that a barrier waits for it
      if (write_all(hub_.fd(), head.data(), head.size(), deadline) != Io::kDone ||
          write_all(hub_.fd(), in, in_bytes, deadline) != Io::kDone ||
          read_all(hub_.fd(), &ack, 1, deadline) != Io::kDone ||
          read_all(hub_.fd(), out, out_bytes, deadline) != Io::kDone)
        abort(str("lost rank 0 in ", op_name(op), " (its connection closed: rank 0 ended; see its own message)"));
      return;
    }
    std::vector<std::vector<uint8_t>> from(size_);
    for (int r = 1; r < size_; ++r) {
      uint8_t head[12];
      if (read_all(peers_[r].fd(), head, sizeof head, deadline) != Io::kDone) lost(r, op);
      const uint64_t their_op = get_be(head, 4), bytes = get_be(head + 4, 8);
      if (their_op != op || bytes != in_bytes)
        abort(str("rank ", r, " called ", op_name(their_op), " of ", bytes, " bytes where rank 0 called ",
                  op_name(op), " of ", in_bytes, " bytes: the ranks ran different code paths"));
      from[r].resize(bytes);
      if (read_all(peers_[r].fd(), from[r].data(), bytes, deadline) != Io::kDone) lost(r, op);
    }
    reduce(from);
    const uint8_t ack = 0;
    for (int r = 1; r < size_; ++r)
      if (write_all(peers_[r].fd(), &ack, 1, deadline) != Io::kDone ||
          write_all(peers_[r].fd(), out, out_bytes, deadline) != Io::kDone)
        lost(r, op);
  }

  [[noreturn]] void lost(int r, Op op) {
    abort(str("lost rank ", r, " in ", op_name(op),
              " (its connection closed: that rank ended; see its own message)"));
  }

  int rank_, size_, local_rank_;
  Socket hub_;                 // peers: the connection to rank 0
  std::vector<Socket> peers_;  // rank 0: index r, the connection to rank r (0 unused)
};

}  // namespace

std::unique_ptr<Communicator> make_tcp_comm(const LaunchInfo& launch, std::chrono::milliseconds timeout) {
  if (launch.launcher != "torchrun")
    throw Error(str("the tcp communicator needs a torchrun launch (MASTER_ADDR / MASTER_PORT), not ",
                    launch.launcher));
  return std::make_unique<TcpComm>(launch, timeout);
}

}  // namespace forge
