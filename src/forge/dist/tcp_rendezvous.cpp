// tcp_broadcast (dist/tcp_rendezvous.h). Every socket is non-blocking and owned by a Socket
// (closed on every path); every wait is a poll() bounded by the one deadline; EINTR retries
// (dist/socket_io.h).
#include "forge/dist/tcp_rendezvous.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "forge/core/error.h"
#include "forge/dist/socket_io.h"

namespace forge {

namespace {

using namespace net;

constexpr uint32_t kMagic = 0x46524754;  // "FRGT"
constexpr uint32_t kVersion = 1;
constexpr uint32_t kOk = 0;
constexpr uint32_t kRefused = 1;

// Where the rendezvous happens and who is asking, for messages.
struct Where {
  std::string endpoint;  // "addr:port", IPv6 literals in brackets
  int rank;
  int size;
  std::chrono::milliseconds timeout;
};

std::vector<uint8_t> reply(uint32_t status, const uint8_t* payload, size_t n) {
  std::vector<uint8_t> out;
  out.reserve(16 + n);
  put_u32(out, kMagic);
  put_u32(out, status);
  put_u64(out, n);
  out.insert(out.end(), payload, payload + n);
  return out;
}

std::string timed_out(const Where& w) {
  return str("tcp rendezvous at ", w.endpoint, " timed out after ", w.timeout.count(), " ms: ");
}

// ---------------------------------------------------------------------------------------------
// Rank 0

// Sends the refusal to every peer (best effort, briefly) and throws it.
[[noreturn]] void refuse(std::vector<Socket>& peers, const std::string& why) {
  const auto msg = reply(kRefused, reinterpret_cast<const uint8_t*>(why.data()), why.size());
  const auto deadline = Clock::now() + std::chrono::milliseconds(500);
  for (auto& p : peers) {
    try {
      write_all(p.fd(), msg.data(), msg.size(), deadline);
    } catch (const Error&) {  // that peer is gone; the others still hear why
    }
  }
  throw Error(why);
}

std::vector<uint8_t> serve(const Where& w, int port, const std::vector<uint8_t>& blob,
                           Clock::time_point deadline) {
  Socket listener = listen_any(port, w.size, w.endpoint);
  std::vector<Socket> peers;
  std::vector<bool> seen(static_cast<size_t>(w.size), false);
  const auto arrived = [&] {
    return str("rank 0 heard from ", peers.size(), " of ", w.size - 1, " peers");
  };
  while (static_cast<int>(peers.size()) < w.size - 1) {
    if (!wait_for(listener.fd(), POLLIN, deadline)) refuse(peers, timed_out(w) + arrived());
    Socket conn(::accept4(listener.fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!conn.valid()) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK || errno == ECONNABORTED)
        continue;
      refuse(peers, str("tcp rendezvous at ", w.endpoint, ": accept failed: ", sys_error(errno)));
    }
    uint8_t hello[16];
    const Io io = read_all(conn.fd(), hello, sizeof hello, deadline);
    if (io == Io::kTimedOut)
      refuse(peers, timed_out(w) + arrived() + " (one connected but sent no hello)");
    if (io == Io::kClosed) continue;  // a connection that closed at once: not one of ours
    const uint64_t magic = get_be(hello, 4), version = get_be(hello + 4, 4);
    const uint64_t rank = get_be(hello + 8, 4), size = get_be(hello + 12, 4);
    peers.push_back(std::move(conn));
    const std::string at = str("tcp rendezvous at ", w.endpoint, ": ");
    if (magic != kMagic)
      refuse(peers, at + "a connection sent a hello without Forge's magic (not a Forge rank?)");
    if (version != kVersion)
      refuse(peers, str(at, "a peer speaks protocol version ", version, ", rank 0 speaks ",
                        kVersion, " (mixed Forge builds?)"));
    if (size != static_cast<uint64_t>(w.size))
      refuse(peers, str(at, "world size mismatch: rank ", rank, " says WORLD_SIZE=", size,
                        ", rank 0 says ", w.size));
    if (rank < 1 || rank >= static_cast<uint64_t>(w.size))
      refuse(peers, str(at, "a peer says it is rank ", rank, ", outside 1 .. ", w.size - 1));
    if (seen[rank]) refuse(peers, str(at, "duplicate rank: two peers say they are rank ", rank));
    seen[rank] = true;
  }
  const auto msg = reply(kOk, blob.data(), blob.size());
  for (auto& p : peers)
    if (write_all(p.fd(), msg.data(), msg.size(), deadline) == Io::kTimedOut)
      throw Error(timed_out(w) + "rank 0 could not send the id to every peer");
  // A peer that closed before reading its reply fails on its side; rank 0 has done its part.
  return blob;
}

// ---------------------------------------------------------------------------------------------
// Peers

std::vector<uint8_t> join(const Where& w, const std::string& addr, int port,
                          Clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  AddrInfoList list;
  const std::string service = std::to_string(port);
  int gai = 0;
  do gai = ::getaddrinfo(addr.c_str(), service.c_str(), &hints, &list.head);
  while (gai == EAI_AGAIN && Clock::now() < deadline);
  if (gai != 0)
    throw Error(
        str("tcp rendezvous: cannot resolve MASTER_ADDR ", quote(addr), ": ", ::gai_strerror(gai)));

  const std::string at = str("tcp rendezvous at ", w.endpoint, ": rank ", w.rank, ": ");
  for (;;) {
    Socket s = try_connect(list.head, deadline);
    if (!s.valid()) {
      if (Clock::now() >= deadline)
        throw Error(timed_out(w) + str("rank ", w.rank, " of ", w.size, " never reached rank 0"));
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min(50, ms_left(deadline))));
      continue;
    }
    std::vector<uint8_t> hello;
    put_u32(hello, kMagic);
    put_u32(hello, kVersion);
    put_u32(hello, static_cast<uint32_t>(w.rank));
    put_u32(hello, static_cast<uint32_t>(w.size));
    Io io = write_all(s.fd(), hello.data(), hello.size(), deadline);
    uint8_t head[16];
    if (io == Io::kDone) io = read_all(s.fd(), head, sizeof head, deadline);
    if (io == Io::kTimedOut)
      throw Error(timed_out(w) +
                  str("rank ", w.rank, " of ", w.size, " reached rank 0 but got no reply"));
    if (io == Io::kClosed)
      throw Error(at + "rank 0 closed the connection without a reply (it failed; see its message)");
    if (get_be(head, 4) != kMagic)
      throw Error(at + "the reply lacks Forge's magic: is MASTER_PORT another program's?");
    const uint64_t status = get_be(head + 4, 4), n = get_be(head + 8, 8);
    if (n > kTcpRendezvousMaxBlob || (status != kOk && status != kRefused))
      throw Error(str(at, "malformed reply from rank 0 (status ", status, ", length ", n, ")"));
    std::vector<uint8_t> payload(n);
    io = read_all(s.fd(), payload.data(), payload.size(), deadline);
    if (io != Io::kDone)
      throw Error(at + "rank 0's reply was cut short (" +
                  (io == Io::kTimedOut ? "timed out)" : "connection closed)"));
    if (status == kRefused)
      throw Error(
          str("rank 0 refused the rendezvous: ", std::string(payload.begin(), payload.end())));
    return payload;
  }
}

}  // namespace

