#include "forge/generate/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "forge/core/error.h"

namespace forge {

int32_t sample_token(const float* logits, int V, const SampleOptions& opt, Rng& rng) {
  if (opt.temperature <= 0.0f) return static_cast<int32_t>(std::max_element(logits, logits + V) - logits);
  std::vector<int32_t> idx(V);
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  int keep = (opt.top_k > 0 && opt.top_k < V) ? opt.top_k : V;
  std::vector<double> p(keep);
  const double mx = logits[idx[0]];
  double sum = 0;
  for (int i = 0; i < keep; ++i) sum += p[i] = std::exp((logits[idx[i]] - mx) / opt.temperature);
  if (opt.top_p < 1.0f) {
    double cum = 0;
    for (int i = 0; i < keep; ++i) {
      cum += p[i] / sum;
      if (cum >= opt.top_p) {
        keep = i + 1;
        break;
      }
    }
    sum = std::accumulate(p.begin(), p.begin() + keep, 0.0);
  }
  const double u = rng.uniform() * sum;
  double cum = 0;
  for (int i = 0; i < keep; ++i) {
    cum += p[i];
    if (u < cum) return idx[i];
  }
  return idx[keep - 1];
}

std::vector<int32_t> generate(Transformer<float>& model, const std::vector<int32_t>& prompt,
                              const SampleOptions& opt, const std::function<void(int32_t)>& on_token) {
  if (prompt.empty()) throw Error("generate: the prompt is empty");
  const ModelConfig& cfg = model.config();
  std::vector<int32_t> ctx = prompt, out;
  Rng rng(opt.seed, /*stream=*/2);
  for (int i = 0; i < opt.max_new_tokens; ++i) {
    const int T_ = static_cast<int>(std::min<size_t>(ctx.size(), cfg.max_seq_len));
    const int32_t* window = ctx.data() + (ctx.size() - T_);
    const float* last = model.logits_of(window, 1, T_) + static_cast<size_t>(T_ - 1) * cfg.padded_vocab();
    const int32_t next = sample_token(last, cfg.vocab_size, opt, rng);
    ctx.push_back(next);
    out.push_back(next);
    if (on_token) on_token(next);
    if (next == opt.stop_token) break;
  }
  return out;
}

}  // namespace forge
