#include "forge/generate/sampler.h"

#include "forge/generate/generator.h"

namespace forge {

std::vector<int32_t> generate(Transformer<float>& model, const std::vector<int32_t>& prompt,
                              const SampleOptions& opt, const std::function<void(int32_t)>& on_token) {
  GenRequest r;
  r.prompt = prompt;
  r.max_new_tokens = opt.max_new_tokens;
  r.sampling = opt.sampler();
  if (opt.stop_token >= 0) r.stop_ids = {opt.stop_token};
  GenOptions g;
  g.max_batch = 1;
  auto res = generate_batch(model, {r}, g, [&](int, int32_t id) {
    if (on_token) on_token(id);
    return true;
  });
  return std::move(res[0].ids);
}

}  // namespace forge
