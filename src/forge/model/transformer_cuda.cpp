// CudaTransformer: Transformer<T>'s forward and backward (transformer.cpp) on the GPU ops of
// backend/cuda/ops.h and cuBLASLt GEMMs. Kept in the same order as the CPU file so the two can
// be read side by side; the parity tests compare them tensor by tensor.
#include "forge/model/transformer_cuda.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "forge/backend/cuda/check.h"
#include "forge/backend/cuda/gemm.h"
#include "forge/backend/cuda/ops.h"
#include "forge/core/error.h"
#include "forge/io/bf16.h"

namespace forge {

using cuda::GemmArgs;

CudaTransformer::CudaTransformer(cuda::Context& ctx, const ModelConfig& cfg, DType dt, const LossScaleOptions& ls)
    : ctx_(ctx), cfg_(cfg), table_(cfg), dt_(dt), es_(dtype_size(dt)) {
  if (dt != DType::kF32 && dt != DType::kBF16 && dt != DType::kF16)
    throw Error(str("CUDA training supports fp32, bf16 and f16 compute, not ", dtype_name(dt)));
  // Flash attention needs 16-bit inputs; fp32 mode keeps the unfused path (exact CPU parity).
  // FORGE_ATTENTION=unfused forces v1's path in bf16 too, and flash-mma / flash-wgmma one family
  // of flash kernels (ops.h, FlashKernels), for comparisons.
  const char* env = std::getenv("FORGE_ATTENTION");
  const std::string attn = env ? env : "flash";
  if (attn != "flash" && attn != "flash-mma" && attn != "flash-wgmma" && attn != "unfused")
    throw Error(str("FORGE_ATTENTION='", attn, "' (expected flash, flash-mma, flash-wgmma or unfused)"));
  flash_ = cuda::flash_attention_supported(dt, cfg.head_dim()) && attn != "unfused";
  flash_kernels_ = attn == "flash-mma"     ? cuda::FlashKernels::kMma
                   : attn == "flash-wgmma" ? cuda::FlashKernels::kWgmma
                                           : cuda::FlashKernels::kAuto;
  auto& a = ctx.allocator();
  const size_t P = table_.total();
  master_ = Buf<float>(a, P);
  grads_ = Buf<float>(a, P);
  m_ = Buf<float>(a, P);
  v_ = Buf<float>(a, P);
  if (dt_ != DType::kF32) work_ = Buf<uint8_t>(a, P * es_);
  norm_sq_ = Buf<float>(a, 1);
  factors_ = Buf<AdamWFactors>(a, 2);
  if (dt_ == DType::kF16) {
    if (!(ls.init_scale > 0.0f) || ls.growth_interval < 1)
      throw Error(str("loss scaling: init scale ", ls.init_scale, " and growth interval ", ls.growth_interval,
                      " (expected > 0 and >= 1)"));
    loss_scale_ = Buf<LossScaleState>(a, 1);
    scaled_dloss_ = Buf<float>(a, 1);
    const LossScaleState init = loss_scale_init(ls);
    FORGE_CUDA_CHECK(cudaMemcpyAsync(loss_scale_.data(), &init, sizeof(init), cudaMemcpyHostToDevice, ctx_.stream()));
    ctx_.synchronize();  // `init` goes out of scope
  }
  FORGE_CUDA_CHECK(cudaMemsetAsync(m_.data(), 0, m_.bytes(), ctx_.stream()));
  FORGE_CUDA_CHECK(cudaMemsetAsync(v_.data(), 0, v_.bytes(), ctx_.stream()));
  zero_grad();
}

void* CudaTransformer::w(int64_t off) const {
  if (dt_ == DType::kF32) return master_.data() + off;
  return work_.data() + off * es_;
}

void CudaTransformer::set_weights(const std::vector<float>& host) {
  FORGE_CHECK(host.size() == static_cast<size_t>(table_.total()), "set_weights: ", host.size(), " values for ", table_.total(), " parameters");
  FORGE_CUDA_CHECK(cudaMemcpyAsync(master_.data(), host.data(), master_.bytes(), cudaMemcpyHostToDevice, ctx_.stream()));
  if (dt_ != DType::kF32) cuda::convert(ctx_, dt_, work_.data(), DType::kF32, master_.data(), table_.total());
  ctx_.synchronize();  // the host vector may go away
}


namespace {

std::vector<float> to_host(cuda::Context& ctx, const cuda::DeviceBuffer<float>& d) {
  std::vector<float> h(d.size());
  ctx.synchronize();
  FORGE_CUDA_CHECK(cudaMemcpy(h.data(), d.data(), d.bytes(), cudaMemcpyDeviceToHost));
  return h;
}

}  // namespace

std::vector<float> CudaTransformer::weights_host() { return to_host(ctx_, master_); }
LossScaleState CudaTransformer::loss_scale_host() {
  FORGE_CHECK(loss_scale_.size() > 0, "loss_scale_host(): no loss scaling in ", dtype_name(dt_), " mode");
  LossScaleState s;
  ctx_.synchronize();
  FORGE_CUDA_CHECK(cudaMemcpy(&s, loss_scale_.data(), sizeof(s), cudaMemcpyDeviceToHost));
  return s;
}
std::vector<float> CudaTransformer::grads_host() { return to_host(ctx_, grads_); }
std::vector<float> CudaTransformer::adam_m_host() { return to_host(ctx_, m_); }
std::vector<float> CudaTransformer::adam_v_host() { return to_host(ctx_, v_); }

void CudaTransformer::set_adam_state(const std::vector<float>& m, const std::vector<float>& v) {
  FORGE_CHECK(m.size() == m_.size() && v.size() == v_.size(), "set_adam_state: wrong sizes");
  // On our stream (a pageable cudaMemcpy may return before its DMA lands, and our stream does
  // not wait for the default one), then waited for: the host vectors may go away.
  FORGE_CUDA_CHECK(cudaMemcpyAsync(m_.data(), m.data(), m_.bytes(), cudaMemcpyHostToDevice, ctx_.stream()));
  FORGE_CUDA_CHECK(cudaMemcpyAsync(v_.data(), v.data(), v_.bytes(), cudaMemcpyHostToDevice, ctx_.stream()));
  ctx_.synchronize();
}

void CudaTransformer::zero_grad() {
  FORGE_CUDA_CHECK(cudaMemsetAsync(grads_.data(), 0, grads_.bytes(), ctx_.stream()));
}

void CudaTransformer::zero(Buf<uint8_t>& b) {
  FORGE_CUDA_CHECK(cudaMemsetAsync(b.data(), 0, b.bytes(), ctx_.stream()));
}

void CudaTransformer::plan(int B, int T_) {
  if (B == B_ && T_ == this->T_) return;
  ++plan_generation_;
  ctx_.synchronize();  // buffers below may be in use by enqueued work of the old shape
  B_ = B;
  this->T_ = T_;
  auto& a = ctx_.allocator();
  const size_t N = static_cast<size_t>(B) * T_, C = cfg_.n_embd, FF = cfg_.ffn_hidden;
  const size_t HS = cfg_.head_dim(), NH = cfg_.n_head, NKV = cfg_.n_kv_head;
  const bool gpt2 = cfg_.family == Family::kGpt2;
  auto bytes = [&](size_t n) { return Buf<uint8_t>(a, n * es_); };
  acts_.clear();
  acts_.resize(cfg_.n_layer);
  for (auto& l : acts_) {
    l.x_in = bytes(N * C);
    l.ln1 = bytes(N * C);
    l.ln1_mean = Buf<float>(a, N);
    l.ln1_rstd = Buf<float>(a, N);
    if (flash_ && gpt2) {
      l.qkv = bytes(N * 3 * C);
    } else {
      l.q = bytes(N * NH * HS);
      l.k = bytes(N * NKV * HS);
      l.v = bytes(N * NKV * HS);
    }
    if (flash_) l.lse = Buf<float>(a, static_cast<size_t>(B) * NH * T_);
    else l.att = bytes(static_cast<size_t>(B) * NH * T_ * T_);
    l.atty = bytes(N * NH * HS);
    l.x_mid = bytes(N * C);
    l.ln2 = bytes(N * C);
    l.ln2_mean = Buf<float>(a, N);
    l.ln2_rstd = Buf<float>(a, N);
    l.fc = bytes(N * FF);
    if (!gpt2) l.up = bytes(N * FF);
    l.hidden = bytes(N * FF);
  }
  x_out_ = bytes(N * C);
  lnf_ = bytes(N * C);
  lnf_mean_ = Buf<float>(a, N);
  lnf_rstd_ = Buf<float>(a, N);
  losses_ = Buf<float>(a, N);
  tmp_ = bytes(N * C);
  if (gpt2) d_qkv_ = bytes(N * 3 * C);
  if (gpt2 && !flash_) qkv_ = bytes(N * 3 * C);
  if (flash_) delta_ = Buf<float>(a, static_cast<size_t>(B) * NH * T_);
  d_res_ = bytes(N * C);
  d_ln_ = bytes(N * C);
  d_atty_ = bytes(N * NH * HS);
  if (!(gpt2 && flash_)) {  // GPT-2's flash backward writes into d_qkv_ directly
    d_q_ = bytes(N * NH * HS);
    d_k_ = bytes(N * NKV * HS);
    d_v_ = bytes(N * NKV * HS);
  }
  d_fc_ = bytes(N * FF);
  if (!gpt2) d_up_ = bytes(N * FF);
  if (!gelu_epilogues()) d_hidden_ = bytes(N * FF);  // the DGELU epilogue skips d(hidden)
}

// out (N, OC) = inp (N, C) · W (+ bias); W is (OC, C) (Linear) or (C, OC) (Conv1D, in_out).
void CudaTransformer::linear_fwd(void* out, const void* inp, int64_t w_off, int64_t b_off, int N, int C, int OC,
                                 bool in_out) {
  GemmArgs g;
  g.M = N, g.N = OC, g.K = C, g.trans_b = !in_out;
  g.ab_type = g.c_type = dt_;
  if (b_off >= 0) g.epilogue = cuda::GemmEpilogue::kBias, g.bias = w(b_off);
  cuda::gemm(ctx_, g, inp, w(w_off), out);
}

// GPT-2's MLP in 16-bit modes runs GELU in cuBLASLt's epilogues (GELU_AUX_BIAS forward, DGELU
// backward); fp32 mode, the CPU-parity path, keeps the separate GELU kernels (cuBLASLt's tanh
// differs in the last bits). plan(), linear_gelu_fwd() and backward() all follow this.
bool CudaTransformer::gelu_epilogues() const { return cfg_.family == Family::kGpt2 && dt_ != DType::kF32; }

// hidden = gelu(fc), fc = inp · W + bias (GPT-2's MLP up-projection): one GEMM writing both (fc
// as the aux output the backward needs) when gelu_epilogues(), else the GEMM and a GELU kernel.
void CudaTransformer::linear_gelu_fwd(void* hidden, void* fc, const void* inp, int64_t w_off, int64_t b_off, int N,
                                      int C, int OC) {
  if (!gelu_epilogues()) {
    linear_fwd(fc, inp, w_off, b_off, N, C, OC, true);
    cuda::gelu_fwd(ctx_, dt_, hidden, fc, static_cast<int64_t>(N) * OC);
    return;
  }
  GemmArgs g;
  g.M = N, g.N = OC, g.K = C;
  g.ab_type = g.c_type = dt_;
  g.epilogue = cuda::GemmEpilogue::kBiasGeluAux, g.bias = w(b_off), g.aux = fc;
  cuda::gemm(ctx_, g, inp, w(w_off), hidden);
}

// dinp (N, C) (when non-null) += or = (DinpMode) dout · op(W); with kDGelu, dinp = (dout · op(W))
// ∘ gelu'(gelu_pre), the GELU backward fused into the product. Accumulates dW (f32, W's layout)
// and dbias (f32, when b_off >= 0).
void CudaTransformer::linear_bwd(void* dinp, int64_t w_off, int64_t b_off, const void* dout, const void* inp, int N,
                                 int C, int OC, bool in_out, DinpMode mode, const void* gelu_pre) {
  if (dinp) {
    GemmArgs g;  // dinp (+)= dout (N, OC) · op(W) (OC, C)
    g.M = N, g.N = C, g.K = OC, g.trans_b = in_out, g.beta = mode == DinpMode::kAccumulate ? 1.0f : 0.0f;
    g.ab_type = g.c_type = dt_;
    if (mode == DinpMode::kDGelu) g.epilogue = cuda::GemmEpilogue::kDGelu, g.aux = const_cast<void*>(gelu_pre);
    cuda::gemm(ctx_, g, dout, w(w_off), dinp);
  }
  GemmArgs g;
  g.trans_a = true, g.beta = 1.0f, g.ab_type = dt_, g.c_type = DType::kF32, g.K = N;
  if (in_out) {  // dW (C, OC) += inpᵀ · dout
    g.M = C, g.N = OC;
    cuda::gemm(ctx_, g, inp, dout, grads_.data() + w_off);
  } else {  // dW (OC, C) += doutᵀ · inp
    g.M = OC, g.N = C;
    cuda::gemm(ctx_, g, dout, inp, grads_.data() + w_off);
  }
  if (b_off >= 0) cuda::bias_grad(ctx_, dt_, grads_.data() + b_off, dout, N, OC);  // dbias += Σ_n dout
}

// res = a + b, then out = norm(res): one pass over the residual stream (the fused kernels of
// ops.h). The backward needs no counterpart: norm_bwd already accumulates into the residual
// stream's gradient.
void CudaTransformer::residual_norm_fwd(void* res, void* out, float* mean, float* rstd, const void* a, const void* b,
                                        int64_t w_off, int64_t b_off, int N) {
  if (cfg_.family == Family::kGpt2)
    cuda::residual_layernorm_fwd(ctx_, dt_, res, out, mean, rstd, a, b, w(w_off), w(b_off), N, cfg_.n_embd,
                                 cfg_.norm_eps);
  else
    cuda::residual_rmsnorm_fwd(ctx_, dt_, res, out, rstd, a, b, w(w_off), N, cfg_.n_embd, cfg_.norm_eps);
}

void CudaTransformer::norm_fwd(void* out, float* mean, float* rstd, const void* inp, int64_t w_off, int64_t b_off,
                               int N) {
  if (cfg_.family == Family::kGpt2)
    cuda::layernorm_fwd(ctx_, dt_, out, mean, rstd, inp, w(w_off), w(b_off), N, cfg_.n_embd, cfg_.norm_eps);
  else
    cuda::rmsnorm_fwd(ctx_, dt_, out, rstd, inp, w(w_off), N, cfg_.n_embd, cfg_.norm_eps);
}

void CudaTransformer::norm_bwd(void* dinp, const void* dout, const void* inp, const float* mean, const float* rstd,
                               int64_t w_off, int64_t b_off, int N) {
  if (cfg_.family == Family::kGpt2)
    cuda::layernorm_bwd(ctx_, dt_, dinp, g(w_off), g(b_off), dout, inp, w(w_off), mean, rstd, N, cfg_.n_embd);
  else
    cuda::rmsnorm_bwd(ctx_, dt_, dinp, g(w_off), dout, inp, w(w_off), rstd, N, cfg_.n_embd);
}

// Where a layer's q, k, v live: column slices of its fused (N, 3C) projection (GPT-2 with flash
// attention) or three dense buffers.
CudaTransformer::AttnInputs CudaTransformer::attention_inputs(const LayerActs& a) const {
  if (a.qkv.size() > 0) {
    const int64_t C = cfg_.n_embd;
    auto* base = static_cast<uint8_t*>(act(a.qkv));
    return {base, base + C * es_, base + 2 * C * es_, {3 * C, 3 * C, 3 * C, 0}};
  }
  return {act(a.q), act(a.k), act(a.v), {}};
}

void CudaTransformer::forward(const int32_t* tokens, const int32_t* targets, const float* dloss, int B, int T_) {
  if (T_ > cfg_.max_seq_len)
    throw Error(str("[forward] sequence length ", T_, " exceeds the model's max_seq_len ", cfg_.max_seq_len));
  FORGE_CHECK(targets != nullptr, "CudaTransformer::forward needs targets (the head is fused with the loss)");
  plan(B, T_);
  tokens_ = tokens;
  const bool gpt2 = cfg_.family == Family::kGpt2;
  const int N = B * T_, C = cfg_.n_embd, NH = cfg_.n_head, NKV = cfg_.n_kv_head, HS = cfg_.head_dim();
  const int FF = cfg_.ffn_hidden;
  const int64_t nff = static_cast<int64_t>(N) * FF;
  cuda::embedding_fwd(ctx_, dt_, act(acts_[0].x_in), tokens, w(table_.wte()), gpt2 ? w(table_.wpe()) : nullptr, B, T_, C);
  for (int l = 0; l < cfg_.n_layer; ++l) {
    const LayerOffsets& o = table_.layer(l);
    LayerActs& a = acts_[l];
    // Attention.
    // ln1 of layers after the first was made with the previous layer's residual add.
    if (l == 0) norm_fwd(act(a.ln1), a.ln1_mean.data(), a.ln1_rstd.data(), act(a.x_in), o.ln1_w, o.ln1_b, N);
    const AttentionShape shape{B, T_, NH, NKV, HS, true, cfg_.sliding_window};
    const AttnInputs in = attention_inputs(a);
    if (gpt2 && flash_) {
      // q, k, v stay column slices of the fused projection: flash attention takes strides.
      linear_fwd(act(a.qkv), act(a.ln1), o.qkv_w, o.qkv_b, N, C, 3 * C, true);
    } else if (gpt2) {
      linear_fwd(act(qkv_), act(a.ln1), o.qkv_w, o.qkv_b, N, C, 3 * C, true);
      // Split (N, 3C) into q, k, v (N, C): strided 2-D copies, no kernel needed.
      void* parts[3] = {act(a.q), act(a.k), act(a.v)};
      for (int p = 0; p < 3; ++p)
        FORGE_CUDA_CHECK(cudaMemcpy2DAsync(parts[p], C * es_, static_cast<uint8_t*>(act(qkv_)) + p * C * es_, 3 * C * es_,
                                           C * es_, N, cudaMemcpyDeviceToDevice, ctx_.stream()));
    } else {
      linear_fwd(act(a.q), act(a.ln1), o.q_w, -1, N, C, NH * HS, false);
      linear_fwd(act(a.k), act(a.ln1), o.k_w, -1, N, C, NKV * HS, false);
      linear_fwd(act(a.v), act(a.ln1), o.v_w, -1, N, C, NKV * HS, false);
      cuda::rope_fwd(ctx_, dt_, act(a.q), B, T_, NH, HS, cfg_.rope_theta, cfg_.rope_style);
      cuda::rope_fwd(ctx_, dt_, act(a.k), B, T_, NKV, HS, cfg_.rope_theta, cfg_.rope_style);
    }
    if (flash_)
      cuda::flash_attention_fwd(ctx_, dt_, act(a.atty), a.lse.data(), in.q, in.k, in.v, shape, in.st,
                                flash_kernels_);
    else
      cuda::attention_fwd(ctx_, dt_, act(a.atty), act(a.att), in.q, in.k, in.v, shape);
    linear_fwd(act(tmp_), act(a.atty), o.attn_out_w, gpt2 ? o.attn_out_b : -1, N, NH * HS, C, gpt2);
    residual_norm_fwd(act(a.x_mid), act(a.ln2), a.ln2_mean.data(), a.ln2_rstd.data(), act(a.x_in), act(tmp_), o.ln2_w,
                      o.ln2_b, N);
    // MLP.
    if (gpt2) {
      linear_gelu_fwd(act(a.hidden), act(a.fc), act(a.ln2), o.fc_w, o.fc_b, N, C, FF);
      linear_fwd(act(tmp_), act(a.hidden), o.down_w, o.down_b, N, FF, C, true);
    } else {
      linear_fwd(act(a.fc), act(a.ln2), o.gate_w, -1, N, C, FF, false);
      linear_fwd(act(a.up), act(a.ln2), o.up_w, -1, N, C, FF, false);
      cuda::swiglu_fwd(ctx_, dt_, act(a.hidden), act(a.fc), act(a.up), nff);
      linear_fwd(act(tmp_), act(a.hidden), o.down_w, -1, N, FF, C, false);
    }
    if (l + 1 < cfg_.n_layer) {  // the block's output and the next layer's ln1
      LayerActs& nx = acts_[l + 1];
      const LayerOffsets& no = table_.layer(l + 1);
      residual_norm_fwd(act(nx.x_in), act(nx.ln1), nx.ln1_mean.data(), nx.ln1_rstd.data(), act(a.x_mid), act(tmp_),
                        no.ln1_w, no.ln1_b, N);
    } else {  // the last block's output and the final norm
      residual_norm_fwd(act(x_out_), act(lnf_), lnf_mean_.data(), lnf_rstd_.data(), act(a.x_mid), act(tmp_),
                        table_.lnf_w(), table_.lnf_b(), N);
    }
  }
  have_head_grad_ = dloss != nullptr;
  if (have_head_grad_) zero(d_ln_);
  if (have_head_grad_ && loss_scale_.size() > 0) {  // f16: back-propagate scale · dloss
    cuda::loss_scale_dloss(ctx_, scaled_dloss_.data(), dloss, loss_scale_.data());
    dloss = scaled_dloss_.data();
  }
  cuda::lm_head_cross_entropy(ctx_, dt_, losses_.data(), have_head_grad_ ? act(d_ln_) : nullptr,
                              have_head_grad_ ? g(table_.lm_head()) : nullptr, act(lnf_), w(table_.lm_head()),
                              targets, dloss, N, C, cfg_.vocab_size, cfg_.padded_vocab());
}

void CudaTransformer::backward() {
  FORGE_CHECK(have_head_grad_, "backward() needs a forward() with dloss");
  const bool gpt2 = cfg_.family == Family::kGpt2;
  const int B = B_, T_ = this->T_, N = B * T_, C = cfg_.n_embd, NH = cfg_.n_head, NKV = cfg_.n_kv_head;
  const int HS = cfg_.head_dim(), FF = cfg_.ffn_hidden;
  const int64_t nff = static_cast<int64_t>(N) * FF;
  zero(d_res_);
  norm_bwd(act(d_res_), act(d_ln_), act(x_out_), lnf_mean_.data(), lnf_rstd_.data(), table_.lnf_w(), table_.lnf_b(), N);
  for (int l = cfg_.n_layer - 1; l >= 0; --l) {
    const LayerOffsets& o = table_.layer(l);
    LayerActs& a = acts_[l];
    // MLP: d_res_ is d(block output).
    // The first product into a gradient buffer overwrites it (beta 0): no memset, no read.
    if (gelu_epilogues()) {  // d_fc = (d_res · W_down) ∘ gelu'(fc) in one GEMM
      linear_bwd(act(d_fc_), o.down_w, o.down_b, act(d_res_), act(a.hidden), N, FF, C, true, DinpMode::kDGelu,
                 act(a.fc));
      linear_bwd(act(d_ln_), o.fc_w, o.fc_b, act(d_fc_), act(a.ln2), N, C, FF, true, DinpMode::kOverwrite);
    } else if (gpt2) {
      linear_bwd(act(d_hidden_), o.down_w, o.down_b, act(d_res_), act(a.hidden), N, FF, C, true, DinpMode::kOverwrite);
      zero(d_fc_);
      cuda::gelu_bwd(ctx_, dt_, act(d_fc_), act(a.fc), act(d_hidden_), nff);
      linear_bwd(act(d_ln_), o.fc_w, o.fc_b, act(d_fc_), act(a.ln2), N, C, FF, true, DinpMode::kOverwrite);
    } else {
      linear_bwd(act(d_hidden_), o.down_w, -1, act(d_res_), act(a.hidden), N, FF, C, false, DinpMode::kOverwrite);
      zero(d_fc_);
      zero(d_up_);
      cuda::swiglu_bwd(ctx_, dt_, act(d_fc_), act(d_up_), act(d_hidden_), act(a.fc), act(a.up), nff);
      linear_bwd(act(d_ln_), o.gate_w, -1, act(d_fc_), act(a.ln2), N, C, FF, false, DinpMode::kOverwrite);
      linear_bwd(act(d_ln_), o.up_w, -1, act(d_up_), act(a.ln2), N, C, FF, false);
    }
    norm_bwd(act(d_res_), act(d_ln_), act(a.x_mid), a.ln2_mean.data(), a.ln2_rstd.data(), o.ln2_w, o.ln2_b, N);
    // Attention: d_res_ is d(x_mid).
    linear_bwd(act(d_atty_), o.attn_out_w, gpt2 ? o.attn_out_b : -1, act(d_res_), act(a.atty), N, NH * HS, C, gpt2,
               DinpMode::kOverwrite);
    const AttentionShape shape{B, T_, NH, NKV, HS, true, cfg_.sliding_window};
    const AttnInputs in = attention_inputs(a);
    if (flash_) {
      // Writes the gradients (no zeroing); GPT-2's land in place in the fused (N, 3C) buffer.
      uint8_t* dqkv = static_cast<uint8_t*>(act(d_qkv_));
      void* dq = gpt2 ? dqkv : act(d_q_);
      void* dk = gpt2 ? dqkv + C * es_ : act(d_k_);
      void* dv = gpt2 ? dqkv + 2 * C * es_ : act(d_v_);
      cuda::flash_attention_bwd(ctx_, dt_, dq, dk, dv, act(d_atty_), in.q, in.k, in.v, act(a.atty), a.lse.data(),
                                delta_.data(), shape, in.st, flash_kernels_);
    } else {
      zero(d_q_);
      zero(d_k_);
      zero(d_v_);
      cuda::attention_bwd(ctx_, dt_, act(d_q_), act(d_k_), act(d_v_), act(d_atty_), in.q, in.k, in.v, act(a.att),
                          shape);
    }
    if (gpt2) {
      if (!flash_) {
        const void* parts[3] = {act(d_q_), act(d_k_), act(d_v_)};
        for (int p = 0; p < 3; ++p)
          FORGE_CUDA_CHECK(cudaMemcpy2DAsync(static_cast<uint8_t*>(act(d_qkv_)) + p * C * es_, 3 * C * es_, parts[p],
                                             C * es_, C * es_, N, cudaMemcpyDeviceToDevice, ctx_.stream()));
      }
      linear_bwd(act(d_ln_), o.qkv_w, o.qkv_b, act(d_qkv_), act(a.ln1), N, C, 3 * C, true, DinpMode::kOverwrite);
    } else {
      cuda::rope_bwd(ctx_, dt_, act(d_q_), B, T_, NH, HS, cfg_.rope_theta, cfg_.rope_style);
      cuda::rope_bwd(ctx_, dt_, act(d_k_), B, T_, NKV, HS, cfg_.rope_theta, cfg_.rope_style);
      linear_bwd(act(d_ln_), o.q_w, -1, act(d_q_), act(a.ln1), N, C, NH * HS, false, DinpMode::kOverwrite);
      linear_bwd(act(d_ln_), o.k_w, -1, act(d_k_), act(a.ln1), N, C, NKV * HS, false);
      linear_bwd(act(d_ln_), o.v_w, -1, act(d_v_), act(a.ln1), N, C, NKV * HS, false);
    }
    norm_bwd(act(d_res_), act(d_ln_), act(a.x_in), a.ln1_mean.data(), a.ln1_rstd.data(), o.ln1_w, o.ln1_b, N);
  }
  cuda::embedding_bwd(ctx_, dt_, g(table_.wte()), gpt2 ? g(table_.wpe()) : nullptr, act(d_res_), tokens_, B, T_, C);
}

std::array<AdamWFactors, 2> CudaTransformer::optimizer_factors(const AdamWParams& p, uint64_t sr_seed) {
  AdamWParams no_decay = p;
  no_decay.weight_decay = 0.0f;
  return {adamw_factors(p, sr_seed), adamw_factors(no_decay, sr_seed)};
}

void CudaTransformer::optimizer_step(const AdamWFactors* factors, float max_norm) {
  cuda::sum_squares(ctx_, norm_sq_.data(), grads_.data(), table_.total());
  for (const auto& info : table_.params()) {
    void* work = dt_ == DType::kF32 ? nullptr : work_.data() + info.offset * es_;
    cuda::adamw_update(ctx_, master_.data() + info.offset, m_.data() + info.offset, v_.data() + info.offset,
                       grads_.data() + info.offset, work, dt_, info.numel(), factors + (info.decay ? 0 : 1),
                       static_cast<uint64_t>(info.offset), norm_sq_.data(), max_norm, loss_scale());
  }
  if (loss_scale_.size() > 0) cuda::loss_scale_step(ctx_, loss_scale_.data(), norm_sq_.data());
  ++step_;
}

void CudaTransformer::optimizer_step(const AdamWParams& p, float max_norm, uint64_t sr_seed) {
  // A pageable cudaMemcpyAsync returns once the source is staged, so the local array may go.
  const std::array<AdamWFactors, 2> f = optimizer_factors(p, sr_seed);
  FORGE_CUDA_CHECK(cudaMemcpyAsync(factors_.data(), f.data(), sizeof(f), cudaMemcpyHostToDevice, ctx_.stream()));
  optimizer_step(factors_.data(), max_norm);
}

}  // namespace forge
