// The decode loop of batched generation, one step at a time, that requests join and leave while it
// runs: DecodeLoop<Backend> owns S slots of the model's decode cache (plan_decode(S, capacity),
// fixed for its lifetime). admit() prefills a request into a free slot and samples its first id;
// step() advances every slot one token (decode_step() plus the sampler, captured once as a step
// graph — a CUDA graph on the GPU — and replayed) and reads the S chosen ids back; a request that
// ends frees its slot at once, cancel() frees one at the caller's step boundary. generate_batch
// (generator.h) drives it over a fixed request list; `forge serve` (serve/scheduler.h) over
// requests arriving from HTTP clients.
//
// A step decodes rows 0 .. n−1 only (Model::set_decode_rows), n the smallest power of two (at
// most S) that covers the highest live slot; admit() fills the lowest free slot, so n follows the
// load (one request alone steps one row, not S: a step's time grows with its rows). Each n has
// its own step graph, captured the first time it is needed; the slots above n are not touched.
// A slot with no request below n still runs through the step: its position is
// clamped to decode_context() − 1 by decode_step(), it writes only its own cache rows and its
// own row of tokens, and a later prefill of that slot overwrites both, so it changes nothing.
// It reads only cache rows it wrote itself (from position 0 up, or a former request's), so its
// logits stay finite and its sampled id (greedy settings until its first request) a valid one.
//
// Pipelined steps (DecodeLoopOptions::pipeline, on by default): step() enqueues its step and
// the copy of its ids to the host (Backend::readback_start), and only then waits for the ids of
// the step before it and hands them out. The host's work on a step's ids (the callbacks: text,
// stop strings, a server's writes) then runs while the next step runs on the GPU, and no host
// wait sits between two steps. The cost: a request that ends is decoded one step more than it
// needs (that id is dropped: each step remembers which request held each slot when it was
// enqueued, and ids of a slot whose request changed since are not handed out), and a loop's
// last step produces nothing. The device computes the same steps in the same order either way
// (the step reads its input ids from the device), except that a row count can be one step late
// in shrinking (on the GPU a row's rounding can depend on the row count: docs/serving.md).
//
// A request ends after max_new_tokens ids, after emitting one of its stop ids (which is
// returned, as Hugging Face's generate returns the EOS), when on_token asks it to (stop strings
// are the caller's: they need the text), when cancel()ed, or when its sequence fills the context
// (prompt + generated = context()). Its GenResult goes to on_done.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "forge/core/error.h"
#include "forge/model/packed_prompts.h"
#include "forge/model/transformer.h"
#include "forge/ops/sample.h"

namespace forge {

struct GenRequest {
  std::vector<int32_t> prompt;  // >= 1 ids, each in [0, vocab)
  int max_new_tokens = 64;
  SamplerSettings sampling;
  std::vector<int32_t> stop_ids;  // end-of-sequence ids (generation_config.json's eos_token_id)
};

enum class FinishReason { kLength, kStop, kContext, kCaller };
inline const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kLength: return "length";
    case FinishReason::kStop: return "stop";
    case FinishReason::kContext: return "context";
    case FinishReason::kCaller: return "stop_string";
  }
  return "?";
}

struct GenResult {
  std::vector<int32_t> ids;  // generated ids only
  FinishReason reason = FinishReason::kLength;
};

struct GenStats {
  double first_token_s = 0;  // from the start to the first request's first id on the host
  double prefill_s = 0;      // all prefills (with their first sample)
  double decode_s = 0;       // all decode steps
  int64_t steps = 0;         // decode steps
  int64_t decode_tokens = 0;  // ids produced by decode steps for live requests
  double capture_s = 0;      // steps that captured a step graph (eager run + capture), within decode_s
};

// on_token(request tag, id) after each id; returning false ends that request (kCaller).
using TokenCallback = std::function<bool(int, int32_t)>;
// on_done(request tag, result) once per admitted request, when it ends.
using DoneCallback = std::function<void(int, GenResult&&)>;

struct DecodeLoopOptions {
  int slots = 1;        // requests decoded together
  int capacity = 1;     // cache rows per slot (<= max_seq_len)
  bool penalty = true;  // keep the repetition penalty's memory (S × vocab flags); false: no request may use it
  bool graph = true;    // capture the step once and replay it (CUDA graphs on the GPU)
  bool pipeline = true;  // hand out a step's ids while the next step runs (above)
};

