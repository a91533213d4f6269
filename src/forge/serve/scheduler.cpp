#include "forge/serve/scheduler.h"

#include <chrono>

#include "forge/core/error.h"

namespace forge::serve {

std::optional<std::string> Job::next() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return !pieces_.empty() || done_; });
  if (pieces_.empty()) return std::nullopt;
  std::string s = std::move(pieces_.front());
  pieces_.pop_front();
  return s;
}

void Job::push(std::string text) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    pieces_.push_back(std::move(text));
  }
  cv_.notify_one();
}

void Job::finish(JobResult r) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    result_ = std::move(r);
    done_ = true;
  }
  cv_.notify_one();
}

Scheduler::Scheduler(Engine& engine, Metrics& metrics, const SchedulerOptions& opt)
    : engine_(engine), metrics_(metrics), opt_(opt) {
  if (opt.slots < 1 || opt.slots > 1024) throw Error(str("--max-batch: ", opt.slots, " (expected 1 to 1024)"));
  if (opt.max_queue < 0 || opt.max_queue > 1024)
    throw Error(str("--max-queue: ", opt.max_queue, " (expected 0 to 1024)"));
  if (opt.capacity < 0 || opt.capacity > engine.config().max_seq_len)
    throw Error(str("--context: ", opt.capacity, " outside [1, the model's context of ", engine.config().max_seq_len,
                    "]"));
  DecodeLoopOptions lo;
  lo.slots = opt.slots;
  lo.capacity = opt.capacity;
  lo.penalty = true;  // a request may ask for one (generation_config.json's repetition_penalty)
  lo.pipeline = opt.pipeline;
  loop_ = engine_.open_loop(
      lo, [this](int tag, int32_t id) { return on_token(tag, id); },
      [this](int tag, GenResult&& r) { on_done(tag, std::move(r)); }, opt.pdl);
  slots_ = loop_->slots();
  context_ = loop_->context();
  thread_ = std::thread([this] { run(); });
}

Scheduler::~Scheduler() { stop(); }

bool Scheduler::submit(const std::shared_ptr<Job>& job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_.empty()) throw Error(broken_);
    if (stopping_ || in_server_ >= slots_ + opt_.max_queue) return false;
    ++in_server_;
    queue_.push_back(job);
    metrics_.set_queue_depth(static_cast<int64_t>(queue_.size()));
  }
  cv_.notify_one();
  return true;
}

void Scheduler::hold(bool on) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    held_ = on;
  }
  cv_.notify_one();
}

void Scheduler::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
  fail_all("the server is stopping");
  loop_.reset();
}

bool Scheduler::on_token(int tag, int32_t id) {
  Job& job = *active_.at(tag);
  ++generated_;
  std::string text = job.stream_.push(id);
  if (!text.empty()) job.push(std::move(text));
  return !job.stream_.stopped() && !job.cancelled();
}

void Scheduler::on_done(int tag, GenResult&& r) {
  auto it = active_.find(tag);
  if (it == active_.end()) return;  // failed already (a prefill error: run())
  std::shared_ptr<Job> job = std::move(it->second);
  active_.erase(it);
  std::string rest = job->stream_.finish();
  if (!rest.empty()) job->push(std::move(rest));
  JobResult res;
  res.text = job->stream_.text();
  res.reason = r.reason;
  res.stop_string = job->stream_.stopped();
  res.prompt_tokens = static_cast<int64_t>(job->req_.prompt.size());
  res.completion_tokens = static_cast<int64_t>(r.ids.size());
  // The counters include the job before its client can see its end (and ask /metrics).
  metrics_.count_generated(generated_);
  generated_ = 0;
  metrics_.set_active_slots(loop_->live());
  {
    std::lock_guard<std::mutex> lock(mu_);
    --in_server_;
  }
  job->finish(std::move(res));
}

