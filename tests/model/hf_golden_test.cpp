// Whole-model parity with Hugging Face transformers: for every tests/data/hf_golden/<name>/
// (tiny random models and their outputs, written by tools/make_hf_golden.py), Forge loads the
// directory with load_model_dir and must reproduce transformers' logits and mean loss to 1e-4
// relative and every parameter's gradient norm to 1e-3 relative.
//
// HF's causal-LM loss shifts the labels inside the model (position t predicts ids[t + 1]);
// Forge takes the targets explicitly, so they are the ids shifted with the last position -1
// (ignored): the same mean over B·(T − 1) predictions. Forge's gradients are in HF layout; the
// embedding's padding rows hold zeros and do not change its norm.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "forge/model/model_dir.h"
#include "testing.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

const fs::path kGoldenDir = fs::path(FORGE_SOURCE_DIR) / "tests/data/hf_golden";

std::vector<fs::path> golden_dirs() {
  std::vector<fs::path> out;
  if (!fs::is_directory(kGoldenDir)) return out;
  for (const auto& e : fs::directory_iterator(kGoldenDir))
    if (fs::exists(e.path() / "golden.json")) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

void check_model(const fs::path& dir) {
  SCOPED_TRACE(dir.filename().string());
  std::ifstream f(dir / "golden.json");
  const nlohmann::json g = nlohmann::json::parse(f);
  const int B = g["batch"], T_ = g["seq_len"], V = g["vocab_size"];
  Transformer<float> model = load_model_dir(dir.string());
  ASSERT_EQ(model.config().vocab_size, V);

  std::vector<int32_t> ids(static_cast<size_t>(B) * T_), targets(ids.size());  // (B, T)
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T_; ++t) ids[b * T_ + t] = g["ids"][b][t].get<int32_t>();
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T_; ++t) targets[b * T_ + t] = t + 1 < T_ ? ids[b * T_ + t + 1] : -1;

  const double loss = model.loss(ids.data(), targets.data(), B, T_);
  const double want_loss = g["loss"].get<double>();
  EXPECT_NEAR(loss, want_loss, 1e-4 * std::fabs(want_loss)) << "loss";

  // Logits (B, T, Vp) -> the V real columns. Tolerance 1e-4 relative to each value, with an
  // absolute floor of 1e-4 of the largest logit for values near zero.
  const int Vp = model.config().padded_vocab();
  const float* logits = model.logits_of(ids.data(), B, T_);
  std::vector<float> got, want;
  double scale = 0;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T_; ++t)
      for (int v = 0; v < V; ++v) {
        got.push_back(logits[(static_cast<size_t>(b) * T_ + t) * Vp + v]);
        want.push_back(g["logits"][b][t][v].get<float>());
        scale = std::max(scale, std::fabs(static_cast<double>(want.back())));
      }
  EXPECT_TRUE(testing::all_close(got, want, {1e-4 * scale, 1e-4})) << "logits";

  model.zero_grad();
  model.loss_and_grad(ids.data(), targets.data(), B, T_, 1.0);
  const auto& norms = g["grad_norms"];
  size_t checked = 0;
  for (const auto& p : model.table().params()) {
    ASSERT_TRUE(norms.contains(p.name)) << "transformers has no parameter " << p.name;
    double sq = 0;
    for (int64_t i = 0; i < p.numel(); ++i) {
      const double x = model.grads()[p.offset + i];
      sq += x * x;
    }
    const double want_norm = norms[p.name].get<double>();
    EXPECT_NEAR(std::sqrt(sq), want_norm, 1e-3 * want_norm + 1e-9) << "grad norm of " << p.name;
    ++checked;
  }
  EXPECT_EQ(checked, norms.size()) << "transformers has parameters Forge lacks";
}

TEST(HfGolden, LogitsLossAndGradientNormsMatchTransformers) {
  const auto dirs = golden_dirs();
  ASSERT_EQ(dirs.size(), 11u) << kGoldenDir << ": expected the eleven models of tools/make_hf_golden.py "
                              << "(run it on a machine with torch and transformers, commit its output)";
  for (const auto& d : dirs) check_model(d);
}

}  // namespace
}  // namespace forge
