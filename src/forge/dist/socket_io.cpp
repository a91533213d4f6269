// POSIX socket helpers of the TCP rendezvous and TcpComm (dist/socket_io.h).
#include "forge/dist/socket_io.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "forge/core/error.h"

namespace forge::net {




std::string sys_error(int err) {
  return std::strerror(err);
}

void set_nonblocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0)
    throw Error(str("tcp: fcntl(O_NONBLOCK) failed: ", sys_error(errno)));
}

int ms_left(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::clamp<long long>(left.count(), 0, 1 << 30));
}

// Waits for `events` on fd until the deadline; false when it passed first.
bool wait_for(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, ms_left(deadline));
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) throw Error(str("tcp: poll failed: ", sys_error(errno)));
  }
}


// Reads exactly n bytes. kClosed: the other end closed or reset the connection first.
Io read_all(int fd, void* data, size_t n, Clock::time_point deadline) {
  auto* p = static_cast<uint8_t*>(data);
  while (n > 0) {
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r > 0) {
      p += r;
      n -= static_cast<size_t>(r);
    } else if (r == 0) {
      return Io::kClosed;
    } else if (errno == EINTR) {
      continue;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!wait_for(fd, POLLIN, deadline)) return Io::kTimedOut;
    } else if (errno == ECONNRESET) {
      return Io::kClosed;
    } else {
      throw Error(str("tcp: recv failed: ", sys_error(errno)));
    }
  }
  return Io::kDone;
}

// Writes exactly n bytes (MSG_NOSIGNAL: a closed peer is an error, not SIGPIPE).
Io write_all(int fd, const void* data, size_t n, Clock::time_point deadline) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t r = ::send(fd, p, n, MSG_NOSIGNAL);
    if (r >= 0) {
      p += r;
      n -= static_cast<size_t>(r);
    } else if (errno == EINTR) {
      continue;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!wait_for(fd, POLLOUT, deadline)) return Io::kTimedOut;
    } else if (errno == EPIPE || errno == ECONNRESET) {
      return Io::kClosed;
    } else {
      throw Error(str("tcp: send failed: ", sys_error(errno)));
    }
  }
  return Io::kDone;
}

void put_u32(std::vector<uint8_t>& out, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<uint8_t>(v >> s));
}
void put_u64(std::vector<uint8_t>& out, uint64_t v) {
  for (int s = 56; s >= 0; s -= 8) out.push_back(static_cast<uint8_t>(v >> s));
}
uint64_t get_be(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v = (v << 8) | p[i];
  return v;
}

AddrInfoList::~AddrInfoList() {
  if (head) ::freeaddrinfo(head);
}

// A listening socket on every interface at `port`: IPv6 dual-stack, else IPv4.
Socket listen_any(int port, int backlog, const std::string& endpoint) {
  int last_err = 0;
  for (const int family : {AF_INET6, AF_INET}) {
    Socket s(::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!s.valid()) {
      last_err = errno;
      continue;
    }
    const int one = 1;
    const int zero = 0;
    ::setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_storage ss{};
    socklen_t len = 0;
    if (family == AF_INET6) {
      ::setsockopt(s.fd(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
      auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
      a->sin6_family = AF_INET6;
      a->sin6_addr = in6addr_any;
      a->sin6_port = htons(static_cast<uint16_t>(port));
      len = sizeof *a;
    } else {
      auto* a = reinterpret_cast<sockaddr_in*>(&ss);
      a->sin_family = AF_INET;
      a->sin_addr.s_addr = htonl(INADDR_ANY);
      a->sin_port = htons(static_cast<uint16_t>(port));
      len = sizeof *a;
    }
    if (::bind(s.fd(), reinterpret_cast<sockaddr*>(&ss), len) == 0 &&
        ::listen(s.fd(), backlog) == 0) {
      set_nonblocking(s.fd());
      return s;
    }
    last_err = errno;
    if (last_err == EADDRINUSE) break;  // the other family would find the same port taken
  }
  throw Error(
      str("tcp: rank 0 cannot listen on port ", endpoint, ": ", sys_error(last_err)));
}

// A connected socket to one of `list`'s addresses, or an invalid one when none accepted yet
// (refused, unreachable). Waits at most until the deadline.
Socket try_connect(const addrinfo* list, Clock::time_point deadline) {
  for (const addrinfo* a = list; a; a = a->ai_next) {
    Socket s(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (!s.valid()) continue;
    set_nonblocking(s.fd());
    int r = ::connect(s.fd(), a->ai_addr, a->ai_addrlen);
    if (r != 0 && errno != EINPROGRESS && errno != EINTR) continue;
    if (r != 0) {
      if (!wait_for(s.fd(), POLLOUT, deadline)) return Socket();
      int err = 0;
      socklen_t len = sizeof err;
      if (::getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) continue;
    }
    return s;
  }
  return Socket();
}


int local_port(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0)
    throw Error(str("tcp: getsockname failed: ", sys_error(errno)));
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
}

}  // namespace forge::net