std::vector<uint8_t> tcp_broadcast(const std::string& addr, int port, int rank, int size,
                                   const std::vector<uint8_t>& blob,
                                   std::chrono::milliseconds timeout) {
  if (size < 1 || rank < 0 || rank >= size)
    throw Error(str("tcp rendezvous: rank ", rank, " is not in a world of ", size));
  if (port < 1 || port > 65535)
    throw Error(str("tcp rendezvous: port ", port, " is not 1 .. 65535"));
  if (timeout.count() <= 0) throw Error("tcp rendezvous: the timeout must be positive");
  if (rank == 0 && blob.size() > kTcpRendezvousMaxBlob)
    throw Error(str("tcp rendezvous: a blob of ", blob.size(), " bytes is over the limit of ",
                    kTcpRendezvousMaxBlob));
  if (size == 1) return blob;
  const bool v6 = addr.find(':') != std::string::npos;
  const Where w{str(v6 ? "[" : "", addr, v6 ? "]" : "", ":", port), rank, size, timeout};
  const auto deadline = Clock::now() + timeout;
  return rank == 0 ? serve(w, port, blob, deadline) : join(w, addr, port, deadline);
}

std::vector<uint8_t> tcp_broadcast(const LaunchInfo& launch, const std::vector<uint8_t>& blob,
                                   std::chrono::milliseconds timeout) {
  if (launch.launcher != "torchrun")
    throw Error(str("tcp rendezvous needs a torchrun launch (MASTER_ADDR / MASTER_PORT), not ",
                    launch.launcher));
  return tcp_broadcast(launch.master_addr, launch.master_port, launch.rank, launch.size, blob,
                       timeout);
}

}  // namespace forge
