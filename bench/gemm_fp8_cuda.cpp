// forge bench gemm --fp8: what FP8 (Hopper e4m3 / e5m2) would do to a training step's linear
// layers, before any of it is wired into training (issue 16 welcomes FP8 as an option). For each
// linear layer of the preset, its three products — forward X·Wᵀ (e4m3 × e4m3), dX = dY·W (e5m2 ×
// e4m3), dW = dYᵀ·X (e5m2 × e4m3, f32 accumulated) — in the TN layout cuBLASLt's FP8 kernels
// take, with and without fast accumulation, beside the same products in bf16; and the casts an
// FP8 step adds (X and dY to fp8 for the first two, both transposed for dW). The sums at the end
// are one step's linear layers in bf16 against FP8 plus its casts: the most FP8 could take off a
// step before scaling bookkeeping (amax history), which is not modelled. Then the LM head's
// products as FORGE_FP8 runs them (lm_head_fp8 below). GPT-2's products carry their
// training epilogues ("+bias", "+gelu": bias, GELU and its aux output; "+dgelu": the GELU
// backward), in every column. "rows us": FORGE_FP8=rows's product (per-row scales, fast
// accumulation) with the algorithm cuBLASLt's heuristic ranks first, which training runs;
// "rows best": the fastest of the heuristic's candidates (whatever their bits).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench.h"
#include "cuda_timing.h"
#include "forge/backend/cuda/context.h"
#include "forge/backend/cuda/cross_entropy.h"
#include "forge/backend/cuda/gemm.h"
#include "forge/backend/cuda/ops.h"
#include "forge/backend/cuda/runtime.h"
#include "forge/core/error.h"
#include "forge/core/fp8_recipe.h"
#include "forge/model/config.h"