// The loop behind one interface, whatever the backend (Engine::open_loop gives one).
class DecodeSession {
 public:
  virtual ~DecodeSession() = default;
  virtual int slots() const = 0;
  virtual int context() const = 0;  // the most tokens (prompt + generated) one request can hold
  virtual int live() const = 0;     // slots holding a request
  virtual bool has_free_slot() const = 0;
  // Prefills `q` into a free slot (forge::Error when there is none or the request is invalid) and
  // samples its first id; the request may end at once (on_done is called before this returns).
  virtual void admit(const GenRequest& q, int tag) = 0;
  // Admits several requests at once, their prompts prefilled together (packed into rows of at
  // most max_seq_len tokens: Model::prefill_packed, one forward's launches for many prompts).
  // Returns per request "" when admitted (it may have ended at once) or why it was not (invalid,
  // or no free slot left for it); forge::Error when the prefill itself fails.
  virtual std::vector<std::string> admit_batch(const std::vector<const GenRequest*>& qs,
                                               const std::vector<int>& tags) = 0;
  // One decode step when any slot is live: every live request gets one id; those that end free
  // their slot.
  virtual void step() = 0;
  // Ends the live request `tag` now (kCaller, the ids so far); false when it is not live.
  virtual bool cancel(int tag) = 0;
};

template <class Backend>
class DecodeLoop final : public DecodeSession {
 public:
  DecodeLoop(Model<Backend>& model, const DecodeLoopOptions& opt, TokenCallback on_token, DoneCallback on_done,
             GenStats* stats = nullptr)
      : model_(model), be_(model.backend()), opt_(opt), on_token_(std::move(on_token)), on_done_(std::move(on_done)),
        stats_(stats), t0_(Clock::now()) {
    const ModelConfig& cfg = model.config();
    V_ = cfg.vocab_size;
    Vp_ = cfg.padded_vocab();
    S_ = std::max(1, opt.slots);
    model.plan_decode(S_, opt.capacity);
    context_ = model.decode_context();
    settings_ = be_.template buf<SamplerSettings>(S_);
    seen_ = be_.template buf<uint8_t>(opt.penalty ? static_cast<size_t>(S_) * V_ : 0);
    // A packed prefill's tokens, positions and segment ids, one after another.
    prompt_ids_ = be_.template buf<int32_t>(3 * static_cast<size_t>(cfg.max_seq_len));
    seen_p_ = opt.penalty ? seen_.data() : nullptr;
    // A slot that never held a request still samples each step: greedy on its own finite logits
    // (device memory starts as garbage, and a garbage top_k or temperature is no setting).
    settings_host_.assign(S_, SamplerSettings{});
    be_.upload(settings_.data(), settings_host_.data(), S_);
    if (seen_p_) {
      const std::vector<uint8_t> none(static_cast<size_t>(S_) * V_, 0);
      be_.upload(seen_p_, none.data(), none.size());
    }
    slots_.resize(S_);
    int g = 1;
    while ((1 << (g - 1)) < S_) ++g;
    graphs_.resize(g);
  }
  ~DecodeLoop() override { be_.synchronize(); }

  int slots() const override { return S_; }
  int context() const override { return context_; }
  int live() const override { return live_; }
  bool has_free_slot() const override { return live_ < S_; }
  // Rows the last step decoded (0 before the first).
  int rows() const { return rows_; }

  // Why `q` cannot run here ("" when it can): empty prompt, ids outside the vocabulary, negative
  // max_new_tokens, a prompt longer than the context, a penalty without its memory.
  std::string invalid(const GenRequest& q) const {
    if (q.prompt.empty()) return "the prompt is empty";
    for (int32_t id : q.prompt)
      if (id < 0 || id >= V_) return str("token id ", id, " outside the vocabulary [0, ", V_, ")");
    if (q.max_new_tokens < 0) return str("max_new_tokens ", q.max_new_tokens, " < 0");
    if (static_cast<int64_t>(q.prompt.size()) > context_)
      return str("a prompt of ", q.prompt.size(), " tokens does not fit the context of ", context_);
    if (!seen_p_ && q.sampling.repetition_penalty != 1.0f)
      return "a repetition penalty in a loop opened without one";
    return "";
  }

  void admit(const GenRequest& q, int tag) override {
    const std::vector<std::string> why = admit_batch({&q}, {tag});
    if (!why[0].empty()) throw Error(why[0]);
  }

