// The whole model on the CPU backend: explicit forward and backward, no autograd.
// T is float for training and double for the finite-difference checks of the whole model.
//
// Activations kept for the backward live in one Activations struct per layer, sized once per
// (B, T) shape (an arena re-planned only when the shape changes). Parameter gradients
// accumulate into grads() (one flat buffer, same table as the weights), so gradient
// accumulation over micro-batches is just several backward() calls between zero_grad()s.
#pragma once

#include <cstdint>
#include <vector>

#include "forge/model/config.h"
#include "forge/model/params.h"

namespace forge {

template <typename T>
class Transformer {
 public:
  explicit Transformer(const ModelConfig& cfg);

  const ModelConfig& config() const { return cfg_; }
  const ParamTable& table() const { return table_; }
  std::vector<T>& weights() { return weights_; }
  const std::vector<T>& weights() const { return weights_; }
  std::vector<T>& grads() { return grads_; }
  const std::vector<T>& grads() const { return grads_; }
  int64_t num_params() const { return table_.total(); }

  // Initialises weights as ParamTable::init describes.
  void init_weights(uint64_t seed);
  void zero_grad();

  // tokens (B, T) in [0, V), T <= max_seq_len (throws forge::Error otherwise). With targets
  // (B, T) (−1 = ignore), returns the mean cross-entropy over non-ignored positions and keeps
  // what backward() needs; without, returns 0 and only the logits are meaningful.
  double forward(const int32_t* tokens, const int32_t* targets, int B, int T_);

  // Logits of the last forward, (B, T, Vp); columns >= V are padding. Overwritten by backward().
  const T* logits() const { return logits_.data(); }

  // Accumulates (+=) into grads() the gradient of scale · (mean loss of the last forward).
  void backward(double scale = 1.0);

 private:
  struct LayerActs {
    std::vector<T> x_in;       // (B, T, C) residual stream entering the block
    std::vector<T> ln1, ln1_mean, ln1_rstd;  // (B, T, C), (B, T), (B, T)
    std::vector<T> q, k, v;    // (B, T, NH, HS), (B, T, NKV, HS) ×2; q and k after RoPE
    std::vector<T> att;        // (B, NH, T, T) attention probabilities
    std::vector<T> atty;       // (B, T, NH·HS) attention output before the projection
    std::vector<T> x_mid;      // (B, T, C) residual stream after attention
    std::vector<T> ln2, ln2_mean, ln2_rstd;
    std::vector<T> fc;         // gpt2: (B, T, FF) pre-GELU; llama: gate (B, T, FF)
    std::vector<T> up;         // llama: (B, T, FF)
    std::vector<T> hidden;     // (B, T, FF) activation output (GELU or SwiGLU)
  };

  void plan(int B, int T_);
  void attention_forward(int l, const T* x, int B, int T_);
  void mlp_forward(int l, int B, int T_);
  void block_backward(int l, std::vector<T>& dres, int B, int T_);

  ModelConfig cfg_;
  ParamTable table_;
  std::vector<T> weights_, grads_;

  int B_ = 0, T_ = 0;
  std::vector<int32_t> tokens_, targets_;
  std::vector<LayerActs> acts_;
  std::vector<T> x_out_;                   // (B, T, C) residual stream after the last block
  std::vector<T> lnf_, lnf_mean_, lnf_rstd_;
  std::vector<T> logits_, losses_;         // (B, T, Vp), (B, T)
  int64_t loss_count_ = 0;
  bool have_targets_ = false;
  // Backward scratch, (B, T, ·).
  std::vector<T> d_ln_, d_atty_, d_q_, d_k_, d_v_, d_qkv_, d_fc_, d_up_, d_hidden_, tmp_;
};

extern template class Transformer<float>;
extern template class Transformer<double>;

}  // namespace forge
