// forge bench gemm: cuBLASLt TFLOP/s on the products of one training step of a preset (micro-batch
// × sequence rows): each linear layer's forward, dX and dW exactly as the CUDA backend calls them
// (layout, epilogue — bias, GELU with its aux output, the DGELU backward —, beta 1 for the f32
// weight gradients), the LM head's row chunk, next to the 8192³ ceiling measured on the same GPU
// in the same run. Timing: CUDA events around 20 repetitions after 3 warm-ups, median of 5 such
// trials; inputs are random (never zeros: they run faster).
//
// --algos times every algorithm cuBLASLt's heuristic offers for each product (up to 8; the
// heuristic's first is what a plan runs by default), checks which write the first's bits on the
// bench's operands, and adds up over the products of one step what the fastest would save (what
// FORGE_GEMM_ALGO=timed-any picks) and what the fastest with the first's bits would (timed).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "bench.h"
#include "cuda_timing.h"
#include "forge/backend/cuda/check.h"
#include "forge/backend/cuda/context.h"
#include "forge/backend/cuda/cross_entropy.h"
#include "forge/backend/cuda/gemm.h"
#include "forge/backend/cuda/ops.h"
#include "forge/backend/cuda/runtime.h"
#include "forge/core/error.h"
#include "forge/model/config.h"