namespace forge::bench {

namespace {

struct Linear {
  std::string name;
  int in, out;  // C -> OC
  int calls;    // per step (layers; Llama's gate and up: two a layer)
};

struct Product {
  std::string what;
  int M, N, K;
  DType a, b, c;          // FP8 operand formats and the output type
  cuda::GemmEpilogue ep;  // the training call's (bias, GELU aux, DGELU): timed with it
};

// The LM head as FORGE_FP8's recipes run it (cross_entropy.cu): per row chunk, the logits product
// (x's E4M3 rows from the final norm, w's rows; fast accumulation) and the dx product (the chunk's
// FP8 dlogits, wᵀ's rows; full accumulation, K = Vp), against bf16; the row kernel writing the FP8
// dlogits beside the bf16 ones; w's two casts once a call. Returns the step's change in seconds.
double lm_head_fp8(cuda::Context& ctx, int R, int C, int V, int Vp, nlohmann::json& rows) {
  const int Nc = cuda::lm_head_chunk_rows(R, Vp), chunks = (R + Nc - 1) / Nc;
  const int ld = (Vp + 63) / 64 * 64;
  cuda::Allocator& al = ctx.allocator();
  cuda::DeviceBuffer<uint16_t> x16(al, size_t(Nc) * C), w16(al, size_t(Vp) * C),
      logits(al, size_t(Nc) * ld), dx(al, size_t(Nc) * C);
  cuda::DeviceBuffer<uint8_t> x8(al, size_t(Nc) * C), w8(al, size_t(Vp) * C),
      wt8(al, size_t(C) * Vp), d8(al, size_t(Nc) * ld);
  cuda::DeviceBuffer<float> xs(al, Nc), ws(al, Vp), wts(al, C), ds(al, Nc), losses(al, Nc),
      dloss(al, 1);
  cuda::DeviceBuffer<int32_t> targets(al, Nc);
  fill_random_bf16(ctx, x16.data(), x16.size(), 11);
  fill_random_bf16(ctx, w16.data(), w16.size(), 12, 0.05f);
  fill_random_bf16(ctx, logits.data(), logits.size(), 13);
  FORGE_CUDA_CHECK(cudaMemsetAsync(dx.data(), 0, dx.bytes(), ctx.stream()));
  FORGE_CUDA_CHECK(cudaMemsetAsync(targets.data(), 0, targets.bytes(), ctx.stream()));
  const float g = 1.0f / static_cast<float>(R);
  FORGE_CUDA_CHECK(cudaMemcpy(dloss.data(), &g, sizeof(g), cudaMemcpyHostToDevice));
  const double cw = time_op(ctx, [&] {
    cuda::cast_fp8_rows(ctx, DType::kF8E4M3, w8.data(), ws.data(), DType::kBF16, w16.data(), Vp, C);
  });
  const double cwt = time_op(ctx, [&] {
    cuda::cast_transpose_fp8_rows(ctx, DType::kF8E4M3, wt8.data(), wts.data(), DType::kBF16,
                                  w16.data(), Vp, C);
  });
  cuda::cast_fp8_rows(ctx, DType::kF8E4M3, x8.data(), xs.data(), DType::kBF16, x16.data(), Nc, C);
  const double ce = time_op(ctx, [&] {
    cuda::ce_rows_bf16(ctx, logits.data(), ld, losses.data(), targets.data(), dloss.data(), Nc, V);
  });
  const double ce8 = time_op(ctx, [&] {
    cuda::ce_rows_bf16(ctx, logits.data(), ld, losses.data(), targets.data(), dloss.data(), Nc, V,
                       d8.data(), ds.data(), DType::kF8E4M3);
  });
  cuda::GemmArgs lg;  // logits (Nc, Vp; stride ld) = x · wᵀ
  lg.M = Nc, lg.N = Vp, lg.K = C, lg.trans_b = true, lg.ldc = ld;
  lg.ab_type = lg.c_type = DType::kBF16;
  const double t_lg =
      time_op(ctx, [&] { cuda::gemm(ctx, lg, x16.data(), w16.data(), logits.data()); });
  cuda::GemmArgs lg8 = lg;
  lg8.ab_type = lg8.b_type = DType::kF8E4M3, lg8.a_scale = xs.data(), lg8.b_scale = ws.data();
  lg8.row_scales = true, lg8.fast_accum = true;
  const double t_lg8 =
      time_op(ctx, [&] { cuda::gemm(ctx, lg8, x8.data(), w8.data(), logits.data()); });
  cuda::GemmArgs dg;  // dx (Nc, C) += dlogits (Nc, Vp; stride ld) · w
  dg.M = Nc, dg.N = C, dg.K = Vp, dg.lda = ld, dg.beta = 1.0f;
  dg.ab_type = dg.c_type = DType::kBF16;
  const double t_dx =
      time_op(ctx, [&] { cuda::gemm(ctx, dg, logits.data(), w16.data(), dx.data()); });
  cuda::GemmArgs dg8 = dg;
  dg8.trans_b = true, dg8.ab_type = dg8.b_type = DType::kF8E4M3;
  dg8.a_scale = ds.data(), dg8.b_scale = wts.data(), dg8.row_scales = true;
  const double t_dx8 =
      time_op(ctx, [&] { cuda::gemm(ctx, dg8, d8.data(), wt8.data(), dx.data()); });
  dg8.fast_accum = true;
  const double t_dx8f =
      time_op(ctx, [&] { cuda::gemm(ctx, dg8, d8.data(), wt8.data(), dx.data()); });
  auto line = [&](const char* what, int M, int N, int K, double t16, double t8, double t8f) {
    const double flop = 2.0 * M * N * K;
    std::printf("%-22s %6d %6d %6d %9.1f %8.1f %9s %8s %9s %6.2f %9.1f %9s\n", what, M, N, K,
                t16 * 1e6, flop / t16 / 1e12, "", "", "", t16 / t8, t8 * 1e6, "");
    if (t8f > 0) std::printf("%-22s fast accumulation: %.1f us\n", what, t8f * 1e6);
  };
  std::printf("\nLM head, %d chunk(s) of %d rows (FP8 rows: logits fast accumulation, dx full):\n",
              chunks, Nc);
  line("lm-head logits", Nc, Vp, C, t_lg, t_lg8, 0);
  line("lm-head dX", Nc, C, Vp, t_dx, t_dx8, t_dx8f);
  std::printf(
      "%-22s row kernel %.1f us, with FP8 dlogits %.1f us; casts a call: W %.1f us, W^T %.1f us\n",
      "lm-head", ce * 1e6, ce8 * 1e6, cw * 1e6, cwt * 1e6);
  const double bf16 = chunks * (t_lg + t_dx), fp8 = chunks * (t_lg8 + t_dx8 + ce8 - ce) + cw + cwt;
  std::printf("%-22s a step: bf16 %.2f ms, FP8 %.2f ms (%+.2f ms)\n", "lm-head", bf16 * 1e3,
              fp8 * 1e3, (fp8 - bf16) * 1e3);
  rows.push_back({{"product", "lm-head"},
                  {"chunks", chunks},
                  {"chunk_rows", Nc},
                  {"logits_bf16_seconds", t_lg},
                  {"logits_fp8_rows_seconds", t_lg8},
                  {"dx_bf16_seconds", t_dx},
                  {"dx_fp8_rows_seconds", t_dx8},
                  {"dx_fp8_rows_fast_seconds", t_dx8f},
                  {"ce_rows_seconds", ce},
                  {"ce_rows_fp8_seconds", ce8},
                  {"w_cast_seconds", cw},
                  {"wt_cast_seconds", cwt}});
  return fp8 - bf16;
}

}  // namespace

void gemm_fp8_cuda(const BenchOptions& o) {
  if (!cuda::available())
    throw Error("forge bench gemm --fp8 needs a CUDA GPU: " + cuda::device_summary());
  cuda::Context ctx(0);
  if (ctx.props().major * 10 + ctx.props().minor < 89)
    throw Error(
        "forge bench gemm --fp8 needs FP8 tensor cores (compute capability 8.9 or newer): " +
        cuda::device_summary());
  const ModelConfig cfg = preset_config(o.preset);
  const int R = o.batch * o.seq_len, C = cfg.n_embd, FF = cfg.ffn_hidden, L = cfg.n_layer,
            HS = cfg.head_dim();
  const int QKV = (cfg.n_head + 2 * cfg.n_kv_head) * HS, ATT = cfg.n_head * HS;
  std::vector<Linear> linears = {{"qkv", C, QKV, L}, {"attn-out", ATT, C, L}};
  if (cfg.family == Family::kGpt2) {
    linears.push_back({"mlp-fc", C, FF, L});
    linears.push_back({"mlp-proj", FF, C, L});
  } else {
    linears.push_back({"mlp-gate|up", C, FF, 2 * L});
    linears.push_back({"mlp-down", FF, C, L});
  }
  std::printf(
      "forge bench gemm --fp8: cuBLASLt, FP8 (e4m3 weights and activations, e5m2 gradients, f32 "
      "accumulate) against bf16\n");
  std::printf(
      "device %s; preset %s, %d x %d = %d rows; TN layout for both dtypes; 'fast': FP8 fast "
      "accumulation\n\n",
      cuda::device_summary().c_str(), o.preset.c_str(), o.batch, o.seq_len, R);
  std::printf("%-22s %6s %6s %6s %9s %8s %9s %8s %9s %6s %9s %9s\n", "product", "M", "N", "K",
              "bf16 us", "TFLOP/s", "fp8 us", "TFLOP/s", "fast us", "x bf16", "rows us",
              "rows best");
  nlohmann::json rows = nlohmann::json::array();
  // Unit scales, each in its own allocation (as the tests pass them: a scale pointer 4 bytes into
  // a buffer is not what cuBLASLt is given anywhere else).
  auto scale = cuda::DeviceBuffer<float>(ctx.allocator(), 1),
       scale_b = cuda::DeviceBuffer<float>(ctx.allocator(), 1);
  const float one = 1.0f;
  FORGE_CUDA_CHECK(cudaMemcpy(scale.data(), &one, sizeof(one), cudaMemcpyHostToDevice));
  FORGE_CUDA_CHECK(cudaMemcpy(scale_b.data(), &one, sizeof(one), cudaMemcpyHostToDevice));
  cuda::DeviceBuffer<float> amax(ctx.allocator(), 1);
  double step_bf16 = 0, step_fp8 = 0, step_casts = 0;
  // FORGE_FP8=rows as the backend runs it (backend_fp8.cpp): a forward product reading a norm's
  // output in FP8 (the norm writes its E4M3 rows: not counted here), another product in FP8 only
  // where its output is at least kFp8MinOutForCast wide (its x cast at the call), each FP8
  // product casting its weight; against the same products in bf16.
  double rows_bf16 = 0, rows_fp8 = 0, rowsdx_fp8 = 0;
  for (const Linear& l : linears) {
    const bool from_norm = l.name == "qkv" || l.name == "mlp-fc" || l.name == "mlp-gate|up";
    // GPT-2's products carry their epilogues (bias; the MLP's GELU aux forward and DGELU dX), as
    // in training: FP8 runs an epilogue cuBLASLt does not fuse as a separate kernel.
    using Ep = cuda::GemmEpilogue;
    const bool gpt2 = cfg.family == Family::kGpt2, dgelu = gpt2 && l.name == "mlp-proj";
    const Ep fwd_ep = !gpt2 ? Ep::kNone : l.name == "mlp-fc" ? Ep::kBiasGeluAux : Ep::kBias;
    // GPT-2's q|k|v and fc take their bias gradients from dY (the projections' are summed in
    // the norm backward): under rows-dx dY's cast takes them in the same read
    // (cast_fp8_rows_bias), and their dX products run in FP8.
    const bool bias_dx = gpt2 && (l.name == "qkv" || l.name == "mlp-fc") &&
                         cuda::cast_fp8_rows_bias_fused(DType::kBF16, l.out);
    const bool fwd_fp8 = from_norm || l.out >= kFp8MinOutForCast,
               dx_fp8 = l.in >= kFp8MinOutForCast && !dgelu,  // backend.cpp: DGELU stays bf16
        dx_fp8_dx = dx_fp8 || (bias_dx && l.in >= kFp8MinOutWithBiasSum && !dgelu);
    double t16_fwd = 0, t16_dx = 0, t8r_fwd = 0, t8r_dx = 0;
    const std::vector<Product> products = {
        {l.name + " fwd", R, l.out, l.in, DType::kF8E4M3, DType::kF8E4M3, DType::kBF16, fwd_ep},
        {l.name + " dX", R, l.in, l.out, DType::kF8E5M2, DType::kF8E4M3, DType::kBF16,
         dgelu ? Ep::kDGelu : Ep::kNone},
        {l.name + " dW", l.out, l.in, R, DType::kF8E5M2, DType::kF8E4M3, DType::kF32, Ep::kNone},
    };
    for (const Product& p : products) {
      const size_t a_n = size_t(p.M) * p.K, b_n = size_t(p.N) * p.K, c_n = size_t(p.M) * p.N;
      cuda::DeviceBuffer<uint16_t> a16(ctx.allocator(), a_n), b16(ctx.allocator(), b_n);
      cuda::DeviceBuffer<uint8_t> a8(ctx.allocator(), a_n), b8(ctx.allocator(), b_n);
      cuda::DeviceBuffer<float> c(ctx.allocator(), c_n);  // room for f32
      fill_random_bf16(ctx, a16.data(), a_n, 1);
      fill_random_bf16(ctx, b16.data(), b_n, 2, 0.05f);
      FORGE_CUDA_CHECK(cudaMemsetAsync(c.data(), 0, c_n * 4, ctx.stream()));
      cuda::cast_fp8(ctx, p.a, a8.data(), DType::kBF16, a16.data(), static_cast<int64_t>(a_n),
                     scale.data(), nullptr);
      cuda::cast_fp8(ctx, p.b, b8.data(), DType::kBF16, b16.data(), static_cast<int64_t>(b_n),
                     scale.data(), nullptr);
      cuda::GemmArgs g;
      g.M = p.M, g.N = p.N, g.K = p.K, g.trans_b = true;
      g.ab_type = DType::kBF16, g.c_type = p.c == DType::kF32 ? DType::kF32 : DType::kBF16;
      g.beta = p.c == DType::kF32 ? 1.0f : 0.0f;
      cuda::DeviceBuffer<uint16_t> bias(ctx.allocator(), p.ep == Ep::kNone ? 1 : p.N),
          aux(ctx.allocator(), p.ep == Ep::kBiasGeluAux || p.ep == Ep::kDGelu ? c_n : 1);
      if (p.ep != Ep::kNone) {
        fill_random_bf16(ctx, bias.data(), bias.size(), 3, 0.05f);
        fill_random_bf16(ctx, aux.data(), aux.size(), 4);
        g.epilogue = p.ep, g.bias = p.ep == Ep::kDGelu ? nullptr : bias.data();
        g.aux = p.ep == Ep::kBiasGeluAux || p.ep == Ep::kDGelu ? aux.data() : nullptr;
      }
      const double t16 =
          time_op(ctx, [&] { cuda::gemm(ctx, g, a16.data(), b16.data(), c.data()); });
      cuda::GemmArgs g8 = g;
      g8.ab_type = p.a, g8.b_type = p.b, g8.a_scale = scale.data(), g8.b_scale = scale_b.data();
      const double t8 = time_op(ctx, [&] { cuda::gemm(ctx, g8, a8.data(), b8.data(), c.data()); });
      g8.fast_accum = true;
      const double t8f = time_op(ctx, [&] { cuda::gemm(ctx, g8, a8.data(), b8.data(), c.data()); });
      double t8r = 0, t8r_best = 0;  // row scales (all ones), fast accumulation: the rows
                                     // recipe's fwd and dX; the heuristic's first, the fastest
      if (p.c != DType::kF32) {
        cuda::DeviceBuffer<float> ra(ctx.allocator(), p.M), rb(ctx.allocator(), p.N);
        const std::vector<float> ones(std::max(p.M, p.N), 1.0f);
        FORGE_CUDA_CHECK(
            cudaMemcpy(ra.data(), ones.data(), p.M * sizeof(float), cudaMemcpyHostToDevice));
        FORGE_CUDA_CHECK(
            cudaMemcpy(rb.data(), ones.data(), p.N * sizeof(float), cudaMemcpyHostToDevice));
        cuda::GemmArgs gr = g8;
        gr.ab_type = DType::kF8E4M3, gr.a_scale = ra.data(), gr.b_scale = rb.data(),
        gr.row_scales = true;
        t8r = time_op(ctx, [&] { cuda::gemm(ctx, gr, a8.data(), b8.data(), c.data()); });
        t8r_best = t8r;
        const int n = cuda::gemm_candidates(ctx, gr, a8.data(), b8.data(), c.data());
        for (int k = 1; k < n; ++k) {
          cuda::GemmArgs gk = gr;
          gk.candidate = k;
          t8r_best = std::min(
              t8r_best, time_op(ctx, [&] { cuda::gemm(ctx, gk, a8.data(), b8.data(), c.data()); }));
        }
        (&p == &products[0] ? t16_fwd : t16_dx) = t16;
        (&p == &products[0] ? t8r_fwd : t8r_dx) = t8r;
      }
      const double flop = 2.0 * p.M * p.N * p.K;
      const std::string what = p.what + (p.ep == Ep::kBias          ? " +bias"
                                         : p.ep == Ep::kBiasGeluAux ? " +gelu"
                                         : p.ep == Ep::kDGelu       ? " +dgelu"
                                                                    : "");
      std::printf("%-22s %6d %6d %6d %9.1f %8.1f %9.1f %8.1f %9.1f %6.2f %9.1f %9.1f\n",
                  what.c_str(), p.M, p.N, p.K, t16 * 1e6, flop / t16 / 1e12, t8 * 1e6,
                  flop / t8 / 1e12, t8f * 1e6, t16 / t8, t8r * 1e6, t8r_best * 1e6);
      rows.push_back({{"product", p.what},
                      {"M", p.M},
                      {"N", p.N},
                      {"K", p.K},
                      {"calls_per_step", l.calls},
                      {"bf16_seconds", t16},
                      {"fp8_seconds", t8},
                      {"fp8_fast_seconds", t8f},
                      {"fp8_rows_seconds", t8r},
                      {"fp8_rows_best_seconds", t8r_best}});
      step_bf16 += t16 * l.calls;
      step_fp8 +=
          (p.c == DType::kF32 ? t8 : t8f) * l.calls;  // fast accumulation for fwd and dX only
    }
    // The casts this layer adds a step: X and dY to fp8 (fwd, dX), both transposed (dW).
    cuda::DeviceBuffer<uint16_t> x16(ctx.allocator(), size_t(R) * l.in),
        dy16(ctx.allocator(), size_t(R) * l.out);
    cuda::DeviceBuffer<uint8_t> x8(ctx.allocator(), size_t(R) * l.in),
        dy8(ctx.allocator(), size_t(R) * l.out);
    fill_random_bf16(ctx, x16.data(), size_t(R) * l.in, 5);
    fill_random_bf16(ctx, dy16.data(), size_t(R) * l.out, 6);
    const double cx = time_op(ctx, [&] {
      cuda::cast_fp8(ctx, DType::kF8E4M3, x8.data(), DType::kBF16, x16.data(), int64_t(R) * l.in,
                     scale.data(), amax.data());
    });
    const double cdy = time_op(ctx, [&] {
      cuda::cast_fp8(ctx, DType::kF8E5M2, dy8.data(), DType::kBF16, dy16.data(), int64_t(R) * l.out,
                     scale.data(), amax.data());
    });
    const double tx = time_op(ctx, [&] {
      cuda::cast_transpose_fp8(ctx, DType::kF8E4M3, x8.data(), DType::kBF16, x16.data(), R, l.in,
                               scale.data(), amax.data());
    });
    const double tdy = time_op(ctx, [&] {
      cuda::cast_transpose_fp8(ctx, DType::kF8E5M2, dy8.data(), DType::kBF16, dy16.data(), R, l.out,
                               scale.data(), amax.data());
    });
    std::printf("%-22s casts: X %.1f us, dY %.1f us, X^T %.1f us, dY^T %.1f us (%.1f GB/s for X)\n",
                l.name.c_str(), cx * 1e6, cdy * 1e6, tx * 1e6, tdy * 1e6,
                3.0 * R * l.in / cx / 1e9);
    // The rows recipe's casts of this layer a call: X and dY rows, the weight's rows and its
    // transposed rows (backend_fp8.cpp casts both operands at every call).
    cuda::DeviceBuffer<float> dsc(ctx.allocator(), std::max<size_t>(R, std::max(l.in, l.out)));
    cuda::DeviceBuffer<uint16_t> w16(ctx.allocator(), size_t(l.out) * l.in);
    cuda::DeviceBuffer<uint8_t> w8(ctx.allocator(), size_t(l.out) * l.in);
    fill_random_bf16(ctx, w16.data(), size_t(l.out) * l.in, 7, 0.05f);
    const double rx = time_op(ctx, [&] {
      cuda::cast_fp8_rows(ctx, DType::kF8E4M3, x8.data(), dsc.data(), DType::kBF16, x16.data(), R,
                          l.in);
    });
    const double rdy = time_op(ctx, [&] {
      cuda::cast_fp8_rows(ctx, DType::kF8E4M3, dy8.data(), dsc.data(), DType::kBF16, dy16.data(), R,
                          l.out);
    });
    const double rw = time_op(ctx, [&] {
      cuda::cast_fp8_rows(ctx, DType::kF8E4M3, w8.data(), dsc.data(), DType::kBF16, w16.data(),
                          l.out, l.in);
    });
    const double rwt = time_op(ctx, [&] {
      cuda::cast_transpose_fp8_rows(ctx, DType::kF8E4M3, w8.data(), dsc.data(), DType::kBF16,
                                    w16.data(), l.out, l.in);
    });
    std::printf(
        "%-22s row casts: X %.1f us, dY %.1f us, W %.1f us, W^T %.1f us (%.1f GB/s for X)\n",
        l.name.c_str(), rx * 1e6, rdy * 1e6, rw * 1e6, rwt * 1e6, 3.0 * R * l.in / rx / 1e9);
    double bg = 0, rdyb = 0;  // the bias gradient's pass; dY's row cast with the sums
    if (bias_dx) {
      cuda::DeviceBuffer<float> db(ctx.allocator(), l.out);
      FORGE_CUDA_CHECK(cudaMemsetAsync(db.data(), 0, db.bytes(), ctx.stream()));
      bg = time_op(ctx, [&] { cuda::bias_grad(ctx, DType::kBF16, db.data(), dy16.data(), R, l.out); });
      rdyb = time_op(ctx, [&] {
        cuda::cast_fp8_rows_bias(ctx, DType::kF8E4M3, dy8.data(), dsc.data(), db.data(),
                                 DType::kBF16, dy16.data(), R, l.out);
      });
      std::printf(
          "%-22s bias gradient: bias_grad pass %.1f us; dY row cast + pass %.1f us; the cast with "
          "the sums %.1f us (%.1f GB/s)\n",
          l.name.c_str(), bg * 1e6, (rdy + bg) * 1e6, rdyb * 1e6, 3.0 * R * l.out / rdyb / 1e9);
    }
    rows_bf16 += (t16_fwd + t16_dx + bg) * l.calls;
    const double fwd = fwd_fp8 ? t8r_fwd + (from_norm ? 0.0 : rx) + rw : t16_fwd;
    rows_fp8 += (fwd + (dx_fp8 ? t8r_dx + rdy + rwt + bg : t16_dx + bg)) * l.calls;
    rowsdx_fp8 += (fwd + (dx_fp8_dx ? t8r_dx + (bias_dx ? rdyb : rdy + bg) + rwt : t16_dx + bg)) *
                  l.calls;
    std::printf("%-22s FORGE_FP8=rows runs: fwd %s, dX %s; rows-dx: dX %s\n", l.name.c_str(),
                fwd_fp8 ? (from_norm ? "FP8 (rows from the norm)" : "FP8 (x cast)") : "bf16",
                dx_fp8 ? "FP8 (dY cast)" : "bf16",
                dx_fp8_dx ? (bias_dx ? "FP8 (dY cast with the bias sums)" : "FP8 (dY cast)")
                          : "bf16");
    rows.push_back({{"casts", l.name},
                    {"bias_grad_seconds", bg},
                    {"dy_rows_bias_seconds", rdyb},
                    {"x_seconds", cx},
                    {"dy_seconds", cdy},
                    {"xt_seconds", tx},
                    {"dyt_seconds", tdy},
                    {"calls_per_step", l.calls}});
    step_casts += (cx + cdy + tx + tdy) * l.calls;
  }
  std::printf(
      "\none step's linear layers: bf16 %.2f ms; FP8 %.2f ms of products (fast accumulation in fwd "
      "and "
      "dX) + %.2f ms of casts = %.2f ms (%+.2f ms a step).\n",
      step_bf16 * 1e3, step_fp8 * 1e3, step_casts * 1e3, (step_fp8 + step_casts) * 1e3,
      (step_fp8 + step_casts - step_bf16) * 1e3);
  std::printf("Not counted: the weights' casts (once a step, small), amax bookkeeping.\n");
  std::printf(
      "FORGE_FP8=rows (fwd and dX products, casts and GPT-2's q|k|v and fc bias gradients "
      "included; the norms' extra E4M3 writes not): bf16 %.2f ms, rows %.2f ms (%+.2f ms a "
      "step), rows-dx %.2f ms (%+.2f ms).\n",
      rows_bf16 * 1e3, rows_fp8 * 1e3, (rows_fp8 - rows_bf16) * 1e3, rowsdx_fp8 * 1e3,
      (rowsdx_fp8 - rows_bf16) * 1e3);
  const double head = lm_head_fp8(ctx, R, C, cfg.vocab_size, cfg.padded_vocab(), rows);
  std::printf("FORGE_FP8=rows with the LM head: %+.2f ms a step against bf16; rows-dx %+.2f ms.\n",
              (rows_fp8 - rows_bf16 + head) * 1e3, (rowsdx_fp8 - rows_bf16 + head) * 1e3);
  if (!o.json_out.empty())
    std::ofstream(o.json_out) << nlohmann::json{{"bench", "gemm-fp8"}, {"rows", rows}}.dump(2)
                              << "\n";
}

}  // namespace forge::bench
