// `forge serve`'s counters and gauges, served at GET /metrics in the Prometheus text exposition
// format (version 0.0.4: "# HELP" and "# TYPE" lines, then `name{label="value"} number` samples).
// Thread-safe: HTTP handler threads count requests, the scheduler thread counts tokens.
//
// forge_tokens_per_second is the decode rate over a sliding window: the ids generated in the
// last kRateWindowS seconds divided by kRateWindowS (so it falls back to 0 when the server idles).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace forge::serve {

class Metrics {
 public:
  static constexpr double kRateWindowS = 10.0;
  using Clock = std::chrono::steady_clock;

  // One completion request answered with this HTTP status (200, 400, 503, ...).
  void count_request(int status);
  // A request admitted into a decode slot (its prompt prefilled).
  void count_prompt(int64_t tokens);
  // Ids generated (by a prefill's first sample or by decode steps), at time `now`.
  void count_generated(int64_t tokens, Clock::time_point now = Clock::now());
  // A streaming client hung up before its answer ended (its slot freed at the next step).
  void count_cancelled();
  // Time the scheduler thread spent admitting requests (prefill and first sample) and in decode
  // steps (enqueuing one, and handing out the ids of the one before: decode_loop.h).
  void add_prefill_time(double s);
  void add_step_time(double s);
  // The gauges: requests waiting for a slot, slots decoding.
  void set_queue_depth(int64_t n);
  void set_active_slots(int64_t n);

  // The exposition text; `slots` is the decode batch's size.
  std::string render(int slots, Clock::time_point now = Clock::now()) const;

 private:
  mutable std::mutex mu_;
  std::map<int, int64_t> requests_;  // by status
  int64_t prompt_tokens_ = 0, generated_tokens_ = 0, cancelled_ = 0;
  int64_t queue_depth_ = 0, active_slots_ = 0;
  double prefill_s_ = 0, step_s_ = 0;
  int64_t steps_ = 0;
  mutable std::deque<std::pair<Clock::time_point, int64_t>> recent_;  // generated ids in the window
};

}  // namespace forge::serve
