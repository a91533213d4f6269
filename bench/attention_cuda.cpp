// forge bench attention: flash attention forward and backward (bf16; q, k, v, out dense
// (B, T, H, D) with NKV = H) on the shapes of ANCHORS.md's attention table, beside PyTorch
// 2.11's flash and cuDNN figures for the same shapes on the same GPU model.
//
// FLOPs, ANCHORS.md's formula so the columns compare directly: forward 4·B·H·T²·D (QKᵀ and
// PV), backward 2.5× the forward, both halved when causal. Timing: CUDA events recorded between
// back-to-back calls on the context's stream after warm-up calls, median over --iters; the
// backward is one call (its preprocess D = rowsum(dO∘O) included). Inputs are normal(0, 1),
// never zeros. The unfused v1 kernels (batched GEMMs + softmax, materialising the B·H·T²
// probabilities: 805 MB at 8·12·2048) are timed on the 8·12·2048·64 shape for comparison.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "bench.h"
#include "forge/backend/cuda/check.h"
#include "forge/backend/cuda/context.h"
#include "forge/backend/cuda/ops.h"
#include "forge/backend/cuda/runtime.h"
#include "forge/core/error.h"
#include "forge/core/rng.h"
#include "forge/io/bf16.h"

namespace forge::bench {

namespace {

// shared/ANCHORS.md, "Attention": PyTorch 2.11 scaled_dot_product_attention, bf16, TFLOP/s
// with the formula above, measured on the same GPU model (not in this run).
struct Anchor {
  int B, H, T, D;
  bool causal;
  double flash_fwd, flash_bwd, cudnn_fwd, cudnn_bwd;
};
constexpr Anchor kAnchors[] = {
    {4, 16, 4096, 128, true, 306, 257, 527, 444}, {4, 16, 4096, 128, false, 341, 289, 598, 509},
    {8, 12, 2048, 64, true, 232, 186, 358, 305},  {8, 12, 2048, 64, false, 290, 244, 438, 396},
    {2, 32, 8192, 128, true, 328, 287, 567, 490}, {2, 32, 8192, 128, false, 341, 302, 602, 522},
};
constexpr std::array<int, 4> kUnfusedShape = {8, 12, 2048, 64};

const Anchor* find_anchor(const std::array<int, 4>& s, bool causal) {
  for (const Anchor& a : kAnchors)
    if (a.B == s[0] && a.H == s[1] && a.T == s[2] && a.D == s[3] && a.causal == causal) return &a;
  return nullptr;
}

// n normal(0, 1) values rounded to bf16, generated on the host in parallel (counter-based, so
// the values do not depend on the thread count).
cuda::DeviceBuffer<uint16_t> random_bf16(cuda::Context& ctx, size_t n, uint64_t seed) {
  std::vector<uint16_t> h(n);
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) h[i] = f32_to_bf16(philox_normal(seed, 3, i));
  cuda::DeviceBuffer<uint16_t> d(ctx.allocator(), n);
  FORGE_CUDA_CHECK(
      cudaMemcpyAsync(d.data(), h.data(), n * 2, cudaMemcpyHostToDevice, ctx.stream()));
  ctx.synchronize();  // the pageable copy must land before h goes
  return d;
}

// Median milliseconds of one call of f: `warmup` untimed calls, then `iters` calls back to back
// with an event between consecutive ones.
template <typename F>
double median_ms(cuda::Context& ctx, int warmup, int iters, F&& f) {
  for (int i = 0; i < warmup; ++i) f();
  std::vector<cudaEvent_t> ev(iters + 1);
  for (auto& e : ev) FORGE_CUDA_CHECK(cudaEventCreate(&e));
  FORGE_CUDA_CHECK(cudaEventRecord(ev[0], ctx.stream()));
  for (int i = 0; i < iters; ++i) {
    f();
    FORGE_CUDA_CHECK(cudaEventRecord(ev[i + 1], ctx.stream()));
  }
  FORGE_CUDA_CHECK(cudaEventSynchronize(ev[iters]));
  std::vector<float> ms(iters);
  for (int i = 0; i < iters; ++i) FORGE_CUDA_CHECK(cudaEventElapsedTime(&ms[i], ev[i], ev[i + 1]));
  for (auto& e : ev) cudaEventDestroy(e);
  std::sort(ms.begin(), ms.end());
  return ms[iters / 2];
}

struct Row {
  std::string kernel;  // "flash wgmma", "wgmma split" (two backward kernels), "flash mma", "unfused (v1)"
  std::array<int, 4> shape;
  bool causal;
  double fwd_ms, bwd_ms;
};

// Forward FLOPs of ANCHORS.md: 4·B·H·T²·D, halved when causal.
double fwd_flops(const std::array<int, 4>& s, bool causal) {
  const double f = 4.0 * s[0] * s[1] * static_cast<double>(s[2]) * s[2] * s[3];
  return causal ? f / 2 : f;
}

std::string shape_name(const std::array<int, 4>& s) {
  return str(s[0], "x", s[1], "x", s[2], "x", s[3]);
}

// Times flash (and, on the unfused comparison shape, v1) for each causal setting.
void measure_shape(cuda::Context& ctx, const AttentionBenchOptions& o,
                   const std::array<int, 4>& shape, const std::vector<bool>& causals,
                   std::vector<Row>& rows) {
  const auto [B, H, T, D] = shape;
  const DType dt = DType::kBF16;
  const size_t n = static_cast<size_t>(B) * T * H * D, nrow = static_cast<size_t>(B) * H * T;
  auto q = random_bf16(ctx, n, 1), k = random_bf16(ctx, n, 2), v = random_bf16(ctx, n, 3),
       dout = random_bf16(ctx, n, 4);
  cuda::DeviceBuffer<uint16_t> out(ctx.allocator(), n), dq(ctx.allocator(), n),
      dk(ctx.allocator(), n), dv(ctx.allocator(), n);
  cuda::DeviceBuffer<float> lse(ctx.allocator(), nrow), delta(ctx.allocator(), nrow);
  // Both kernel families where the device runs wgmma (Hopper), mma.sync alone elsewhere.
  std::vector<std::pair<cuda::FlashKernels, const char*>> families;
  if (ctx.props().major == 9) {
    families.push_back({cuda::FlashKernels::kWgmma, "flash wgmma"});
    // The same forward; head size 64's backward as two kernels (dQ; dK, dV) instead of one.
    if (D == 64) families.push_back({cuda::FlashKernels::kWgmmaSplit, "wgmma split"});
  }
  families.push_back({cuda::FlashKernels::kMma, "flash mma"});
  for (const bool causal : causals)
    for (const auto& [kernels, name] : families) {
      const AttentionShape s{B, T, H, H, D, causal, 0};
      auto fwd = [&] {
        cuda::flash_attention_fwd(ctx, dt, out.data(), lse.data(), q.data(), k.data(), v.data(), s,
                                  {}, kernels);
      };
      auto bwd = [&] {
        cuda::flash_attention_bwd(ctx, dt, dq.data(), dk.data(), dv.data(), dout.data(), q.data(),
                                  k.data(), v.data(), out.data(), lse.data(), delta.data(), s, {},
                                  kernels);
      };
      const double fwd_ms = median_ms(ctx, o.warmup, o.iters, fwd);  // leaves out/lse for bwd
      rows.push_back({name, shape, causal, fwd_ms, median_ms(ctx, o.warmup, o.iters, bwd)});
    }
  if (shape != kUnfusedShape) return;
  cuda::DeviceBuffer<uint16_t> att(ctx.allocator(), nrow * T);  // (B, H, T, T)
  for (const bool causal : causals) {
    const AttentionShape s{B, T, H, H, D, causal, 0};
    auto fwd = [&] {
      cuda::attention_fwd(ctx, dt, out.data(), att.data(), q.data(), k.data(), v.data(), s);
    };
    // Accumulates into dq/dk/dv (v1's contract); the values do not matter to the timing.
    auto bwd = [&] {
      cuda::attention_bwd(ctx, dt, dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(),
                          v.data(), att.data(), s);
    };
    const double fwd_ms = median_ms(ctx, o.warmup, o.iters, fwd);  // leaves att for bwd
    rows.push_back({"unfused (v1)", shape, causal, fwd_ms, median_ms(ctx, o.warmup, o.iters, bwd)});
  }
}

}  // namespace

