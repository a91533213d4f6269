// Batched generation over the KV cache, for any backend, of a fixed list of requests: the
// decode loop (decode_loop.h) with the requests admitted in order, each into the first free slot
// between two steps, until all have ended. A request's ids do not depend on the others in the
// batch or on its slot (the sampler's noise is keyed by its seed and position: ops/sample.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "forge/core/error.h"
#include "forge/core/gemm_algo.h"
#include "forge/generate/decode_loop.h"
#include "forge/model/transformer.h"

namespace forge {

struct GenOptions {
  int max_batch = 32;  // slots decoded together
  int capacity = 0;    // cache rows per slot; 0: what the longest request needs (<= max_seq_len)
  bool graph = true;   // capture the step once and replay it (CUDA graphs on the GPU)
  bool pdl = true;     // CUDA: decode kernels launch while the one before finishes (cuda/pdl.cuh)
  bool pipeline = true;  // hand out a step's ids while the next step runs (decode_loop.h)
  // CUDA: how cuBLASLt's algorithm is chosen per product shape (core/gemm_algo.h;
  // FORGE_GEMM_ALGO in forge bench generate).
  GemmAlgo gemm_algo = GemmAlgo::kHeuristic;
};

// on_token(request index, id) after each id; returning false ends that request (kCaller).
template <class Backend>
std::vector<GenResult> generate_batch(Model<Backend>& model, const std::vector<GenRequest>& reqs,
                                      const GenOptions& opt, const TokenCallback& on_token = {},
                                      GenStats* stats = nullptr) {
  std::vector<GenResult> out(reqs.size());
  if (reqs.empty()) return out;
  const ModelConfig& cfg = model.config();
  const int V = cfg.vocab_size;
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
  DecodeLoopOptions lo;
  lo.slots = static_cast<int>(std::min<size_t>(reqs.size(), std::max(1, opt.max_batch)));
  lo.capacity = opt.capacity > 0 ? std::min(opt.capacity, cfg.max_seq_len) : need;
  lo.penalty = penalty;
  lo.graph = opt.graph;
  lo.pipeline = opt.pipeline;
  DecodeLoop<Backend> loop(model, lo, on_token, [&out](int r, GenResult&& res) { out[r] = std::move(res); }, stats);
  for (size_t r = 0; r < reqs.size(); ++r)
    if (static_cast<int>(reqs[r].prompt.size()) > loop.context())
      throw Error(str("request ", r, ": a prompt of ", reqs[r].prompt.size(), " tokens does not fit the context of ",
                      loop.context()));
  size_t next = 0;
  // Waiting requests fill the free slots, prefilled together (DecodeLoop::admit_batch); one
  // asking for no ids takes no slot, so the filling goes on while slots stay free.
  std::vector<const GenRequest*> qs;
  std::vector<int> tags;
  auto fill = [&] {
    while (next < reqs.size() && loop.has_free_slot()) {
      qs.clear();
      tags.clear();
      for (const int free = loop.slots() - loop.live(); next < reqs.size() && static_cast<int>(qs.size()) < free; ++next) {
        qs.push_back(&reqs[next]);
        tags.push_back(static_cast<int>(next));
      }
      const std::vector<std::string> why = loop.admit_batch(qs, tags);
      for (size_t i = 0; i < why.size(); ++i)
        if (!why[i].empty()) throw Error(str("request ", tags[i], ": ", why[i]));
    }
  };
  fill();
  while (loop.live() > 0) {
    loop.step();
    fill();
  }
  return out;
}

}  // namespace forge
