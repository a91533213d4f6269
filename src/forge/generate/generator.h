// Batched generation over the KV cache, for any backend: requests are prefilled one at a time
// into free slots of the model's decode cache, then all slots advance together one token per
// step. A step is decode_step() plus the sampler (ops/sample.h) over every slot: backend work
// only, captured once as a step graph (a CUDA graph on the GPU) and replayed; the host reads the
// S chosen ids back each step — to stream them and to see which requests are finished — and a
// finished request's slot takes the next waiting request (prefilled between two steps; the
// graph stays valid because prefill uses none of the step's buffers).
//
// A request ends after max_new_tokens ids, after emitting one of its stop ids (which is
// returned, as Hugging Face's generate returns the EOS), when on_token asks it to (stop strings
// are the caller's: they need the text), or when its sequence fills the context (prompt +
// generated = decode_context()).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "forge/core/error.h"
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

struct GenOptions {
  int max_batch = 32;  // slots decoded together
  int capacity = 0;    // cache rows per slot; 0: what the longest request needs (<= max_seq_len)
  bool graph = true;   // capture the step once and replay it (CUDA graphs on the GPU)
  bool pdl = true;     // CUDA: decode kernels launch while the one before finishes (cuda/pdl.cuh)
};

struct GenStats {
  double first_token_s = 0;  // from the start to the first request's first id on the host
  double prefill_s = 0;      // all prefills (with their first sample)
  double decode_s = 0;       // all decode steps
  int64_t steps = 0;         // decode steps
  int64_t decode_tokens = 0;  // ids produced by decode steps for live requests
};

// on_token(request index, id) after each id; returning false ends that request (kCaller).
using TokenCallback = std::function<bool(int, int32_t)>;

