// The CUDA op set: the GPU twin of every CPU op in ops/*.h, same contracts and shapes, on the
// Context's stream. Nothing here includes CUDA headers, so the model and tests can declare
// against it freely; the definitions exist only when Forge is built with CUDA.
//
// Conventions (all ops):
//  - `dt` is the dtype of activations and of the working copy of the weights: kF32 (fp32 mode,
//    the parity reference) or kBF16. Pointers typed void* hold `dt` elements; float* are always
//    f32 (norm statistics, weight gradients, master weights, optimizer state).
//  - Every *_bwd ACCUMULATES (+=) into its gradient outputs, exactly like the CPU ops; weight
//    gradients are f32.
//  - No unordered floating-point atomics: parameter-gradient reductions over rows go through a
//    scratch buffer of per-block partials and a second pass in fixed order, so two runs are
//    bit-identical. The one place blocks add into the same f32 sums, the attention backward's
//    dQ at head size 64 on Hopper, adds at L2 in a fixed key-tile order that counters enforce
//    (flash_attention_bwd_wgmma.cu): the same bits on every run.
//  - Memory-bound kernels use 16-byte vector loads/stores where the row length allows.
#pragma once

#include <cstdint>

#include "forge/core/dtype.h"
#include "forge/ops/adamw.h"
#include "forge/ops/loss_scale.h"
#include "forge/ops/attention.h"
#include "forge/ops/rope.h"
#include "forge/ops/step_guard.h"

struct CUstream_st;  // cudaStream_t is CUstream_st* (this header stays free of the CUDA headers)

