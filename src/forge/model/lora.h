// LoRA (Hu et al. 2021, as Hugging Face PEFT implements it): low-rank adapters on a frozen base.
// Each targeted projection y = x·Wᵀ (+ b) becomes
//   y = x·Wᵀ (+ b) + (alpha / r) · (x·Aᵀ)·Bᵀ,   A (r, in), B (out, r),
// A initialised as PEFT does (kaiming-uniform with a = sqrt(5): U(−1/sqrt(in), 1/sqrt(in))),
// B = 0, so a fresh adapter computes exactly the base model.
//
// The adapter's tensors live in their own flat buffer, described by an AdapterTable whose names
// are PEFT's state-dict keys (base_model.model.model.layers.{l}.self_attn.q_proj.lora_A.weight,
// ...), in layer order and, within a layer, in the order q, k, v, o, gate, up, down. Targets are
// the projections of the Llama-layout families (llama, mistral, qwen2, qwen3). GPT-2 is refused:
// its fused c_attn is one Conv1D module (PEFT's fan_in_fan_out), a layout this table does not
// describe.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "forge/model/config.h"
#include "forge/model/params.h"

namespace forge {

enum class LoraTarget { kQ, kK, kV, kO, kGate, kUp, kDown };
inline constexpr int kNumLoraTargets = 7;

// "q", "k", ... (the --lora spelling) and PEFT's module names "q_proj", ..., "down_proj".
const char* lora_target_short_name(LoraTarget t);
const char* lora_target_module(LoraTarget t);

struct LoraConfig {
  int r = 8;                    // rank, > 0
  double alpha = 8;             // lora_alpha; the update is scaled by alpha / r
  std::vector<LoraTarget> targets{LoraTarget::kQ, LoraTarget::kV};  // PEFT's Llama default
  double scale() const { return alpha / r; }
  bool targets_has(LoraTarget t) const;
  // One-line forge::Error for r <= 0, a non-finite alpha, no or repeated targets.
  void validate() const;
};

// "r=16,alpha=32,targets=q,k,v,o,gate,up,down" (the --lora flag): comma-separated key=value;
// the names after targets= run to the next key. Keys: r, alpha, targets (short names or PEFT's
// module names), dropout (0 only: Forge's adapter path has no dropout mask, and a mask would
// have to be kept for the backward). Unset keys keep LoraConfig's defaults.
LoraConfig parse_lora_spec(const std::string& spec);

// Where one adapter's A and B live in the adapter buffer (-1: the projection is not targeted).
struct LoraSlot {
  int64_t a = -1, b = -1;
  int in = 0, out = 0;  // the projection's input and output features
};

class AdapterTable {
 public:
  // Throws forge::Error (one line) for a GPT-2 model or an invalid LoraConfig.
  AdapterTable(const ModelConfig& model, const LoraConfig& lora);

  const LoraConfig& lora() const { return lora_; }
  // The adapter tensors with PEFT's key names; offsets into the adapter buffer. decay is true
  // (matrices, as the base's rule has it): a run's weight_decay applies to them.
  const std::vector<ParamInfo>& params() const { return params_; }
  int64_t total() const { return total_; }
  const LoraSlot& slot(int layer, LoraTarget t) const {
    return slots_[layer][static_cast<int>(t)];
  }
  int n_layer() const { return static_cast<int>(slots_.size()); }
  // The first element of each layer's adapters, ascending (data-parallel buckets,
  // dist/buckets.h).
  std::vector<int64_t> layer_starts() const;

  // A ~ U(−1/sqrt(in), 1/sqrt(in)) from Philox stream kInitStream under `seed`, drawn in table
  // order; B = 0.
  static constexpr uint32_t kInitStream = 2;
  void init(float* adapter, uint64_t seed) const;

 private:
  LoraConfig lora_;
  std::vector<ParamInfo> params_;
  std::vector<std::array<LoraSlot, kNumLoraTargets>> slots_;
  int64_t total_ = 0;
};

// PEFT's key of adapter tensor `which` ("lora_A" or "lora_B") of layer l's projection t.
std::string lora_key(int layer, LoraTarget t, const char* which);

// W += (alpha / r) · B·A for every adapter, into the base weights (the model's ParamTable
// layout), each element's sum accumulated in double and rounded once. T: float or double.
template <typename T>
void merge_lora(const ParamTable& base_table, std::vector<T>& base, const AdapterTable& table,
                const std::vector<T>& adapter);

}  // namespace forge
