// tcp_broadcast (dist/tcp_rendezvous.h): one thread per rank on the loopback interface, each on
// an ephemeral port that was free a moment before. Every timeout is short, so no test can hang.
#include "forge/dist/tcp_rendezvous.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <random>
#include <thread>

#include "dist/free_port.h"
#include "forge/core/error.h"

namespace forge {
namespace {

using std::chrono::milliseconds;

using testing::free_port;

bool ipv6_loopback_works() {
  const int fd = ::socket(AF_INET6, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_loopback;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

std::vector<uint8_t> random_blob(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<uint8_t> b(n);
  for (auto& x : b) x = static_cast<uint8_t>(g());
  return b;
}

struct Outcome {
  std::vector<uint8_t> got;
  std::string error;  // empty: no exception
};

// Runs `body(i)` on one thread per entry and returns each one's result or error message.
std::vector<Outcome> run_ranks(int n, const std::function<std::vector<uint8_t>(int)>& body) {
  std::vector<Outcome> out(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i)
    threads.emplace_back([&out, &body, i] {
      try {
        out[static_cast<size_t>(i)].got = body(i);
      } catch (const Error& e) {
        out[static_cast<size_t>(i)].error = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return out;
}

void expect_everyone_gets(const std::string& addr, int size, size_t bytes) {
  const int port = free_port();
  const auto blob = random_blob(bytes, static_cast<uint32_t>(size));
  const auto out = run_ranks(size, [&](int r) {
    // Only rank 0's blob may travel: the others pass garbage of another length.
    return tcp_broadcast(addr, port, r, size, r == 0 ? blob : std::vector<uint8_t>(3, 7),
                         milliseconds(5000));
  });
  for (int r = 0; r < size; ++r) {
    EXPECT_EQ(out[r].error, "") << "rank " << r;
    EXPECT_EQ(out[r].got, blob) << "rank " << r;
  }
}

TEST(TcpRendezvous, EveryRankReceivesRankZerosBlobByteForByte) {
  expect_everyone_gets("127.0.0.1", 2, 128);  // the size of an ncclUniqueId
  expect_everyone_gets("127.0.0.1", 4, 128);
  expect_everyone_gets("localhost", 4, 300000);  // several partial reads and writes
  expect_everyone_gets("127.0.0.1", 3, 0);
}

TEST(TcpRendezvous, WorksOverIpv6Loopback) {
  if (!ipv6_loopback_works()) GTEST_SKIP() << "no IPv6 loopback here";
  expect_everyone_gets("::1", 3, 128);
}

TEST(TcpRendezvous, AWorldOfOneNeedsNoNetwork) {
  const auto blob = random_blob(16, 1);
  // Port 1 is privileged: any attempt to listen there as a user would fail.
  EXPECT_EQ(tcp_broadcast("127.0.0.1", 1, 0, 1, blob, milliseconds(100)), blob);
}

TEST(TcpRendezvous, RankZeroMayStartAfterThePeers) {
  const int port = free_port();
  const auto blob = random_blob(128, 5);
  const auto out = run_ranks(4, [&](int r) {
    if (r == 0) std::this_thread::sleep_for(milliseconds(400));  // peers are refused meanwhile
    return tcp_broadcast("127.0.0.1", port, r, 4, blob, milliseconds(5000));
  });
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(out[r].error, "") << "rank " << r;
    EXPECT_EQ(out[r].got, blob) << "rank " << r;
  }
}

TEST(TcpRendezvous, TheTorchrunLaunchIsTheHook) {
  const int port = free_port();
  const auto blob = random_blob(128, 6);
  const auto out = run_ranks(2, [&](int r) {
    LaunchInfo l;
    l.launcher = "torchrun";
    l.rank = r;
    l.size = 2;
    l.local_rank = r;
    l.master_addr = "127.0.0.1";
    l.master_port = port;
    return tcp_broadcast(l, blob, milliseconds(5000));
  });
  EXPECT_EQ(out[0].got, blob);
  EXPECT_EQ(out[1].got, blob);
  LaunchInfo mpi;
  mpi.launcher = "mpirun";
  mpi.size = 2;
  EXPECT_THROW(tcp_broadcast(mpi, blob, milliseconds(100)), Error);
}

TEST(TcpRendezvous, AMismatchedWorldSizeIsRefusedByName) {
  const int port = free_port();
  const auto out = run_ranks(2, [&](int r) {
    // Rank 0 believes in 2 ranks; rank 1 in 3.
    return tcp_broadcast("127.0.0.1", port, r, r == 0 ? 2 : 3, {1, 2, 3}, milliseconds(3000));
  });
  const std::string why = "world size mismatch: rank 1 says WORLD_SIZE=3, rank 0 says 2";
  EXPECT_NE(out[0].error.find(why), std::string::npos) << out[0].error;
  EXPECT_NE(out[1].error.find("rank 0 refused the rendezvous"), std::string::npos) << out[1].error;
  EXPECT_NE(out[1].error.find(why), std::string::npos) << out[1].error;
  EXPECT_TRUE(out[1].got.empty());
}

TEST(TcpRendezvous, ADuplicateRankIsRefusedByName) {
  const int port = free_port();
  const auto out = run_ranks(3, [&](int r) {
    return tcp_broadcast("127.0.0.1", port, r == 2 ? 1 : r, 3, {1, 2, 3}, milliseconds(3000));
  });
  const std::string why = "duplicate rank: two peers say they are rank 1";
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(out[r].error.find(why), std::string::npos) << "rank " << r << ": " << out[r].error;
    EXPECT_TRUE(out[r].got.empty());
  }
}

// A hand-made client: sends `hello` to rank 0 at 127.0.0.1:port (retrying until it listens) and
// returns rank 0's status word, or -1 when it closed without a reply.
long raw_hello(int port, const std::vector<uint8_t>& hello) {
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(fd);
      std::this_thread::sleep_for(milliseconds(10));
      continue;
    }
    EXPECT_EQ(::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL), ssize_t(hello.size()));
    uint8_t head[8];
    size_t got = 0;
    while (got < sizeof head) {
      const ssize_t r = ::recv(fd, head + got, sizeof head - got, 0);
      if (r <= 0) break;
      got += static_cast<size_t>(r);
    }
    ::close(fd);
    return got == sizeof head ? long(head[4]) << 24 | head[5] << 16 | head[6] << 8 | head[7] : -1;
  }
  return -1;
}

std::vector<uint8_t> be_words(std::initializer_list<uint32_t> words) {
  std::vector<uint8_t> out;
  for (uint32_t w : words)
    for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<uint8_t>(w >> s));
  return out;
}

// Rank 0's error for one hand-made hello in a world of 2, and the status the client read.
std::pair<std::string, long> rank_zero_meets(const std::vector<uint8_t>& hello) {
  const int port = free_port();
  long status = -2;
  const auto out = run_ranks(2, [&](int r) {
    if (r == 1) {
      status = raw_hello(port, hello);
      return std::vector<uint8_t>{};
    }
    return tcp_broadcast("127.0.0.1", port, 0, 2, {9}, milliseconds(3000));
  });
  return {out[0].error, status};
}

TEST(TcpRendezvous, BadHellosAreRefusedByName) {
  const uint32_t magic = 0x46524754;
  auto [err, status] = rank_zero_meets(be_words({magic, 1, 5, 2}));
  EXPECT_NE(err.find("a peer says it is rank 5, outside 1 .. 1"), std::string::npos) << err;
  EXPECT_EQ(status, 1);  // refused, and told so
  std::tie(err, status) = rank_zero_meets(be_words({magic, 1, 0, 2}));
  EXPECT_NE(err.find("rank 0, outside 1 .. 1"), std::string::npos) << err;
  std::tie(err, status) = rank_zero_meets(be_words({0x47455420, 1, 1, 2}));  // "GET " ...
  EXPECT_NE(err.find("without Forge's magic"), std::string::npos) << err;
  EXPECT_EQ(status, 1);
  std::tie(err, status) = rank_zero_meets(be_words({magic, 2, 1, 2}));
  EXPECT_NE(err.find("protocol version 2"), std::string::npos) << err;
  // The right hello gets status 0 (ok) and rank 0 returns without error.
  std::tie(err, status) = rank_zero_meets(be_words({magic, 1, 1, 2}));
  EXPECT_EQ(err, "");
  EXPECT_EQ(status, 0);
}

TEST(TcpRendezvous, NobodyListeningTimesOutWithinTheTimeout) {
  const int port = free_port();
  const auto t0 = std::chrono::steady_clock::now();
  std::string err;
  try {
    tcp_broadcast("127.0.0.1", port, 1, 2, {}, milliseconds(300));
  } catch (const Error& e) {
    err = e.what();
  }
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_NE(err.find(str("at 127.0.0.1:", port,
                         " timed out after 300 ms: rank 1 of 2 never reached rank 0")),
            std::string::npos)
      << err;
  EXPECT_GE(took, milliseconds(300));
  EXPECT_LT(took, milliseconds(1500));
}

TEST(TcpRendezvous, RankZeroTimesOutNamingHowManyPeersArrived) {
  const int port = free_port();
  // A world of 3 where rank 2 never comes: rank 0 and rank 1 both time out.
  const auto out = run_ranks(2, [&](int r) {
    // Rank 1 waits longer, so that it hears rank 0's refusal rather than its own timeout.
    return tcp_broadcast("127.0.0.1", port, r, 3, {1}, milliseconds(r == 0 ? 400 : 3000));
  });
  EXPECT_NE(out[0].error.find(str("at 127.0.0.1:", port,
                                  " timed out after 400 ms: rank 0 heard from 1 of 2 peers")),
            std::string::npos)
      << out[0].error;
  EXPECT_NE(out[1].error.find("rank 0 heard from 1 of 2 peers"), std::string::npos) << out[1].error;
}

TEST(TcpRendezvous, BadArgumentsAreRefused) {
  EXPECT_THROW(tcp_broadcast("127.0.0.1", 5000, 2, 2, {}, milliseconds(100)), Error);
  EXPECT_THROW(tcp_broadcast("127.0.0.1", 0, 1, 2, {}, milliseconds(100)), Error);
  EXPECT_THROW(tcp_broadcast("127.0.0.1", 5000, 1, 2, {}, milliseconds(0)), Error);
}

}  // namespace
}  // namespace forge
