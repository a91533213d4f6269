// decode_timeline: where a decode step's time goes on the GPU, kernel by kernel, from CUPTI's
// activity records (start and end of every kernel, graph-launched ones included): per step the
// kernel time, the gaps between kernels (launch latency, dependency waits, idle) and the span;
// per graph node its average duration and the gap before it. nsys is not installed on the GPU
// machine; CUPTI ships with the CUDA toolkit, so this is the timeline we have.
//
//   build/decode_timeline [--preset smollm2-135m] [--batch 1] [--prompt-len 128]
//                         [--new-tokens 64] [--no-pdl] [--no-graph]
// (A development tool, not part of forge: built when CMake finds CUDA and CUPTI.)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "cupti_timeline.h"
#include "forge/core/rng.h"
#include "forge/generate/engine.h"
#include "forge/model/config.h"
#include "forge/model/params.h"

namespace {

const char* arg(int argc, char** argv, const char* key, const char* def) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], key) == 0) return argv[i + 1];
  return def;
}
bool flag(int argc, char** argv, const char* key) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], key) == 0) return true;
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace forge;
  const std::string preset = arg(argc, argv, "--preset", "smollm2-135m");
  const int batch = std::atoi(arg(argc, argv, "--batch", "1"));
  const int prompt_len = std::atoi(arg(argc, argv, "--prompt-len", "128"));
  const int new_tokens = std::atoi(arg(argc, argv, "--new-tokens", "64"));
  ModelConfig cfg = preset_config(preset);
  cfg.max_seq_len = std::max(cfg.max_seq_len, prompt_len + new_tokens);
  std::vector<float> w(ParamTable(cfg).total());
  ParamTable(cfg).init(w.data(), 1337);
  auto engine = make_cuda_engine(cfg, w, "bf16");
  std::vector<GenRequest> reqs(batch);
  Rng rng(17);
  for (GenRequest& r : reqs) {
    r.prompt.resize(prompt_len);
    for (auto& t : r.prompt) t = static_cast<int32_t>(rng.below(cfg.vocab_size));
    r.max_new_tokens = new_tokens;
  }
  GenOptions g;
  g.max_batch = batch;
  g.graph = !flag(argc, argv, "--no-graph");
  g.pdl = !flag(argc, argv, "--no-pdl");
  engine->generate(reqs, g);  // warm-up

  dev::CuptiRecorder recorder;
  recorder.start();
  GenStats st;
  engine->generate(reqs, g, {}, &st);
  const std::vector<dev::ActivityRecord> records = recorder.stop();  // generate() returns synchronized

  // Decode steps: kernels of a graph (graph_id != 0; eager: the kernels after the last prefill
  // are cut at every embedding_at) from one repeat of the first node to the next.
  std::vector<std::vector<dev::ActivityRecord>> steps;
  const bool graphed = std::any_of(records.begin(), records.end(), [](const auto& r) { return r.graph_id != 0; });
  uint64_t first_node = 0;
  for (const auto& r : records) {
    if (graphed && r.graph_id == 0) continue;
    const bool starts = graphed ? (first_node == 0 || r.node_id == first_node)
                                : r.name.find("embedding_at") != std::string::npos;
    if (graphed && first_node == 0) first_node = r.node_id;
    if (starts) steps.emplace_back();
    if (!steps.empty()) steps.back().push_back(r);
  }
  if (!graphed && !steps.empty()) steps.erase(steps.begin());  // the eager capture's first step
  if (steps.size() < 3) {
    std::fprintf(stderr, "decode_timeline: only %zu steps recorded\n", steps.size());
    return 1;
  }
  steps.erase(steps.begin());  // the first replay may include one-time costs
  const size_t nodes = steps.front().size();
  std::vector<double> dur(nodes, 0), gap(nodes, 0);
  std::vector<std::string> names(nodes);
  double span = 0, busy = 0;
  int used = 0;
  for (const auto& s : steps) {
    if (s.size() != nodes) continue;
    ++used;
    span += (s.back().end - s.front().start) * 1e-3;
    for (size_t i = 0; i < nodes; ++i) {
      names[i] = s[i].name;
      dur[i] += (s[i].end - s[i].start) * 1e-3;
      if (i > 0) gap[i] += (static_cast<double>(s[i].start) - static_cast<double>(s[i - 1].end)) * 1e-3;
      busy += (s[i].end - s[i].start) * 1e-3;
    }
  }
  std::printf("decode_timeline: %s, batch %d, prompt %d, %d new tokens, graph %s, PDL %s; %d steps of %zu kernels\n",
              preset.c_str(), batch, prompt_len, new_tokens, g.graph ? "on" : "off", g.pdl ? "on" : "off", used,
              nodes);
  std::printf("step span %.1f µs (first kernel start to last kernel end); kernel time %.1f µs; gaps %.1f µs\n",
              span / used, busy / used, (span - busy) / used);
  // Between steps: the last kernel of one replay to the first of the next (the step graph's
  // launch, the ids' copy to the host; PDL does not reach across graph launches).
  double between = 0, between_max = 0;
  int pairs = 0;
  for (size_t i = 0; i + 1 < steps.size(); ++i) {
    const double g = (static_cast<double>(steps[i + 1].front().start) - static_cast<double>(steps[i].back().end)) * 1e-3;
    between += g;
    between_max = std::max(between_max, g);
    ++pairs;
  }
  std::printf("between steps %.1f µs on average, %.1f at most (last kernel of a step to the first of the next)\n",
              pairs ? between / pairs : 0.0, between_max);
  std::printf("generate's own timing: %.1f µs per step over %lld steps, of which the capturing step(s) %.2f ms "
              "(eager run + graph capture; without them %.1f µs per step)\n\n",
              st.decode_s / st.steps * 1e6, static_cast<long long>(st.steps), st.capture_s * 1e3,
              st.steps > 1 ? (st.decode_s - st.capture_s) / (st.steps - 1) * 1e6 : 0.0);
  // Per kernel name: count per step, mean duration, mean gap before.
  std::map<std::string, std::tuple<int, double, double>> by_name;
  for (size_t i = 0; i < nodes; ++i) {
    auto& [n, d, gp] = by_name[names[i]];
    ++n;
    d += dur[i] / used;
    gp += gap[i] / used;
  }
  std::vector<std::pair<std::string, std::tuple<int, double, double>>> rows(by_name.begin(), by_name.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
    return std::get<1>(a.second) + std::get<2>(a.second) > std::get<1>(b.second) + std::get<2>(b.second);
  });
  std::printf("| kernel | per step | µs each | gap before, µs each | µs per step (kernel + gap) |\n");
  std::printf("| --- | ---: | ---: | ---: | ---: |\n");
  for (const auto& [name, t] : rows) {
    const auto& [n, d, gp] = t;
    std::printf("| %s | %d | %.2f | %.2f | %.1f |\n", name.c_str(), n, d / n, gp / n, d + gp);
  }
  std::printf("\nfirst 16 nodes of a step (µs: gap before, duration):\n");
  for (size_t i = 0; i < std::min<size_t>(16, nodes); ++i)
    std::printf("  %2zu %-60s %6.2f %6.2f\n", i, names[i].c_str(), gap[i] / used, dur[i] / used);
  return 0;
}