template <class Backend>
std::vector<GenResult> generate_batch(Model<Backend>& model, const std::vector<GenRequest>& reqs,
                                      const GenOptions& opt, const TokenCallback& on_token = {},
                                      GenStats* stats = nullptr) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  auto since = [](Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); };
  std::vector<GenResult> out(reqs.size());
  if (reqs.empty()) return out;
  const ModelConfig& cfg = model.config();
  const int V = cfg.vocab_size, Vp = cfg.padded_vocab();
  int need = 1;
  bool penalty = false;
  for (size_t r = 0; r < reqs.size(); ++r) {
    const GenRequest& q = reqs[r];
    if (q.prompt.empty()) throw Error(str("request ", r, ": the prompt is empty"));
    for (int32_t id : q.prompt)
      if (id < 0 || id >= V) throw Error(str("request ", r, ": token id ", id, " outside the vocabulary [0, ", V, ")"));
    if (q.max_new_tokens < 0) throw Error(str("request ", r, ": max_new_tokens ", q.max_new_tokens, " < 0"));
    need = std::max<int64_t>(need, std::min<int64_t>(cfg.max_seq_len, static_cast<int64_t>(q.prompt.size()) + q.max_new_tokens));
    penalty = penalty || q.sampling.repetition_penalty != 1.0f;
  }
  const int S = static_cast<int>(std::min<size_t>(reqs.size(), std::max(1, opt.max_batch)));
  model.plan_decode(S, opt.capacity > 0 ? std::min(opt.capacity, cfg.max_seq_len) : need);
  const int context = model.decode_context();
  for (size_t r = 0; r < reqs.size(); ++r)
    if (static_cast<int>(reqs[r].prompt.size()) > context)
      throw Error(str("request ", r, ": a prompt of ", reqs[r].prompt.size(), " tokens does not fit the context of ",
                      context));

  Backend& be = model.backend();
  auto settings = be.template buf<SamplerSettings>(S);
  auto seen = be.template buf<uint8_t>(penalty ? static_cast<size_t>(S) * V : 0);
  auto prompt_ids = be.template buf<int32_t>(static_cast<size_t>(context));
  uint8_t* seen_p = penalty ? seen.data() : nullptr;

  std::vector<int> slot_req(S, -1), length(S, 0);  // request in each slot; its sequence length
  std::deque<int> waiting;
  for (size_t r = 0; r < reqs.size(); ++r) waiting.push_back(static_cast<int>(r));
  bool first_seen = false;
  int live = 0;

  // One id for slot s: record it; true when the request goes on.
  auto accept = [&](int s, int32_t id) {
    const int r = slot_req[s];
    const GenRequest& q = reqs[r];
    GenResult& res = out[r];
    res.ids.push_back(id);
    ++length[s];
    if (!first_seen) {
      first_seen = true;
      if (stats) stats->first_token_s = since(t0);
    }
    bool go = true;
    if (std::find(q.stop_ids.begin(), q.stop_ids.end(), id) != q.stop_ids.end()) {
      res.reason = FinishReason::kStop;
      go = false;
    }
    if (go && on_token && !on_token(r, id)) {
      res.reason = FinishReason::kCaller;
      go = false;
    } else if (!go && on_token) {
      on_token(r, id);
    }
    if (go && static_cast<int>(res.ids.size()) >= q.max_new_tokens) {
      res.reason = FinishReason::kLength;
      go = false;
    }
    if (go && length[s] >= context) {
      res.reason = FinishReason::kContext;
      go = false;
    }
    return go;
  };
  // Fills free slot s with the next waiting request (prefill + its first id); repeats while the
  // request ends at once.
  auto admit = [&](int s) {
    while (!waiting.empty()) {
      const int r = waiting.front();
      waiting.pop_front();
      const GenRequest& q = reqs[r];
      if (q.max_new_tokens == 0) continue;
      const auto tp = Clock::now();
      const int T = static_cast<int>(q.prompt.size());
      be.upload(prompt_ids.data(), q.prompt.data(), T);
      be.upload(settings.data() + s, &q.sampling, 1);
      if (seen_p) {
        std::vector<uint8_t> row(V, 0);
        for (int32_t id : q.prompt) row[id] = 1;
        be.upload(seen_p + static_cast<size_t>(s) * V, row.data(), V);
      }
      model.prefill(s, prompt_ids.data(), T);
      be.sample(model.decode_tokens() + s, be.at(model.decode_logits(), static_cast<int64_t>(s) * Vp),
                settings.data() + s, seen_p ? seen_p + static_cast<size_t>(s) * V : nullptr,
                model.decode_positions() + s, 1, V, Vp);
      int32_t id = 0;
      be.download(&id, model.decode_tokens() + s, 1);
      slot_req[s] = r;
      length[s] = T;
      const bool go = accept(s, id);
      if (stats) stats->prefill_s += since(tp);
      if (go) {
        ++live;
        return;
      }
      slot_req[s] = -1;
    }
  };
  for (int s = 0; s < S; ++s) admit(s);

  auto step = [&] {
    model.decode_step();
    be.sample(model.decode_tokens(), model.decode_logits(), settings.data(), seen_p, model.decode_positions(), S, V,
              Vp);
  };
  typename Backend::StepGraph graph;
  bool captured = false;
  std::vector<int32_t> ids(S);
  while (live > 0) {
    const auto ts = Clock::now();
    if (!opt.graph) {
      step();
    } else if (!captured) {
      step();  // eagerly once: every one-time setup happens before the capture (cuda/graph.h)
      be.capture(graph, step);
      captured = true;
    } else {
      be.launch(graph);
    }
    be.download(ids.data(), model.decode_tokens(), S);
    if (stats) {
      stats->decode_s += since(ts);
      ++stats->steps;
    }
    for (int s = 0; s < S; ++s) {
      if (slot_req[s] < 0) continue;
      if (stats) ++stats->decode_tokens;
      if (!accept(s, ids[s])) {
        slot_req[s] = -1;
        --live;
        admit(s);
      }
    }
  }
  be.synchronize();
  return out;
}

}  // namespace forge
