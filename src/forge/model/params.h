// The parameter table: every tensor of a model as (Hugging Face name, shape, offset) into one
// flat buffer. Weights, gradients and Adam's m and v are flat buffers of the same length, so the
// optimizer and the global norm are single passes (seeds, section 7).
//
// Layouts are Hugging Face's own, so the buffer is the checkpoint: GPT-2's Conv1D weights are
// (in, out); Llama's Linear weights are (out, in). The token embedding alone differs: it has
// padded_vocab() rows here and vocab_size rows in a checkpoint (padding rows are zero and never
// predicted).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "forge/core/tensor.h"
#include "forge/model/config.h"

namespace forge {

struct ParamInfo {
  std::string name;  // Hugging Face tensor name
  Shape shape;
  int64_t offset = 0;    // in elements, into the flat buffer
  bool decay = false;    // AdamW weight decay: tensors with >= 2 dims only
  bool residual_out = false;  // output projection into the residual stream (init / sqrt(2L))
  int64_t numel() const { return shape_numel(shape); }
};

// Offsets of one transformer block's tensors (-1 where the family has none).
struct LayerOffsets {
  int64_t ln1_w = -1, ln1_b = -1;
  int64_t qkv_w = -1, qkv_b = -1;            // gpt2: c_attn (C, 3C), (3C)
  int64_t q_w = -1, k_w = -1, v_w = -1;      // llama: (NH·HS, C), (NKV·HS, C), (NKV·HS, C)
  int64_t q_b = -1, k_b = -1, v_b = -1;      // qkv_bias: (NH·HS), (NKV·HS), (NKV·HS), contiguous
  int64_t q_norm_w = -1, k_norm_w = -1;      // qk_norm (qwen3): (HS) each
  int64_t attn_out_w = -1, attn_out_b = -1;  // gpt2 c_proj (C, C); llama o_proj (C, NH·HS), (C)
  int64_t ln2_w = -1, ln2_b = -1;
  int64_t fc_w = -1, fc_b = -1;              // gpt2 c_fc (C, FF), (FF)
  int64_t gate_w = -1, up_w = -1;            // llama (FF, C)
  int64_t down_w = -1, down_b = -1;          // gpt2 mlp.c_proj (FF, C); llama down_proj (C, FF)
};

class ParamTable {
 public:
  explicit ParamTable(const ModelConfig& cfg);

  const std::vector<ParamInfo>& params() const { return params_; }
  int64_t total() const { return total_; }
  // nullptr when absent.
  const ParamInfo* find(const std::string& name) const;

  int64_t wte() const { return wte_; }        // (Vp, C)
  int64_t wpe() const { return wpe_; }        // (maxT, C); -1 for llama
  int64_t lnf_w() const { return lnf_w_; }
  int64_t lnf_b() const { return lnf_b_; }    // -1 for llama
  int64_t lm_head() const { return lm_head_; }  // (Vp, C); == wte() when tied
  const LayerOffsets& layer(int l) const { return layers_[l]; }
  // The first element of each layer's tensors, ascending (data-parallel buckets, dist/buckets.h).
  std::vector<int64_t> layer_starts() const;

  // normal(0, 0.02) for matrices, /sqrt(2L) for residual output projections, 0 for biases,
  // 1 for norm gains, 0 for the embedding's padding rows. Drawn from Philox stream 0 at the
  // element's flat offset, so the CUDA backend can reproduce it exactly.
  void init(float* weights, uint64_t seed) const;

 private:
  int64_t add(const std::string& name, Shape shape, bool residual_out = false);

  ModelConfig cfg_;
  std::vector<ParamInfo> params_;
  std::vector<LayerOffsets> layers_;
  int64_t total_ = 0;
  int64_t wte_ = -1, wpe_ = -1, lnf_w_ = -1, lnf_b_ = -1, lm_head_ = -1;
};

}  // namespace forge