  std::vector<std::string> admit_batch(const std::vector<const GenRequest*>& qs,
                                       const std::vector<int>& tags) override {
    FORGE_CHECK(qs.size() == tags.size(), "admit_batch: ", qs.size(), " requests, ", tags.size(), " tags");
    std::vector<std::string> why(qs.size());
    std::vector<std::pair<size_t, int>> take;  // (request, slot)
    std::vector<bool> taken(S_, false);
    int s = 0;
    for (size_t i = 0; i < qs.size(); ++i) {
      why[i] = invalid(*qs[i]);
      if (!why[i].empty()) continue;
      if (qs[i]->max_new_tokens == 0) {  // ends before it needs a slot
        if (on_done_) on_done_(tags[i], GenResult{});
        continue;
      }
      while (s < S_ && (slots_[s].live || taken[s])) ++s;
      if (s == S_) {
        why[i] = str("decode loop: all ", S_, " slots are busy");
        continue;
      }
      taken[s] = true;
      take.emplace_back(i, s);
    }
    const auto tp = Clock::now();
    const int64_t row = model_.config().max_seq_len;
    size_t first = 0;
    int64_t tokens = 0;
    for (size_t j = 0; j <= take.size(); ++j) {  // packs of consecutive requests, <= row tokens each
      const int64_t len = j < take.size() ? static_cast<int64_t>(qs[take[j].first]->prompt.size()) : 0;
      if (j > first && (j == take.size() || tokens + len > row)) {
        prefill_pack(qs, tags, take, first, j);
        first = j;
        tokens = 0;
      }
      tokens += len;
    }
    if (stats_ && !take.empty()) stats_->prefill_s += since(tp);
    return why;
  }

  void step() override {
    if (live_ == 0) {
      inflight_[prev_].active = false;  // its requests have all ended: nothing to hand out
      return;
    }
    const auto ts = Clock::now();
    int hi = S_;
    while (!slots_[hi - 1].live) --hi;
    int n = 1, g = 0;  // rows, and their graph: graphs_[log2(n)]
    while (n < hi) n *= 2, ++g;
    n = std::min(n, S_);
    rows_ = n;
    if (!opt_.graph) {
      run_step(n);
    } else if (!graphs_[g]) {
      run_step(n);  // eagerly once: every one-time setup happens before the capture (cuda/graph.h)
      graphs_[g] = std::make_unique<typename Backend::StepGraph>();
      be_.capture(*graphs_[g], [this, n] { run_step(n); });
      if (stats_) stats_->capture_s += since(ts);
    } else {
      model_.set_decode_rows(n);
      be_.launch(*graphs_[g]);
    }
    // This step's ids go to the host behind it; the holders of its rows are remembered.
    const int cur = prev_ ^ 1;
    Inflight& now = inflight_[cur];
    be_.readback_start(now.ids, model_.decode_tokens(), n);
    now.rows = n;
    now.holder.resize(n);
    for (int s = 0; s < n; ++s) now.holder[s] = slots_[s].live ? slots_[s].request : 0;
    now.active = true;
    if (!opt_.pipeline) hand_out(now);
    if (inflight_[prev_].active) hand_out(inflight_[prev_]);
    prev_ = cur;
    if (stats_) {
      stats_->decode_s += since(ts);
      ++stats_->steps;
    }
  }

  bool cancel(int tag) override {
    for (int s = 0; s < S_; ++s)
      if (slots_[s].live && slots_[s].tag == tag) {
        finish(s, FinishReason::kCaller);
        return true;
      }
    return false;
  }

 private:
  using Clock = std::chrono::steady_clock;
  struct Slot {
    bool live = false;
    uint64_t request = 0;  // which admission holds the slot (1, 2, …): tells a step's ids apart
    int tag = -1;
    int max_new_tokens = 0;
    std::vector<int32_t> stop_ids;
    int length = 0;  // sequence length: prompt + generated
    GenResult res;
  };
  static double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