void Scheduler::fail_all(const std::string& why) {
  std::vector<std::shared_ptr<Job>> jobs;
  for (auto& a : active_) jobs.push_back(std::move(a.second));
  active_.clear();
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs.insert(jobs.end(), queue_.begin(), queue_.end());
    queue_.clear();
    in_server_ -= static_cast<int64_t>(jobs.size());
  }
  JobResult res;
  res.error = why;
  for (const auto& j : jobs) j->finish(res);
}

void Scheduler::run() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || (!held_ && (!queue_.empty() || loop_->live() > 0)); });
      if (stopping_) return;
    }
    // The step boundary: slots of clients gone are freed first, then waiting jobs fill free slots.
    std::vector<int> gone;
    for (const auto& a : active_)
      if (a.second->cancelled()) gone.push_back(a.first);
    for (int tag : gone) loop_->cancel(tag);
    std::vector<std::shared_ptr<Job>> admit;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (int free = slots_ - loop_->live(); free > 0 && !queue_.empty(); --free) {
        admit.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      metrics_.set_queue_depth(static_cast<int64_t>(queue_.size()));
    }
    // The waiting jobs are prefilled together (DecodeLoop::admit_batch); a job that cannot be
    // admitted fails alone.
    auto fail = [this](int tag, const std::string& why) {
      const auto it = active_.find(tag);
      if (it == active_.end()) return;  // it had ended: the error came after on_done
      const std::shared_ptr<Job> job = it->second;
      active_.erase(it);
      {
        std::lock_guard<std::mutex> lock(mu_);
        --in_server_;
      }
      JobResult res;
      res.error = why;
      job->finish(std::move(res));
    };
    std::vector<const GenRequest*> qs;
    std::vector<int> tags;
    for (const auto& job : admit) {
      const int tag = next_tag_;
      next_tag_ = (next_tag_ + 1) & 0x3fffffff;
      active_[tag] = job;
      if (job->cancelled()) {
        fail(tag, "the client hung up while its request waited");
        continue;
      }
      metrics_.count_prompt(static_cast<int64_t>(job->req_.prompt.size()));
      qs.push_back(&job->req_);
      tags.push_back(tag);
    }
    if (!qs.empty()) {
      metrics_.set_active_slots(loop_->live() + static_cast<int64_t>(qs.size()));
      const auto t0 = std::chrono::steady_clock::now();
      try {
        const std::vector<std::string> why = loop_->admit_batch(qs, tags);
        for (size_t i = 0; i < why.size(); ++i)
          if (!why[i].empty()) fail(tags[i], why[i]);
      } catch (const std::exception& e) {
        for (int tag : tags) {  // those admitted before the failure leave the loop too
          fail(tag, e.what());
          loop_->cancel(tag);
        }
      }
      metrics_.add_prefill_time(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    try {
      const auto t0 = std::chrono::steady_clock::now();
      if (loop_->live() > 0) {
        loop_->step();
        metrics_.add_step_time(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
    } catch (const std::exception& e) {
      // The batch's state is unknown: every live request fails, and the loop starts afresh.
      std::vector<std::shared_ptr<Job>> failed;
      for (auto& a : active_) failed.push_back(std::move(a.second));
      active_.clear();
      std::lock_guard<std::mutex> lock(mu_);
      in_server_ -= static_cast<int64_t>(failed.size());
      JobResult res;
      res.error = str("generation failed: ", e.what());
      for (const auto& j : failed) j->finish(res);
      try {
        loop_.reset();
        DecodeLoopOptions lo;
        lo.slots = slots_;
        lo.capacity = opt_.capacity;
        lo.pipeline = opt_.pipeline;
        loop_ = engine_.open_loop(
            lo, [this](int tag, int32_t id) { return on_token(tag, id); },
            [this](int tag, GenResult&& r) { on_done(tag, std::move(r)); }, opt_.pdl);
      } catch (const std::exception& again) {
        broken_ = str("the engine cannot generate any more: ", again.what());
        stopping_ = true;  // the loop is gone: queued jobs fail below
      }
    }
    metrics_.count_generated(generated_);
    generated_ = 0;
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && !broken_.empty()) break;
    metrics_.set_active_slots(loop_->live());
  }
  fail_all(broken_);
}

}  // namespace forge::serve
