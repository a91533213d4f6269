// A load client for `forge serve` (the load test and `forge bench serve`): `clients` threads
// issue `requests` requests in total against host:port, each thread one request at a time on
// its own connection. Requests alternate between a whole answer and a streamed one ("stream":
// true with stream_options.include_usage, the server-sent events parsed as they arrive), and
// request i uses case (i / 2) % cases.size(), so a run mixes completions and chat, streamed
// and not, as the cases say. Every answer is checked: HTTP 200, a well-formed body (for a stream:
// chunks, then a finish_reason, the usage chunk and [DONE]), and, when the case has one, text equal
// to its expected text. Measured: the wall time of the run, completion tokens (the usage counts)
// per second over it, per-request latency (send → last byte) and, for streams, time to the first
// text chunk.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace forge::serve {

struct LoadCase {
  bool chat = false;   // /v1/chat/completions (one user message) or /v1/completions
  std::string prompt;  // the prompt, or the user message's content
  std::optional<std::string> expected;  // the answer's text must equal this (greedy runs)
};

struct LoadOptions {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;     // sent as a Bearer token when not empty
  int clients = 1;         // concurrent connections
  int requests = 1;        // in total
  int max_tokens = 16;     // per request
  double temperature = 0;  // 0: greedy
  int timeout_s = 300;     // per request (connect, read)
  int max_failures = 10;   // failures described in LoadResult::failures (all are counted)
};

struct LoadResult {
  int64_t ok = 0, failed = 0;  // answers that passed / failed every check
  int64_t mismatched = 0;      // of the failed: 200 and well-formed, but not the expected text
  std::vector<std::string> failures;  // the first max_failures, one line each
  int64_t completion_tokens = 0, prompt_tokens = 0;
  double wall_s = 0;
  double tokens_per_s = 0;  // completion_tokens / wall_s
  double latency_p50_ms = 0, latency_p99_ms = 0;
  double ttft_p50_ms = 0, ttft_p99_ms = 0;  // streamed requests only (0 without any)
};

// Runs the load; forge::Error for options out of range or no cases. Failed requests are
// counted and described, not thrown.
LoadResult run_load(const LoadOptions& opt, const std::vector<LoadCase>& cases);

// The q-quantile (0..1) of the values, nearest rank; 0 for none.
double quantile(std::vector<double> values, double q);

}  // namespace forge::serve
