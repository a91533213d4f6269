// Greedy continuations by transformers' generate() for the tiny golden models
// (tests/data/hf_golden/<name>/generate.json, written by tools/make_hf_generate_golden.py), and
// the check that a Forge engine reproduces them: all prompts in one batch, and with fewer slots
// than prompts (a finished request's slot is refilled between steps).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "forge/generate/engine.h"
#include "forge/model/model_dir.h"

namespace forge::testing {

// The checkout: FORGE_SOURCE_DIR from the environment when set (the GPU machine runs the binary
// in another copy of the tree), else the one the tests were built from.
inline std::filesystem::path source_dir() {
  const char* env = std::getenv("FORGE_SOURCE_DIR");
  return env && *env ? std::filesystem::path(env) : std::filesystem::path(FORGE_SOURCE_DIR);
}

inline std::vector<std::filesystem::path> hf_generate_dirs() {
  namespace fs = std::filesystem;
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(source_dir() / "tests/data/hf_golden"))
    if (fs::exists(e.path() / "generate.json")) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

// make_engine(config, weights) -> std::unique_ptr<Engine>.
template <class MakeEngine>
void expect_hf_greedy_generation(const MakeEngine& make_engine) {
  const auto dirs = hf_generate_dirs();
  ASSERT_EQ(dirs.size(), 11u) << "expected the eleven golden models of tools/make_hf_golden.py";
  for (const auto& dir : dirs) {
    SCOPED_TRACE(dir.filename().string());
    std::ifstream f(dir / "generate.json");
    const nlohmann::json g = nlohmann::json::parse(f);
    const auto prompts = g["prompts"].get<std::vector<std::vector<int32_t>>>();
    const auto want = g["generated"].get<std::vector<std::vector<int32_t>>>();
    Transformer<float> cpu = load_model_dir(dir.string());
    std::unique_ptr<Engine> engine = make_engine(cpu.config(), cpu.weights_host());
    std::vector<GenRequest> reqs(prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      reqs[i].prompt = prompts[i];
      reqs[i].max_new_tokens = g["max_new_tokens"];  // greedy: SamplerSettings' default temperature 0
    }
    for (int slots : {static_cast<int>(prompts.size()), 2, 1}) {
      GenOptions o;
      o.max_batch = slots;
      const std::vector<GenResult> got = engine->generate(reqs, o);
      for (size_t i = 0; i < prompts.size(); ++i) {
        EXPECT_EQ(got[i].ids, want[i]) << "prompt " << i << ", " << slots << " slots";
        EXPECT_EQ(got[i].reason, FinishReason::kLength);
      }
    }
  }
}

}  // namespace forge::testing