namespace forge::cuda {

class Context;

// ---- conversions and elementwise ------------------------------------------------------------
// dst = src converted (f32 <-> bf16, or a copy when the types agree); round to nearest even.
void convert(Context& ctx, DType dst_t, void* dst, DType src_t, const void* src, int64_t n);
// out = a + b (out may alias a or b).
void residual_fwd(Context& ctx, DType dt, void* out, const void* a, const void* b, int64_t n);
// dst += src.
void add_inplace(Context& ctx, DType dt, void* dst, const void* src, int64_t n);
void gelu_fwd(Context& ctx, DType dt, void* out, const void* inp, int64_t n);
void gelu_bwd(Context& ctx, DType dt, void* dinp, const void* inp, const void* dout, int64_t n);
void swiglu_fwd(Context& ctx, DType dt, void* out, const void* gate, const void* up, int64_t n);
void swiglu_bwd(Context& ctx, DType dt, void* dgate, void* dup, const void* dout, const void* gate,
                const void* up, int64_t n);
// The same over rows of ff elements whose gate, up, dgate, dup rows lie ld elements apart (out, dout
// dense (rows, ff)): the halves of a fused gate|up product. Twins: cpu::swiglu_fwd_rows / _bwd_rows.
void swiglu_fwd_rows(Context& ctx, DType dt, void* out, const void* gate, const void* up, int64_t rows, int ff,
                     int64_t ld);
void swiglu_bwd_rows(Context& ctx, DType dt, void* dgate, void* dup, const void* dout, const void* gate,
                     const void* up, int64_t rows, int ff, int64_t ld);

// ---- FP8 GEMM operands (twins: cpu::cast_fp8, cpu::cast_transpose_fp8, ops/fp8.h) --------------
// y (n) = fp8(x · *scale) in y_t (kF8E4M3 or kF8E5M2), x of x_t (f32, bf16 or f16); *amax (when
// given; zeroed first) = max |x|. scale and amax are device floats.
void cast_fp8(Context& ctx, DType y_t, uint8_t* y, DType x_t, const void* x, int64_t n,
              const float* scale, float* amax);
// y (cols, rows) = fp8(xᵀ · *scale) for x (rows, cols): the transposed operand of a TN GEMM
// (gemm.h). rows must be a multiple of 16 and y 16-byte aligned.
void cast_transpose_fp8(Context& ctx, DType y_t, uint8_t* y, DType x_t, const void* x, int rows, int cols,
                        const float* scale, float* amax);
// Per-row scaled (ops/fp8_rows.h; twins cpu::cast_fp8_rows / cast_transpose_fp8_rows): y (rows,
// cols) with row r = fp8(x[r] · s_r), descale (rows) = 1/s_r, x packed (rows, cols) of x_t; the
// transposed variant writes y (cols, rows) and descale (cols), one scale per output row (rows a
// multiple of 16, y 16-byte aligned). The row scales of gemm.h's FP8 products.
void cast_fp8_rows(Context& ctx, DType y_t, uint8_t* y, float* descale, DType x_t, const void* x, int rows,
                   int cols);
void cast_transpose_fp8_rows(Context& ctx, DType y_t, uint8_t* y, float* descale, DType x_t, const void* x,
                             int rows, int cols);
// cast_fp8_rows of x and, from the same read, dbias (cols, f32) += Σ_r x[r, :] (x a linear
// layer's output gradient: the FP8 rows of its dX product and its bias gradient). The bytes and
// descales are cast_fp8_rows'; the sums run in a fixed order (another than bias_grad's), so the
// same bits run to run. Twins: cpu::cast_fp8_rows and cpu::bias_grad. One pass where
// cast_fp8_rows_bias_fused (bf16 rows of 8k ≤ 3,072 values, x 16-byte and y 8-byte aligned),
// else the two ops.
void cast_fp8_rows_bias(Context& ctx, DType y_t, uint8_t* y, float* descale, float* dbias, DType x_t,
                        const void* x, int rows, int cols);
inline bool cast_fp8_rows_bias_fused(DType x_t, int cols) {
  return x_t == DType::kBF16 && cols % 8 == 0 && cols <= 3072;
}

// ---- embedding ------------------------------------------------------------------------------
// out (B, T, C) = wte[tokens] + wpe[p] (wpe may be null), p = pos[b, t] when pos (B, T, device)
// is given (packed rows, cpu::embedding_fwd's contract), else t.
void embedding_fwd(Context& ctx, DType dt, void* out, const int32_t* tokens, const void* wte,
                   const void* wpe, int B, int T_, int C, const int32_t* pos = nullptr);
// dwte (V, C) += rows of dout gathered by token; dwpe (maxT, C) += rows of dout gathered by
// position, p as in the forward (may be null). Deterministic without atomics (e.g. sort
// positions by token with CUB, then one segment per distinct token summed in position order).
void embedding_bwd(Context& ctx, DType dt, float* dwte, float* dwpe, const void* dout,
                   const int32_t* tokens, int B, int T_, int C, const int32_t* pos = nullptr);

// ---- norms ----------------------------------------------------------------------------------
// The forwards' out8 / descale8 (optional; bf16 rows of C ≤ 1,024, which a warp holds in
// registers): out's E4M3 copy (N, C) and its row descales (N) as well, the bytes
// cast_fp8_rows(out) would give (fp8_row.cuh), for CudaBackend's FP8 products. They return
// whether they wrote it (false: not given, or a row the kernels do not hold whole).
bool layernorm_fwd(Context& ctx, DType dt, void* out, float* mean, float* rstd, const void* inp,
                   const void* weight, const void* bias, int N, int C, float eps, uint8_t* out8 = nullptr,
                   float* descale8 = nullptr);
// res (N, C) = a + b rounded to dt (what residual_fwd stores), then layernorm_fwd of the stored
// res, bit for bit, in one kernel. res must not alias a, b or out. No fused backward is needed:
// the add's backward is the identity, and layernorm_bwd already accumulates (+=) dinp into the
// residual stream's gradient.
bool residual_layernorm_fwd(Context& ctx, DType dt, void* res, void* out, float* mean, float* rstd,
                            const void* a, const void* b, const void* weight, const void* bias,
                            int N, int C, float eps, uint8_t* out8 = nullptr, float* descale8 = nullptr);
// The norms' backward accumulates (+=) dinp; dres (f32, C), when not null, += Σ_rows of the
// updated dinp as stored: the bias gradient of the linear layer whose output the residual
// stream's gradient is (cpu::bias_grad of dinp after the call), summed in the same pass.
void layernorm_bwd(Context& ctx, DType dt, void* dinp, float* dweight, float* dbias,
                   const void* dout, const void* inp, const void* weight, const float* mean,
                   const float* rstd, int N, int C, float* dres = nullptr);
bool rmsnorm_fwd(Context& ctx, DType dt, void* out, float* rstd, const void* inp,
                 const void* weight, int N, int C, float eps, uint8_t* out8 = nullptr,
                 float* descale8 = nullptr);
// res (N, C) = a + b rounded to dt, then rmsnorm_fwd of the stored res, bit for bit, in one
// kernel (same contract as residual_layernorm_fwd).
bool residual_rmsnorm_fwd(Context& ctx, DType dt, void* res, void* out, float* rstd, const void* a,
                          const void* b, const void* weight, int N, int C, float eps, uint8_t* out8 = nullptr,
                          float* descale8 = nullptr);
// In place over H heads of HS per row, rows `stride` elements apart (cpu::head_rmsnorm).
void head_rmsnorm(Context& ctx, DType dt, void* x, const void* weight, int N, int H, int HS,
                  int64_t stride, float eps);
// Qwen3's q/k head norm + RoPE in one pass each way (cpu::head_norm_rope_fwd / _bwd's contract,
// ops/head_norm_rope.h): x (B, T, H, HS) = rope(rmsnorm per head of x_raw · weight), rstd
// (B, T, H) f32; rope null: no rotation; pos (B, T, device) or null (positions t). The backward
// WRITES dx_raw (may alias dx) and accumulates dweight (f32, HS; null: not computed),
// deterministically (fixed row splits, then a fixed-order sum). ld: elements from one
// position's heads to the next in x, x_raw (forward) and dx, dx_raw, x_raw (backward), for views
// into fused q|k|v rows; 0: H·HS (dense). rstd is dense. H0 in (0, H): two groups of heads,
// [0, H0) with weight[0, HS) and [H0, H) with weight[HS, 2·HS) (q's and k's gains; dweight
// (2, HS)), rstd (B, T, H0) then (B, T, H − H0): one pass where two calls would compute every
// position's RoPE angles twice.
void head_norm_rope_fwd(Context& ctx, DType dt, void* x, float* rstd, const void* x_raw,
                        const void* weight, int B, int T_, int H, int HS, float eps,
                        const Rope* rope, const int32_t* pos = nullptr, int64_t ld = 0, int H0 = 0);
void head_norm_rope_bwd(Context& ctx, DType dt, void* dx_raw, float* dweight, const void* dx,
                        const void* x_raw, const void* weight, const float* rstd, int B, int T_,
                        int H, int HS, const Rope* rope, const int32_t* pos = nullptr,
                        int64_t ld = 0, int H0 = 0);
// dweight nullptr: not computed (a frozen gain, LoRA's base).
void rmsnorm_bwd(Context& ctx, DType dt, void* dinp, float* dweight, const void* dout,
                 const void* inp, const void* weight, const float* rstd, int N, int C,
                 float* dres = nullptr);

// ---- linear bias gradient -------------------------------------------------------------------
// dbias (OC, f32) += Σ_n dout[n, :] over dout (N, OC) in dt; deterministic (cpu::bias_grad). ld:
// dout's row stride (a column slice of a wider gradient), 0: OC.
void bias_grad(Context& ctx, DType dt, float* dbias, const void* dout, int N, int OC, int64_t ld = 0);

// ---- RoPE (in place on (B, T, H, HS)) -------------------------------------------------------
// Positions pos0 + t, or pos[b, t] when pos (B, T, device) is given (packed rows; pos0 is then
// ignored): cpu::rope_fwd / rope_bwd's contract. ld: elements from one position's heads to the
// next (a view into a fused q|k|v row); 0: H·HS.
void rope_fwd(Context& ctx, DType dt, void* x, int B, int T_, int H, int HS, const Rope& rope,
              int pos0 = 0, const int32_t* pos = nullptr, int64_t ld = 0);
void rope_bwd(Context& ctx, DType dt, void* dx, int B, int T_, int H, int HS, const Rope& rope,
              int pos0 = 0, const int32_t* pos = nullptr, int64_t ld = 0);

// rope_bwd of dx (B, T, H, HS) in place (pos0 = 0), and dbias (H·HS, f32) += Σ_(b,t) of the
// rotated result: the bias gradient of the q or k projection (Qwen2) from the rotation's pass,
// deterministic (fixed row splits, fixed-order sum; cpu::rope_bias_bwd). dbias null: rope_bwd.
// ld: dx's row stride (a view into a fused q|k|v row), 0: H·HS.
void rope_bias_bwd(Context& ctx, DType dt, void* dx, float* dbias, int B, int T_, int H, int HS,
                   const Rope& rope, const int32_t* pos = nullptr, int64_t ld = 0);

// ---- attention (unfused: batched GEMMs + softmax kernels) ----------------------------------
// Same contract as cpu::attention_fwd/bwd; att (B, NH, T, T) holds the probabilities in dt.
// seg (B, T) int32 on the device, or nullptr: segment ids of packed rows (ops/attention.h), so
// query i also sees only keys j >= the first token of its segment. The backward takes the
// forward's seg.
void attention_fwd(Context& ctx, DType dt, void* out, void* att, const void* q, const void* k,
                   const void* v, const AttentionShape& s, const int32_t* seg = nullptr);
void attention_bwd(Context& ctx, DType dt, void* dq, void* dk, void* dv, const void* dout,
                   const void* q, const void* k, const void* v, const void* att,
                   const AttentionShape& s, const int32_t* seg = nullptr);

// start (B, T) = the first token of each token's segment, a segment being a run of equal ids of
// seg (B, T) in a row; both int32 on the device. No host sync, so it can be graph-captured.
void segment_starts(Context& ctx, int32_t* start, const int32_t* seg, int B, int T_);

// ---- flash attention (fused, tensor cores: wgmma or mma.sync; bf16 or f16) -------------------
// The same mathematics as attention_fwd/bwd without the T×T probabilities: FlashAttention-2's
// online softmax in the forward, and a backward that recomputes P from the saved log-sum-exp in
// two kernels (dQ over query tiles, dK/dV over key tiles), no atomics, bit-identical reruns —
// or, at head size 64 on Hopper, in one kernel whose dQ partials are added in a fixed order
// (also bit-identical reruns; FlashKernels::kWgmmaSplit keeps the two kernels there).
// HS must be 32, 64, 80, 96 or 128 (flash_attention_supported); q/k/v/out/dout 16-byte aligned.
//
// Token strides: AttentionStrides (ops/attention.h).
// Which kernels: kAuto = Hopper's wgmma kernels (flash_attention_wgmma.cu) on a compute
// capability 9.x device for head sizes 64 and 128, the mma.sync kernels otherwise; kMma and
// kWgmma force one family (kWgmma where it cannot run is refused). For tests and benchmarks.
// kWgmmaSplit: the wgmma kernels, head size 64's backward as two kernels instead of one (the
// comparison for the one-kernel backward, flash_attention_bwd_wgmma.cu).
enum class FlashKernels { kAuto, kMma, kWgmma, kWgmmaSplit };
bool flash_attention_supported(DType dt, int HS);
// out (B, T, NH, HS); lse (B, NH, T) f32 = ln Σ_visible exp(q·k/sqrt(HS)) per query row
// (−FLT_MAX for a row with no visible key, whose output is 0).
void flash_attention_fwd(Context& ctx, DType dt, void* out, float* lse, const void* q, const void* k,
                         const void* v, const AttentionShape& s, const AttentionStrides& st = {},
                         FlashKernels kernels = FlashKernels::kAuto, const int32_t* seg = nullptr);
// Writes (does not accumulate) dq, dk, dv. delta: (B, NH, T) f32 scratch for D = rowsum(dO∘O).
// seg: as for attention_fwd (the backward takes the forward's). Without it the kernels are the
// ones compiled without segment code; with it, variants that add the per-row lower bound.
void flash_attention_bwd(Context& ctx, DType dt, void* dq, void* dk, void* dv, const void* dout,
                         const void* q, const void* k, const void* v, const void* out, const float* lse,
                         float* delta, const AttentionShape& s, const AttentionStrides& st = {},
                         FlashKernels kernels = FlashKernels::kAuto, const int32_t* seg = nullptr);

// ---- LM head + cross-entropy, fused ---------------------------------------------------------
// x (N, C) final hidden states; w (Vp, C) head weight (dt; its padded rows [V, Vp) finite, as
// for the CPU composition, which multiplies them by zeros too); targets (N), −1 = ignore.
// Forward: losses (N, f32) = −log softmax(x·wᵀ)[target] over the first V columns (0 where
// ignored). The N×Vp logits are never stored in f32: f32 goes through vocabulary chunks with
// online max / sum-exp, bf16 through row chunks of bf16 logits (cross_entropy.cu). With dx/dw
// non-null, also the backward of Σ losses · dloss: dx (N, C, dt) += dloss·(softmax − onehot)·w
// and dw (Vp, C, f32) += its transpose product (+= 0 on the padded rows).
// `dloss` is read from device memory (one f32) so the step needs no host sync.
//
// FP8 (bf16 only, `fp8` non-null; CudaBackend under FORGE_FP8, core/fp8_recipe.h): the logits
// product and the dx product run on FP8 tensor cores with per-row scales (ops/fp8_rows.h). x's
// E4M3 rows come from fp8->x8 (the final norm wrote them) or are cast here; w's E4M3 rows and its
// transposed rows are cast here once a call; the row kernel writes each chunk's dlogits' FP8 rows
// (fp8->grad_type: E4M3 or E5M2) beside its bf16 ones, with the scale the cast of those bf16 rows
// would give (cross_entropy.cu). dw stays a bf16 product of the bf16 dlogits. N, C and Vp must
// be multiples of 16.
struct LmHeadFp8 {
  const uint8_t* x8 = nullptr;        // (N, C) E4M3 rows of x, or null: cast here
  const float* x_descale = nullptr;   // (N), with x8
  DType grad_type = DType::kF8E4M3;   // the dlogits' format: kF8E4M3 or kF8E5M2
};
void lm_head_cross_entropy(Context& ctx, DType dt, float* losses, void* dx, float* dw,
                           const void* x, const void* w, const int32_t* targets,
                           const float* dloss, int N, int C, int V, int Vp,
                           const LmHeadFp8* fp8 = nullptr);

// ---- optimizer ------------------------------------------------------------------------------
// out[0] = Σ g² over n elements (f32 result, f64-free two-pass tree in fixed order).
void sum_squares(Context& ctx, float* out, const float* g, int64_t n);
// AdamW (cpu::adamw_update's formula) over one tensor. The step's scalars are read from device
// memory: `factors` points to one AdamWFactors (adamw_factors), so a captured graph
// picks up each step's lr and t. The clip factor is computed on the device from *global_sq (Σ g²
// of all gradients): min(1, max_norm / (sqrt(sq) + 1e-6)), times factors->grad_scale; max_norm
// <= 0 disables clipping. When `work` is non-null the updated weights are also written there as
// `work_dt` (the bf16 or f16 working copy), with stochastic rounding when factors->sr_seed != 0
// (bf16 only; Philox stream keyed by factors->sr_seed + sr_offset and the element index).
// loss_scale (device, f16 training; null otherwise): the gradients carry loss_scale->scale; the
// norm is unscaled before clipping, and a non-finite *global_sq leaves every array untouched
// (the step is skipped; loss_scale_step() then halves the scale). ops/loss_scale.h.
// guard (device; null: none): when guard->skipped every array is left untouched, and Adam's t
// is factors->step minus guard->skipped_total (and loss_scale->skipped_total). ops/step_guard.h.
void adamw_update(Context& ctx, float* param, float* m, float* v, const float* grad, void* work,
                  DType work_dt, int64_t n, const AdamWFactors* factors, uint64_t sr_offset,
                  const float* global_sq, float max_norm,
                  const LossScaleState* loss_scale = nullptr,
                  const StepGuardState* guard = nullptr);
// f16 loss scaling, one step's two small kernels (graph-capturable, no host sync):
// scaled[0] = dloss[0] · state->scale, the loss gradient the model back-propagates; and
// loss_scale_update(*state, *global_sq) on one thread, enqueued after the step's AdamW. A step
// the guard skipped (guard non-null, guard->skipped: its loss was not finite) leaves the scale
// and its counts as they were: the scale did not cause it, and the skip is the guard's.
void loss_scale_dloss(Context& ctx, float* scaled, const float* dloss, const LossScaleState* state);
void loss_scale_step(Context& ctx, LossScaleState* state, const float* global_sq,
                     const StepGuardState* guard = nullptr);
// The numerical guard (ops/step_guard.h), one thread: step_guard_update(*state, losses (n),
// *global_sq, loss_scaled), enqueued after Σ g² and before AdamW.
void step_guard_check(Context& ctx, StepGuardState* state, const double* losses, int n,
                      const float* global_sq, bool loss_scaled);
// A testing hook (StepRunner::inject_fault), one thread: faults[0] != 0 sets grad[0] to NaN,
// faults[1] != 0 sets loss[0] to NaN. `faults` is device memory, so a captured graph replays
// with each step's choice.
void inject_step_fault(Context& ctx, float* grad, double* loss, const int32_t* faults);

// ---- reductions -----------------------------------------------------------------------------
// out[0] = Σ x[i] in f64, in index order (cpu::sum_in_order's loop, bit for bit): one thread, so
// use it for short vectors such as the (B·T) per-position losses of a step.
void sum_in_order(Context& ctx, double* out, const float* x, int64_t n);
// The same on another stream of ctx's device (the training runner sums a micro-batch's losses on
// a side stream while its backward runs: the one-thread sum takes ~0.9 ms at 65,536 positions).
void sum_in_order(CUstream_st* stream, double* out, const float* x, int64_t n);

}  // namespace forge::cuda
