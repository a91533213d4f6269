#include "forge/serve/metrics.h"

#include <sstream>

namespace forge::serve {

void Metrics::count_request(int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++requests_[status];
}

void Metrics::count_prompt(int64_t tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  prompt_tokens_ += tokens;
}

void Metrics::count_generated(int64_t tokens, Clock::time_point now) {
  if (tokens <= 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  generated_tokens_ += tokens;
  recent_.emplace_back(now, tokens);
  const auto window = std::chrono::duration<double>(kRateWindowS);
  while (!recent_.empty() && now - recent_.front().first > window) recent_.pop_front();
}

void Metrics::count_cancelled() {
  std::lock_guard<std::mutex> lock(mu_);
  ++cancelled_;
}

void Metrics::add_prefill_time(double s) {
  std::lock_guard<std::mutex> lock(mu_);
  prefill_s_ += s;
}

void Metrics::add_step_time(double s) {
  std::lock_guard<std::mutex> lock(mu_);
  step_s_ += s;
  ++steps_;
}

void Metrics::set_queue_depth(int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  queue_depth_ = n;
}

void Metrics::set_active_slots(int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  active_slots_ = n;
}

std::string Metrics::render(int slots, Clock::time_point now) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto window = std::chrono::duration<double>(kRateWindowS);
  while (!recent_.empty() && now - recent_.front().first > window) recent_.pop_front();
  int64_t in_window = 0;
  for (const auto& r : recent_) in_window += r.second;
  std::ostringstream o;
  auto head = [&o](const char* name, const char* type, const char* help) {
    o << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
  };
  head("forge_requests_total", "counter",
       "Requests to /v1/completions and /v1/chat/completions, by the HTTP status answered.");
  for (const auto& r : requests_) o << "forge_requests_total{status=\"" << r.first << "\"} " << r.second << '\n';
  head("forge_requests_cancelled_total", "counter",
       "Streamed requests whose client hung up before the end (their slot freed at the next step).");
  o << "forge_requests_cancelled_total " << cancelled_ << '\n';
  head("forge_prompt_tokens_total", "counter", "Prompt tokens prefilled.");
  o << "forge_prompt_tokens_total " << prompt_tokens_ << '\n';
  head("forge_generated_tokens_total", "counter", "Tokens generated.");
  o << "forge_generated_tokens_total " << generated_tokens_ << '\n';
  head("forge_prefill_seconds_total", "counter", "Seconds spent admitting requests (prefill and first token).");
  o << "forge_prefill_seconds_total " << prefill_s_ << '\n';
  head("forge_decode_step_seconds_total", "counter",
       "Seconds spent in decode steps (enqueuing one, handing out the ids of the one before).");
  o << "forge_decode_step_seconds_total " << step_s_ << '\n';
  head("forge_decode_steps_total", "counter", "Decode steps.");
  o << "forge_decode_steps_total " << steps_ << '\n';
  head("forge_queue_depth", "gauge", "Requests waiting for a decode slot.");
  o << "forge_queue_depth " << queue_depth_ << '\n';
  head("forge_active_slots", "gauge", "Decode slots holding a request.");
  o << "forge_active_slots " << active_slots_ << '\n';
  head("forge_slots", "gauge", "Decode slots (--max-batch).");
  o << "forge_slots " << slots << '\n';
  head("forge_tokens_per_second", "gauge", "Tokens generated in the last 10 seconds, divided by 10.");
  o << "forge_tokens_per_second " << static_cast<double>(in_window) / kRateWindowS << '\n';
  return o.str();
}

}  // namespace forge::serve
