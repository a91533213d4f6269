// forge bench gemm --bias-grads: the bias gradients of one training step that are separate passes
// today, two ways (GPT-2's qkv and fc; Qwen2's v with --set variant=qwen2 or qkv_bias=true):
//   pass      — what CudaBackend runs today: the weight-gradient product (f32, beta 1), then
//               bias_grad, a separate read of dout (N × OC);
//   epilogue  — the same product with cuBLASLt's bias-gradient epilogue (BGRADA / BGRADB: the sum
//               over the product's k of dout, written to an f32 vector) and, because that vector is
//               written rather than accumulated, an add of it into dbias;
// and for GPT-2's MLP, the fc bias taken from the proj layer's dX + DGELU product
// (DGELU_BGRAD) against the DGELU product then bias_grad over its output. Timing as bench gemm
// (bench/cuda_timing.h); random bf16 operands.
#include <cuda_runtime.h>

#include <cstdio>

#include "bench.h"
#include "cuda_timing.h"
#include "forge/backend/cuda/check.h"
#include "forge/backend/cuda/context.h"
#include "forge/backend/cuda/gemm.h"
#include "forge/backend/cuda/ops.h"
#include "forge/backend/cuda/runtime.h"
#include "forge/core/error.h"
#include "forge/model/config.h"