void attention_cuda(const AttentionBenchOptions& o) {
  std::vector<std::array<int, 4>> shapes = o.shapes;
  if (shapes.empty())
    for (const Anchor& a : kAnchors)
      if (a.causal) shapes.push_back({a.B, a.H, a.T, a.D});
  for (const auto& s : shapes)
    if (!cuda::flash_attention_supported(DType::kBF16, s[3]))
      throw Error(str("bench attention: head size D=", s[3], " in ", shape_name(s),
                      " is not supported by flash attention (64 or 128)"));
  if (!cuda::available())
    throw Error("forge bench attention needs a CUDA GPU: " + cuda::device_summary());
  std::vector<bool> causals;
  if (o.causal != "no") causals.push_back(true);
  if (o.causal != "yes") causals.push_back(false);

  cuda::Context ctx(0);
  std::vector<Row> rows;
  for (const auto& s : shapes) measure_shape(ctx, o, s, causals, rows);

  std::printf("forge bench attention: bf16, q/k/v/out dense (B, T, H, D), NKV = H; device %s\n",
              cuda::device_summary().c_str());
  std::printf(
      "FLOPs (every row): forward 4*B*H*T^2*D, backward 2.5x the forward, both halved "
      "when causal.\n");
  std::printf(
      "Times: median of %d calls after %d warm-up (CUDA events); bwd includes its "
      "preprocess.\n",
      o.iters, o.warmup);
  std::printf(
      "torch columns: PyTorch 2.11 scaled_dot_product_attention (flash / cuDNN backend),\n"
      "TFLOP/s fwd / bwd on the same GPU model (shared/ANCHORS.md, not this run).\n\n");
  std::printf("%-13s %-14s %-6s | %8s %8s | %8s %8s | %-11s | %-11s\n", "kernel", "B.H.T.D",
              "causal", "fwd ms", "TFLOP/s", "bwd ms", "TFLOP/s", "torch flash", "torch cuDNN");
  nlohmann::json jrows = nlohmann::json::array();
  for (const Row& r : rows) {
    const double ff = fwd_flops(r.shape, r.causal), bf = 2.5 * ff;
    const double fwd_tf = ff / (r.fwd_ms * 1e-3) / 1e12, bwd_tf = bf / (r.bwd_ms * 1e-3) / 1e12;
    const Anchor* a = r.kernel.rfind("flash", 0) == 0 ? find_anchor(r.shape, r.causal) : nullptr;
    const std::string flash = a ? str(a->flash_fwd, " / ", a->flash_bwd) : "-";
    const std::string cudnn = a ? str(a->cudnn_fwd, " / ", a->cudnn_bwd) : "-";
    std::printf("%-13s %-14s %-6s | %8.3f %8.1f | %8.3f %8.1f | %-11s | %-11s\n", r.kernel.c_str(),
                shape_name(r.shape).c_str(), r.causal ? "yes" : "no", r.fwd_ms, fwd_tf, r.bwd_ms,
                bwd_tf, flash.c_str(), cudnn.c_str());
    nlohmann::json j = {{"kernel", r.kernel},  {"B", r.shape[0]},      {"H", r.shape[1]},
                        {"T", r.shape[2]},     {"D", r.shape[3]},      {"causal", r.causal},
                        {"fwd_ms", r.fwd_ms},  {"fwd_tflops", fwd_tf}, {"bwd_ms", r.bwd_ms},
                        {"bwd_tflops", bwd_tf}};
    if (a)
      j["reference_tflops"] = {{"torch_flash_fwd", a->flash_fwd},
                               {"torch_flash_bwd", a->flash_bwd},
                               {"torch_cudnn_fwd", a->cudnn_fwd},
                               {"torch_cudnn_bwd", a->cudnn_bwd}};
    jrows.push_back(j);
  }
  if (!o.json_out.empty()) {
    std::ofstream f(o.json_out);
    if (!f) throw Error(str(o.json_out, ": cannot write"));
    f << nlohmann::json{{"bench", "attention"}, {"dtype", "bf16"}, {"rows", jrows}}.dump(2) << "\n";
  }
}

}  // namespace forge::bench
