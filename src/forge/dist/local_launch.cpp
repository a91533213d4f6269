// run_local_ranks (dist/local_launch.h).
#include "forge/dist/local_launch.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>

#include "forge/core/error.h"

namespace forge {

namespace {

volatile std::sig_atomic_t g_forward = 0;  // a signal to forward, 0 when none

void on_signal(int sig) {
  g_forward = sig;
}

// The kernel's pick for port 0 on the loopback interface, released at once.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw Error(str("--gpus: socket failed: ", std::strerror(errno)));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok) throw Error(str("--gpus: no free TCP port on 127.0.0.1: ", std::strerror(err)));
  return ntohs(a.sin_port);
}

// The process's environment with rank `rank`'s torchrun variables in place of any it had.
std::vector<std::string> rank_env(const LocalLaunch& l, int rank, int port) {
  const std::string r = std::to_string(rank), n = std::to_string(l.ranks);
  const std::pair<const char*, std::string> vars[] = {
      {"RANK", r},        {"LOCAL_RANK", r},         {"WORLD_SIZE", n},
      {"LOCAL_WORLD_SIZE", n}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(port)}};
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    bool ours = false;
    for (const auto& v : vars) ours = ours || kv.rfind(std::string(v.first) + "=", 0) == 0;
    if (!ours) env.push_back(kv);
  }
  for (const auto& v : vars) env.push_back(std::string(v.first) + "=" + v.second);
  return env;
}

// In the child (only async-signal-safe calls: the parent may have threads): its own process
// group, SIGTERM when the supervisor dies (a SIGKILLed supervisor leaves no rank behind), then
// exec. Never returns.
[[noreturn]] void exec_rank(char* const* argv, char* const* envp, pid_t supervisor) {
  ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (::getppid() != supervisor) ::_exit(128 + SIGTERM);  // it died before the prctl
  ::execve(argv[0], argv, envp);
  static const char msg[] = "forge: a rank could not be started: exec failed\n";
  [[maybe_unused]] const ssize_t n = ::write(2, msg, sizeof msg - 1);
  ::_exit(127);
}

std::string signal_name(int sig) {
  const char* d = ::sigdescr_np(sig);
  return d ? str(" (", d, ")") : "";
}

}  // namespace

LaunchOutcome run_local_ranks(const LocalLaunch& l) {
  if (l.ranks < 1) throw Error(str("--gpus ", l.ranks, ": expected 1 or more"));
  FORGE_CHECK(!l.argv.empty(), "run_local_ranks: no command");
  const int port = free_port();
  // Handlers before the first fork, so that no signal in between is lost; the children's exec
  // resets handled signals to their defaults.
  struct sigaction sa {}, old_int{}, old_term{};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  g_forward = 0;
  std::vector<pid_t> pids(l.ranks, -1);
  std::vector<bool> running(l.ranks, false);
  std::fflush(nullptr);  // the children must not flush the parent's buffered output again
  const pid_t supervisor = ::getpid();
  std::vector<char*> argv;
  for (const std::string& a : l.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (int r = 0; r < l.ranks; ++r) {
    const std::vector<std::string> env = rank_env(l, r, port);
    std::vector<char*> envp;
    for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    const pid_t pid = ::fork();
    if (pid == 0) exec_rank(argv.data(), envp.data(), supervisor);
    if (pid < 0) {
      const int err = errno;
      for (int k = 0; k < r; ++k) ::kill(pids[k], SIGKILL);
      for (int k = 0; k < r; ++k) ::waitpid(pids[k], nullptr, 0);
      sigaction(SIGINT, &old_int, nullptr);
      sigaction(SIGTERM, &old_term, nullptr);
      throw Error(str("--gpus: cannot start rank ", r, ": fork failed: ", std::strerror(err)));
    }
    ::setpgid(pid, pid);  // also in the child: whichever runs first
    pids[r] = pid;
    running[r] = true;
  }
  LaunchOutcome out;
  int left = l.ranks;
  std::chrono::steady_clock::time_point kill_at{};
  bool stopping = false, killed = false;
  auto signal_running = [&](int sig) {
    for (int r = 0; r < l.ranks; ++r)
      if (running[r]) ::kill(pids[r], sig);
  };
  while (left > 0) {
    if (const int sig = g_forward) {
      g_forward = 0;
      signal_running(sig);
    }
    int st = 0;
    const pid_t pid = ::waitpid(-1, &st, WNOHANG);
    if (pid > 0) {
      int r = 0;
      while (r < l.ranks && pids[r] != pid) ++r;
      if (r == l.ranks) continue;  // not one of ours
      running[r] = false;
      --left;
      const bool bad = !WIFEXITED(st) || WEXITSTATUS(st) != 0;
      if (bad && out.failed_rank < 0) {
        out.failed_rank = r;
        if (WIFEXITED(st)) {
          out.status = WEXITSTATUS(st);
          out.message = str("rank ", r, " of ", l.ranks, " exited with status ", out.status);
        } else {
          const int sig = WTERMSIG(st);
          out.status = 128 + sig;
          out.message = str("rank ", r, " of ", l.ranks, " was killed by signal ", sig, signal_name(sig));
        }
        if (left > 0) {
          out.message += "; the other ranks were stopped";
          signal_running(SIGTERM);
          stopping = true;
          kill_at = std::chrono::steady_clock::now() + l.grace;
        }
      }
      continue;
    }
    if (pid < 0 && errno != EINTR && errno != ECHILD) break;
    if (stopping && !killed && std::chrono::steady_clock::now() >= kill_at) {
      signal_running(SIGKILL);
      killed = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  return out;
}

}  // namespace forge
