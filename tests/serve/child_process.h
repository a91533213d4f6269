// A child process for the serve tests that start programs (forge serve, chromium) and must
// never leave one behind: spawn() starts argv in a new session (its own process group, so
// that the group — a browser and all its helper processes — can be killed at once), stdout and
// stderr to files; wait_for() waits up to a timeout and kills the group when it is exceeded;
// kill_group() ends whatever of the group is left.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace forge::testing {

// Starts argv[0] (found in PATH) with these arguments; returns its pid (also its process group
// id), or -1 when fork fails. A program that cannot be executed exits with 127.
inline pid_t spawn(const std::vector<std::string>& argv, const std::string& out_path,
                   const std::string& err_path) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  ::setsid();
  const int in = ::open("/dev/null", O_RDONLY);
  const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (in < 0 || out < 0 || err < 0) ::_exit(126);
  ::dup2(in, 0);
  ::dup2(out, 1);
  ::dup2(err, 2);
  ::execvp(args[0], args.data());
  ::_exit(127);
}

// SIGKILL to the child's process group (ignored when it is gone).
inline void kill_group(pid_t pid) {
  if (pid > 0) ::kill(-pid, SIGKILL);
}

// Waits for the child for up to timeout_s: its exit code, -1 when a signal ended it, or -2
// when the time ran out (the group is then killed and the child reaped). Either way, what is
// left of its process group afterwards is killed.
inline int wait_for(pid_t pid, double timeout_s) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  int status = 0;
  for (;;) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0) return -1;
    if (std::chrono::steady_clock::now() > end) {
      kill_group(pid);
      ::waitpid(pid, &status, 0);
      return -2;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill_group(pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace forge::testing
