// `forge serve`'s continuous batching: one scheduler thread owns the engine's decode loop
// (generate/decode_loop.h) and runs it while there is work. HTTP handler threads submit a Job and
// wait on it for text pieces (a small thread-safe channel); between two decode steps the
// scheduler frees the slots of cancelled jobs (a client that hung up), admits waiting jobs into
// free slots (prefill), and steps every live slot once. A job that ends frees its slot at once.
//
// Admission is bounded: submit() refuses a job when `slots + max_queue` jobs are already in the
// server (decoding or waiting), so at most max_queue wait for a slot; the caller answers 503.
// Detokenization and stop strings (TextStream) run on the scheduler thread, per job, so a stop
// string ends the request in the step that completes it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "forge/generate/engine.h"
#include "forge/generate/text_stream.h"
#include "forge/serve/metrics.h"
#include "forge/tokenizer/tokenizer.h"

namespace forge::serve {

// How a job ended, once it has.
struct JobResult {
  std::string text;
  FinishReason reason = FinishReason::kLength;
  bool stop_string = false;  // a stop string ended it (reason kCaller)
  int64_t prompt_tokens = 0, completion_tokens = 0;
  std::string error;  // non-empty: it failed (the engine threw, or the server stopped)
};

// One request between a handler thread and the scheduler.
class Job {
 public:
  // The text decoder with `stop` strings is made here (forge::Error for a bad stop string).
  Job(GenRequest req, const tok::Tokenizer& tokenizer, std::vector<std::string> stop)
      : req_(std::move(req)), stream_(tokenizer, std::move(stop), /*skip_special=*/true) {}
  const GenRequest& request() const { return req_; }
  // Handler side: the next piece of text (waits for it), or nullopt once the job has ended
  // (then result() is final).
  std::optional<std::string> next();
  const JobResult& result() const { return result_; }
  // The client is gone: the scheduler ends the job at its next step boundary.
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

 private:
  friend class Scheduler;
  void push(std::string text);
  void finish(JobResult r);

  GenRequest req_;
  TextStream stream_;  // the scheduler thread's once submitted
  std::atomic<bool> cancelled_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> pieces_;
  bool done_ = false;
  JobResult result_;
};

struct SchedulerOptions {
  int slots = 8;      // decode batch (--max-batch)
  int capacity = 0;   // tokens per slot (--context); 0: the model's context
  int max_queue = 64;  // jobs waiting for a slot beyond the busy ones (--max-queue)
  bool pdl = true;    // CUDA
  bool pipeline = true;  // hand out a step's ids while the next step runs (generate/decode_loop.h)
};

class Scheduler {
 public:
  // Opens the engine's decode loop (slots × capacity of KV cache) and starts the thread.
  Scheduler(Engine& engine, Metrics& metrics, const SchedulerOptions& opt);
  ~Scheduler();  // stop()s
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  int slots() const { return slots_; }
  int context() const { return context_; }  // the most tokens (prompt + generated) of one request
  // Queues `job` for a slot; false (job untouched) when the server is full or stopping;
  // forge::Error when the engine has failed beyond repair.
  bool submit(const std::shared_ptr<Job>& job);
  // While held, nothing is admitted or stepped (jobs queue up, and are refused when full): for
  // tests that need a known queue.
  void hold(bool on);
  // Ends the thread; jobs not yet ended fail with "the server is stopping". Idempotent.
  void stop();

 private:
  void run();
  bool on_token(int tag, int32_t id);
  void on_done(int tag, GenResult&& r);
  void fail_all(const std::string& why);

  Engine& engine_;
  Metrics& metrics_;
  SchedulerOptions opt_;
  std::unique_ptr<DecodeSession> loop_;  // the scheduler thread's once started
  int slots_ = 0, context_ = 0;

  std::mutex mu_;  // guards queue_, in_server_, stopping_, held_
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  int64_t in_server_ = 0;  // jobs submitted and not yet ended
  bool stopping_ = false, held_ = false;
  std::string broken_;  // why the decode loop could not be reopened after a failure

  // The scheduler thread's own.
  std::unordered_map<int, std::shared_ptr<Job>> active_;
  int next_tag_ = 0;
  int64_t generated_ = 0;  // ids since the last count_generated
  std::thread thread_;
};

}  // namespace forge::serve