  // Prefills requests take[first, last) (their slots free and reserved) in one packed forward,
  // samples each one's first id and hands it out.
  void prefill_pack(const std::vector<const GenRequest*>& qs, const std::vector<int>& tags,
                    const std::vector<std::pair<size_t, int>>& take, size_t first, size_t last) {
    const int k = static_cast<int>(last - first);
    std::vector<PrefillSeg> segs(k);
    std::vector<int32_t> host;  // tokens, then (k > 1) positions and segment ids
    for (int i = 0; i < k; ++i) {
      const GenRequest& q = *qs[take[first + i].first];
      const int s = take[first + i].second;
      segs[i] = {s, static_cast<int>(q.prompt.size())};
      host.insert(host.end(), q.prompt.begin(), q.prompt.end());
      settings_host_[s] = q.sampling;
      if (seen_p_) {
        std::vector<uint8_t> seen(V_, 0);
        for (int32_t id : q.prompt) seen[id] = 1;
        be_.upload(seen_p_ + static_cast<size_t>(s) * V_, seen.data(), V_);
      }
    }
    const size_t T = host.size();
    if (k > 1) {
      const std::vector<int32_t> layout = packed_prompt_layout(segs.data(), k);
      host.insert(host.end(), layout.begin(), layout.end());
    }
    be_.upload(prompt_ids_.data(), host.data(), host.size());
    be_.upload(settings_.data(), settings_host_.data(), S_);
    const TokenLayout layout = k > 1 ? TokenLayout{prompt_ids_.data() + T, prompt_ids_.data() + 2 * T} : TokenLayout{};
    model_.prefill_packed(segs.data(), k, prompt_ids_.data(), layout);
    for (const PrefillSeg& sg : segs)
      be_.sample(model_.decode_tokens() + sg.slot, be_.at(model_.decode_logits(), static_cast<int64_t>(sg.slot) * Vp_),
                 settings_.data() + sg.slot, seen_p_ ? seen_p_ + static_cast<size_t>(sg.slot) * V_ : nullptr,
                 model_.decode_positions() + sg.slot, 1, V_, Vp_);
    std::vector<int32_t> ids(S_);
    be_.download(ids.data(), model_.decode_tokens(), S_);
    for (int i = 0; i < k; ++i) {
      const GenRequest& q = *qs[take[first + i].first];
      const int s = segs[i].slot;
      Slot& sl = slots_[s];
      sl.live = true;
      sl.request = ++admitted_;
      sl.tag = tags[take[first + i].first];
      sl.max_new_tokens = q.max_new_tokens;
      sl.stop_ids = q.stop_ids;
      sl.length = segs[i].len;
      sl.res = GenResult{};
      ++live_;
    }
    for (int i = 0; i < k; ++i) accept(segs[i].slot, ids[segs[i].slot]);
  }

  // One enqueued step and the requests that held its rows then (0: none).
  struct Inflight {
    typename Backend::Readback ids;
    int rows = 0;
    std::vector<uint64_t> holder;
    bool active = false;
  };

  // Waits for step `f`'s ids and gives each to the request that held its row, if it still holds it.
  void hand_out(Inflight& f) {
    f.active = false;
    const int32_t* ids = be_.readback_wait(f.ids);
    for (int s = 0; s < f.rows; ++s) {
      if (f.holder[s] == 0 || !slots_[s].live || slots_[s].request != f.holder[s]) continue;
      if (stats_) ++stats_->decode_tokens;
      accept(s, ids[s]);
    }
  }

  void run_step(int n) {
    model_.set_decode_rows(n);
    model_.decode_step();
    be_.sample(model_.decode_tokens(), model_.decode_logits(), settings_.data(), seen_p_, model_.decode_positions(),
               n, V_, Vp_);
  }

  void finish(int s, FinishReason reason) {
    Slot& sl = slots_[s];
    sl.res.reason = reason;
    sl.live = false;
    --live_;
    if (on_done_) on_done_(sl.tag, std::move(sl.res));
  }

  // One id for live slot s: record it, and end the request when it is over.
  void accept(int s, int32_t id) {
    Slot& sl = slots_[s];
    sl.res.ids.push_back(id);
    ++sl.length;
    if (!first_seen_) {
      first_seen_ = true;
      if (stats_) stats_->first_token_s = since(t0_);
    }
    const bool stop = std::find(sl.stop_ids.begin(), sl.stop_ids.end(), id) != sl.stop_ids.end();
    const bool caller_go = !on_token_ || on_token_(sl.tag, id);
    if (stop) return finish(s, FinishReason::kStop);
    if (!caller_go) return finish(s, FinishReason::kCaller);
    if (static_cast<int>(sl.res.ids.size()) >= sl.max_new_tokens) return finish(s, FinishReason::kLength);
    if (sl.length >= context_) return finish(s, FinishReason::kContext);
  }

  Model<Backend>& model_;
  Backend& be_;
  DecodeLoopOptions opt_;
  TokenCallback on_token_;
  DoneCallback on_done_;
  GenStats* stats_;
  Clock::time_point t0_;
  int V_ = 0, Vp_ = 0, S_ = 0, context_ = 0, live_ = 0;
  typename Backend::template Buf<SamplerSettings> settings_;
  std::vector<SamplerSettings> settings_host_;  // what settings_ holds
  typename Backend::template Buf<uint8_t> seen_;
  typename Backend::template Buf<int32_t> prompt_ids_;
  uint8_t* seen_p_ = nullptr;
  std::vector<Slot> slots_;
  Inflight inflight_[2];
  int prev_ = 0;           // inflight_[prev_]: the step enqueued last
  uint64_t admitted_ = 0;  // admissions so far
  std::vector<std::unique_ptr<typename Backend::StepGraph>> graphs_;  // by log2(rows); null until needed
  int rows_ = 0;
  bool first_seen_ = false;
};

}  // namespace forge