namespace forge::bench {

namespace {

struct Linear {
  std::string name;
  int C, OC;
  bool in_out;  // W stored (C, OC): GPT-2's layout
  int calls;    // a step
};

struct Times {
  double product, pass, with_epilogue;  // seconds a call
};

// dW (+)= the product of dout (N, OC) and inp (N, C) as CudaBackend::weight_grads runs it, and the
// two ways to its bias gradient.
Times time_weight_grad(cuda::Context& ctx, int N, const Linear& l) {
  const size_t in_n = static_cast<size_t>(N) * l.C, out_n = static_cast<size_t>(N) * l.OC,
               w_n = static_cast<size_t>(l.C) * l.OC;
  cuda::DeviceBuffer<uint16_t> inp(ctx.allocator(), in_n), dout(ctx.allocator(), out_n);
  cuda::DeviceBuffer<float> dw(ctx.allocator(), w_n), db(ctx.allocator(), l.OC), tmp(ctx.allocator(), l.OC);
  fill_random_bf16(ctx, inp.data(), in_n, 1);
  fill_random_bf16(ctx, dout.data(), out_n, 2, 0.05f);
  FORGE_CUDA_CHECK(cudaMemsetAsync(dw.data(), 0, w_n * 4, ctx.stream()));
  FORGE_CUDA_CHECK(cudaMemsetAsync(db.data(), 0, l.OC * 4, ctx.stream()));
  cuda::GemmArgs g;
  g.trans_a = true, g.beta = 1.0f, g.ab_type = DType::kBF16, g.c_type = DType::kF32, g.K = N;
  const void *a = dout.data(), *b = inp.data();
  if (l.in_out) {
    g.M = l.C, g.N = l.OC;  // dW (C, OC) += inpᵀ · dout
    a = inp.data(), b = dout.data();
  } else {
    g.M = l.OC, g.N = l.C;  // dW (OC, C) += doutᵀ · inp
  }
  Times t{};
  t.product = time_op(ctx, [&] { cuda::gemm(ctx, g, a, b, dw.data()); });
  t.pass = time_op(ctx, [&] { cuda::bias_grad(ctx, DType::kBF16, db.data(), dout.data(), N, l.OC); });
  cuda::GemmArgs e = g;
  e.epilogue = l.in_out ? cuda::GemmEpilogue::kBiasGradB : cuda::GemmEpilogue::kBiasGradA;
  e.dbias = tmp.data();
  t.with_epilogue = time_op(ctx, [&] {
    cuda::gemm(ctx, e, a, b, dw.data());
    cuda::add_inplace(ctx, DType::kF32, db.data(), tmp.data(), l.OC);
  });
  return t;
}

// GPT-2's proj backward: dfc (N, FF) = (dout (N, C) · W (FF, C)ᵀ) ∘ gelu'(fc), then the fc layer's
// bias gradient Σ_n dfc.
Times time_dgelu(cuda::Context& ctx, int N, int C, int FF) {
  const size_t out_n = static_cast<size_t>(N) * C, fc_n = static_cast<size_t>(N) * FF;
  cuda::DeviceBuffer<uint16_t> dout(ctx.allocator(), out_n), w(ctx.allocator(), static_cast<size_t>(FF) * C),
      fc(ctx.allocator(), fc_n), dfc(ctx.allocator(), fc_n);
  cuda::DeviceBuffer<float> db(ctx.allocator(), FF), tmp(ctx.allocator(), FF);
  fill_random_bf16(ctx, dout.data(), out_n, 3, 0.05f);
  fill_random_bf16(ctx, w.data(), static_cast<size_t>(FF) * C, 4, 0.05f);
  fill_random_bf16(ctx, fc.data(), fc_n, 5);
  FORGE_CUDA_CHECK(cudaMemsetAsync(db.data(), 0, FF * 4, ctx.stream()));
  cuda::GemmArgs g;
  g.M = N, g.N = FF, g.K = C, g.trans_b = true;  // W stored (FF, C) (in_out): dX = dout · Wᵀ
  g.ab_type = g.c_type = DType::kBF16;
  g.epilogue = cuda::GemmEpilogue::kDGelu, g.aux = fc.data();
  Times t{};
  t.product = time_op(ctx, [&] { cuda::gemm(ctx, g, dout.data(), w.data(), dfc.data()); });
  t.pass = time_op(ctx, [&] { cuda::bias_grad(ctx, DType::kBF16, db.data(), dfc.data(), N, FF); });
  cuda::GemmArgs e = g;
  e.epilogue = cuda::GemmEpilogue::kDGeluBiasGrad, e.dbias = tmp.data();
  t.with_epilogue = time_op(ctx, [&] {
    cuda::gemm(ctx, e, dout.data(), w.data(), dfc.data());
    cuda::add_inplace(ctx, DType::kF32, db.data(), tmp.data(), FF);
  });
  return t;
}

void print_row(const std::string& what, int calls, const Times& t, double* pass_ms, double* epi_ms,
               bool summed = true) {
  const double before = t.product + t.pass, after = t.with_epilogue;
  std::printf("%-22s %5d %10.1f %10.1f %12.1f %12.1f %8.3f\n", what.c_str(), calls, t.product * 1e6, t.pass * 1e6,
              after * 1e6, (after - t.product) * 1e6, (before - after) * 1e3 * calls);
  if (!summed) return;
  *pass_ms += before * 1e3 * calls;
  *epi_ms += after * 1e3 * calls;
}

}  // namespace

void gemm_bias_grad_cuda(const BenchOptions& o) {
  if (!cuda::available()) throw Error("forge bench gemm needs a CUDA GPU: " + cuda::device_summary());
  ModelConfig cfg = preset_config(o.preset);
  std::string shape = o.preset;
  for (const auto& [key, value] : o.overrides) {
    if (!apply_model_override(cfg, key, value)) throw Error("--set: unknown model setting '" + key + "'");
    shape += " " + key + "=" + value;
  }
  cfg.validate();
  const bool gpt2 = cfg.family == Family::kGpt2;
  const int N = o.batch * o.seq_len, C = cfg.n_embd, L = cfg.n_layer, HS = cfg.head_dim();
  // Only products whose bias gradient is a bias_grad pass today: the attention and MLP output
  // biases are summed by the norm backward below them (dres, layernorm.cu / rmsnorm.cu), and the
  // Llama family takes q's and k's bias sums from the RoPE backward (rope_bias_bwd), leaving v's.
  if (!gpt2 && !cfg.qkv_bias) throw Error("bench gemm --bias-grads: preset " + shape + " has no bias_grad pass to replace");
  const Linear qkv = gpt2 ? Linear{"qkv", C, (cfg.n_head + 2 * cfg.n_kv_head) * HS, true, L}
                          : Linear{"v", C, cfg.n_kv_head * HS, false, L};
  cuda::Context ctx(0);
  std::printf("forge bench gemm --bias-grads: a step's bias gradients as a separate pass over dout vs in the\n"
              "product's cuBLASLt epilogue (+ an add of the written f32 vector); bf16 operands, f32 dW (beta 1)\n");
  std::printf("device %s; %s, %d x %d = %d rows\n\n", cuda::device_summary().c_str(), shape.c_str(), o.batch,
              o.seq_len, N);
  std::printf("%-22s %5s %10s %10s %12s %12s %8s\n", "product", "calls", "product us", "pass us", "epilogue us",
              "epi. cost us", "ms saved");
  double pass_ms = 0, epi_ms = 0;
  print_row(qkv.name + " dW", L, time_weight_grad(ctx, N, qkv), &pass_ms, &epi_ms);
  if (gpt2) {  // the fc bias: from its own dW product, or from the proj's dX + DGELU product
    print_row("mlp-fc dW (not summed)", L, time_weight_grad(ctx, N, {"mlp-fc", C, cfg.ffn_hidden, true, L}), &pass_ms,
              &epi_ms, false);
    print_row("mlp-proj dX+dGELU", L, time_dgelu(ctx, N, C, cfg.ffn_hidden), &pass_ms, &epi_ms);
  }
  std::printf("\n'epi. cost': the epilogue product + add minus the plain product; 'ms saved': a step's calls of\n"
              "(product + pass) - (epilogue product + add). The fc bias needs one of its two rows (its dW or\n"
              "the proj's dX + DGELU); the sums take the DGELU one: passes %.2f ms a step, epilogues %.2f ms.\n",
              pass_ms, epi_ms);
}

}  // namespace forge::bench
