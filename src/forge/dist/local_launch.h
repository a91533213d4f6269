// `forge train --gpus N`: start N ranks of a command on this machine and supervise them, as
// torchrun does. Each rank is a child process (fork + exec) in a process group of its own, with
// the torchrun environment that dist/bootstrap.h reads: RANK = LOCAL_RANK = r, WORLD_SIZE =
// LOCAL_WORLD_SIZE = N, MASTER_ADDR = 127.0.0.1, MASTER_PORT = a port that was free a moment
// before (the rendezvous of dist/tcp_comm.h).
//
// Supervision:
//   - SIGINT / SIGTERM to the supervisor are forwarded, once, to every rank still running (the
//     ranks' own groups keep a terminal's Ctrl-C from reaching them twice: forge train's second
//     signal would kill instead of checkpointing);
//   - a rank gets SIGTERM when the supervisor itself dies (PR_SET_PDEATHSIG), even by SIGKILL;
//   - the first rank that ends with a non-zero status or by a signal is the failure: the others
//     get SIGTERM, and SIGKILL after `grace` if they still run;
//   - when every rank has ended: status 0 and no message when all ended with 0; otherwise the
//     failed rank's status (128 + the signal's number for a signal) and a message naming the
//     rank: "rank 1 of 4 exited with status 3; the other ranks were stopped".
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace forge {

struct LocalLaunch {
  std::vector<std::string> argv;  // what every rank runs: argv[0] is the program's path
  int ranks = 1;
  std::chrono::milliseconds grace{10000};  // SIGTERM → SIGKILL for the others after a failure
};

struct LaunchOutcome {
  int status = 0;       // 0, the failed rank's exit status, or 128 + its signal
  int failed_rank = -1;  // -1 when every rank ended with 0
  std::string message;  // empty when status is 0
};

// Throws forge::Error when a rank cannot be started (fork fails) or ranks < 1. A rank whose exec
// fails prints why and ends with status 127 (a failure like any other).
LaunchOutcome run_local_ranks(const LocalLaunch& launch);

}  // namespace forge
