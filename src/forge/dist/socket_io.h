// POSIX TCP helpers shared by the rendezvous (tcp_rendezvous.h) and TcpComm (tcp_comm.h): a
// socket owner, and reads, writes and waits bounded by one deadline (every socket non-blocking,
// every wait a poll(), EINTR retried). Internal to dist/.
#pragma once

#include <netdb.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace forge::net {

using Clock = std::chrono::steady_clock;

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Socket& operator=(Socket&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = o.fd_;
      o.fd_ = -1;
    }
    return *this;
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() { reset(); }
  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);  // no retry on EINTR: Linux has closed the descriptor anyway
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

std::string sys_error(int err);
void set_nonblocking(int fd);
// Milliseconds until the deadline, 0 when it passed.
int ms_left(Clock::time_point deadline);
// Waits for `events` on fd until the deadline; false when it passed first.
bool wait_for(int fd, short events, Clock::time_point deadline);

enum class Io { kDone, kClosed, kTimedOut };
// Reads exactly n bytes. kClosed: the other end closed or reset the connection first.
Io read_all(int fd, void* data, size_t n, Clock::time_point deadline);
// Writes exactly n bytes (MSG_NOSIGNAL: a closed peer is an error, not SIGPIPE).
Io write_all(int fd, const void* data, size_t n, Clock::time_point deadline);

void put_u32(std::vector<uint8_t>& out, uint32_t v);
void put_u64(std::vector<uint8_t>& out, uint64_t v);
uint64_t get_be(const uint8_t* p, int bytes);  // a big-endian integer of `bytes` bytes

struct AddrInfoList {
  addrinfo* head = nullptr;
  ~AddrInfoList();
};

// A listening socket on every interface at `port` (0: one the system picks): IPv6 dual-stack,
// else IPv4. `endpoint` names it in the error.
Socket listen_any(int port, int backlog, const std::string& endpoint);
// A connected socket to one of `list`'s addresses, or an invalid one when none accepted yet
// (refused, unreachable). Waits at most until the deadline.
Socket try_connect(const addrinfo* list, Clock::time_point deadline);
// The local port a socket is bound to (after listen_any(0, ...)).
int local_port(int fd);

}  // namespace forge::net