namespace forge::bench {

namespace {

struct Shape {
  std::string what;
  cuda::GemmArgs g;   // shape, transposes, types, beta and epilogue (pointers set when run)
  int calls_per_step;  // how often one training step makes this product
};

double time_gemm(cuda::Context& ctx, const cuda::GemmArgs& g, const void* a, const void* b, void* c) {
  return time_op(ctx, [&] { cuda::gemm(ctx, g, a, b, c); });
}

cuda::GemmArgs args(int M, int N, int K, bool ta, bool tb) {
  cuda::GemmArgs g;
  g.M = M, g.N = N, g.K = K, g.trans_a = ta, g.trans_b = tb;
  g.ab_type = g.c_type = DType::kBF16;
  return g;
}

// A linear layer inp (N, C) → out (N, OC) as CudaBackend runs it: forward (with its epilogue),
// dX = dout · op(W) (with DGELU when the layer feeds a GELU's backward), dW += (f32, beta 1).
void add_linear(std::vector<Shape>& v, const std::string& name, int N, int C, int OC, bool in_out, int L,
                cuda::GemmEpilogue fwd, bool dgelu_dx) {
  cuda::GemmArgs f = args(N, OC, C, false, !in_out);
  f.epilogue = fwd;
  v.push_back({name + " fwd", f, L});
  cuda::GemmArgs dx = args(N, C, OC, false, in_out);
  if (dgelu_dx) dx.epilogue = cuda::GemmEpilogue::kDGelu;
  v.push_back({name + (dgelu_dx ? " dX+dGELU" : " dX"), dx, L});
  cuda::GemmArgs dw = in_out ? args(C, OC, N, true, false) : args(OC, C, N, true, false);
  dw.c_type = DType::kF32, dw.beta = 1.0f;
  v.push_back({name + " dW", dw, L});
}

// The products of one bf16 training step of cfg at N rows (recompute none).
std::vector<Shape> step_shapes(const ModelConfig& cfg, int N) {
  const bool gpt2 = cfg.family == Family::kGpt2;
  const int C = cfg.n_embd, FF = cfg.ffn_hidden, L = cfg.n_layer, HS = cfg.head_dim();
  const int QKV = (cfg.n_head + 2 * cfg.n_kv_head) * HS, ATT = cfg.n_head * HS;
  using E = cuda::GemmEpilogue;
  std::vector<Shape> v;
  v.push_back({"ceiling 8192^3", args(8192, 8192, 8192, false, true), 0});
  add_linear(v, "qkv", N, C, QKV, gpt2, L, gpt2 || cfg.qkv_bias ? E::kBias : E::kNone, false);
  add_linear(v, "attn-out", N, ATT, C, gpt2, L, gpt2 || cfg.o_bias ? E::kBias : E::kNone, false);
  if (gpt2) {
    add_linear(v, "mlp-fc", N, C, FF, true, L, E::kBiasGeluAux, false);
    add_linear(v, "mlp-proj", N, FF, C, true, L, E::kBias, true);
  } else {  // gate and up: two products of this shape a layer each way
    add_linear(v, "mlp-gate|up", N, C, FF, false, 2 * L, E::kNone, false);
    add_linear(v, "mlp-down", N, FF, C, false, L, E::kNone, false);
  }
  const int Vp = cfg.padded_vocab(), rows = cuda::lm_head_chunk_rows(N, Vp);
  const int chunks = (N + rows - 1) / rows;
  v.push_back({"lm-head logits", args(rows, Vp, C, false, true), chunks});
  cuda::GemmArgs dx = args(rows, C, Vp, false, false);
  dx.beta = 1.0f;
  v.push_back({"lm-head dX", dx, chunks});
  cuda::GemmArgs dw = args(Vp, C, rows, true, false);
  dw.c_type = DType::kF32, dw.beta = 1.0f;
  v.push_back({"lm-head dW", dw, chunks});
  return v;
}

}  // namespace

void gemm_cuda(const BenchOptions& o) {
  if (!cuda::available()) throw Error("forge bench gemm needs a CUDA GPU: " + cuda::device_summary());
  cuda::Context ctx(0);
  const ModelConfig cfg = preset_config(o.preset);
  const int N = o.batch * o.seq_len;
  const std::vector<Shape> shapes = step_shapes(cfg, N);
  std::printf("forge bench gemm: cuBLASLt, bf16 inputs, f32 accumulate, bf16 output (dW: f32, accumulated)\n");
  std::printf("device %s; preset %s, %d x %d = %d rows; the products of one training step\n\n",
              cuda::device_summary().c_str(), o.preset.c_str(), o.batch, o.seq_len, N);
  if (o.algos)
    std::printf("%-18s %6s %6s %6s %5s %10s %8s | %4s %10s %5s %9s | %4s %10s %5s %9s\n", "product", "M", "N",
                "K", "calls", "heur. us", "TFLOP/s", "algs", "best us", "best", "ms/step", "same", "same us", "best",
                "ms/step");
  else
    std::printf("%-18s %6s %6s %6s %5s %10s %8s\n", "product", "M", "N", "K", "calls", "time (us)", "TFLOP/s");
  nlohmann::json rows = nlohmann::json::array();
  double step_heuristic = 0, step_best = 0, step_same = 0;
  for (const Shape& s : shapes) {
    cuda::GemmArgs g = s.g;
    const size_t a_n = static_cast<size_t>(g.M) * g.K, b_n = static_cast<size_t>(g.K) * g.N,
                 c_n = static_cast<size_t>(g.M) * g.N;
    cuda::DeviceBuffer<uint16_t> a(ctx.allocator(), a_n), b(ctx.allocator(), b_n);
    cuda::DeviceBuffer<float> c(ctx.allocator(), c_n);  // room for f32; bf16 uses half
    cuda::DeviceBuffer<uint16_t> aux, bias;
    fill_random_bf16(ctx, a.data(), a_n, 1);
    fill_random_bf16(ctx, b.data(), b_n, 2, 0.05f);
    FORGE_CUDA_CHECK(cudaMemsetAsync(c.data(), 0, c_n * 4, ctx.stream()));
    if (g.epilogue == cuda::GemmEpilogue::kBias || g.epilogue == cuda::GemmEpilogue::kBiasGeluAux) {
      bias = cuda::DeviceBuffer<uint16_t>(ctx.allocator(), g.N);
      fill_random_bf16(ctx, bias.data(), g.N, 3);
      g.bias = bias.data();
    }
    if (g.epilogue == cuda::GemmEpilogue::kBiasGeluAux || g.epilogue == cuda::GemmEpilogue::kDGelu) {
      aux = cuda::DeviceBuffer<uint16_t>(ctx.allocator(), c_n);
      fill_random_bf16(ctx, aux.data(), c_n, 4);
      g.aux = aux.data();
    }
    const double flop = 2.0 * g.M * g.N * g.K;
    const double sec = time_gemm(ctx, g, a.data(), b.data(), c.data());
    nlohmann::json row = {{"product", s.what}, {"M", g.M},      {"N", g.N},           {"K", g.K},
                          {"calls_per_step", s.calls_per_step}, {"seconds", sec}, {"tflops", flop / sec / 1e12}};
    if (!o.algos) {
      std::printf("%-18s %6d %6d %6d %5d %10.1f %8.1f\n", s.what.c_str(), g.M, g.N, g.K, s.calls_per_step,
                  sec * 1e6, flop / sec / 1e12);
    } else {
      const int n = cuda::gemm_candidates(ctx, g, a.data(), b.data(), c.data());
      double best = sec, best_same = sec;
      int best_k = -1, best_same_k = -1;  // -1: the plan's own (the heuristic's first)
      int same_n = 0;
      nlohmann::json cands = nlohmann::json::array(), sames = nlohmann::json::array();
      for (int k = 0; k < n; ++k) {
        // From C zeroed: the timing's repeated products have accumulated into it (beta 1), a bf16
        // C up to inf or NaN, where every candidate leaves it unchanged and the check refuses.
        FORGE_CUDA_CHECK(cudaMemsetAsync(c.data(), 0, c_n * 4, ctx.stream()));
        const bool same = cuda::gemm_candidate_same_bits(ctx, g, a.data(), b.data(), c.data(), k);
        cuda::GemmArgs gk = g;
        gk.candidate = k;
        const double t = time_gemm(ctx, gk, a.data(), b.data(), c.data());
        cands.push_back(t);
        sames.push_back(same);
        same_n += same;
        if (t < best) best = t, best_k = k;
        if (same && t < best_same) best_same = t, best_same_k = k;
      }
      const double calls_ms = 1e3 * s.calls_per_step;
      step_heuristic += sec * calls_ms;
      step_best += best * calls_ms;
      step_same += best_same * calls_ms;
      auto name = [](int k) { return k < 0 ? std::string("heur") : std::to_string(k); };
      std::printf("%-18s %6d %6d %6d %5d %10.1f %8.1f | %4d %10.1f %5s %9.3f | %4d %10.1f %5s %9.3f\n",
                  s.what.c_str(), g.M, g.N, g.K, s.calls_per_step, sec * 1e6, flop / sec / 1e12, n, best * 1e6,
                  name(best_k).c_str(), (sec - best) * calls_ms, same_n, best_same * 1e6, name(best_same_k).c_str(),
                  (sec - best_same) * calls_ms);
      row["candidate_seconds"] = cands;
      row["candidate_same_bits"] = sames;
      row["best_candidate"] = best_k;
      row["best_same_bits_candidate"] = best_same_k;
    }
    rows.push_back(row);
  }
  if (o.algos)
    std::printf("\none step's products: %.2f ms with the heuristic's algorithms, %.2f ms with the fastest "
                "candidate of each (-%.2f ms, %.1f%%: timed-any), %.2f ms with the fastest of those with the "
                "heuristic's bits (-%.2f ms, %.1f%%: timed).\n'best' is the fastest candidate's index (0 is the "
                "heuristic's first, timed again); 'heur' when none beat the first timing; 'same': how many "
                "candidates write\nthe first's bits on these operands; ms/step: what it saves over one step's "
                "calls.\n",
                step_heuristic, step_best, step_heuristic - step_best,
                100.0 * (step_heuristic - step_best) / std::max(step_heuristic, 1e-9), step_same,
                step_heuristic - step_same, 100.0 * (step_heuristic - step_same) / std::max(step_heuristic, 1e-9));
  std::printf("\nreference: cuBLASLt 8192^3 bf16 on an H200 measured 788-806 TFLOP/s (ANCHORS.md; other GPUs differ);\n"
              "the first row is the same product measured in this run.\n");
  if (!o.json_out.empty()) std::ofstream(o.json_out) << nlohmann::json{{"bench", "gemm"}, {"rows", rows}}.dump(2) << "\n";
}

}  // namespace forge::bench
