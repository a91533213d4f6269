#include "forge/model/lora.h"

#include <algorithm>
#include <cmath>

#include "forge/core/error.h"
#include "forge/core/rng.h"

namespace forge {

namespace {

constexpr std::array<LoraTarget, kNumLoraTargets> kAllTargets{
    LoraTarget::kQ, LoraTarget::kK, LoraTarget::kV, LoraTarget::kO,
    LoraTarget::kGate, LoraTarget::kUp, LoraTarget::kDown};

LoraTarget parse_target(const std::string& name) {
  for (LoraTarget t : kAllTargets)
    if (name == lora_target_short_name(t) || name == lora_target_module(t)) return t;
  throw Error(str("--lora: unknown target '", name,
                  "' (expected q, k, v, o, gate, up, down or their *_proj names)"));
}

int parse_int(const std::string& key, const std::string& v) {
  size_t used = 0;
  int x = 0;
  try {
    x = std::stoi(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != v.size()) throw Error(str("--lora: ", key, "=", v, " is not an integer"));
  return x;
}

double parse_double(const std::string& key, const std::string& v) {
  size_t used = 0;
  double x = 0;
  try {
    x = std::stod(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != v.size()) throw Error(str("--lora: ", key, "=", v, " is not a number"));
  return x;
}

}  // namespace

const char* lora_target_short_name(LoraTarget t) {
  static const char* const names[] = {"q", "k", "v", "o", "gate", "up", "down"};
  return names[static_cast<int>(t)];
}

const char* lora_target_module(LoraTarget t) {
  static const char* const names[] = {"q_proj", "k_proj", "v_proj", "o_proj",
                                      "gate_proj", "up_proj", "down_proj"};
  return names[static_cast<int>(t)];
}

bool LoraConfig::targets_has(LoraTarget t) const {
  for (LoraTarget x : targets)
    if (x == t) return true;
  return false;
}

void LoraConfig::validate() const {
  if (r <= 0) throw Error(str("--lora: r must be > 0, got ", r));
  if (!std::isfinite(alpha)) throw Error(str("--lora: alpha must be finite, got ", alpha));
  if (targets.empty()) throw Error("--lora: no targets");
  for (size_t i = 0; i < targets.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (targets[i] == targets[j])
        throw Error(str("--lora: target '", lora_target_short_name(targets[i]), "' given twice"));
}

LoraConfig parse_lora_spec(const std::string& spec) {
  LoraConfig c;
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= spec.size()) {
    const size_t comma = spec.find(',', start);
    const size_t end = comma == std::string::npos ? spec.size() : comma;
    parts.push_back(spec.substr(start, end - start));
    start = end + 1;
  }
  bool in_targets = false;
  for (const std::string& p : parts) {
    const size_t eq = p.find('=');
    if (eq == std::string::npos) {
      if (!in_targets || p.empty())
        throw Error(str("--lora: '", p, "' is not key=value (keys: r, alpha, targets, dropout)"));
      c.targets.push_back(parse_target(p));
      continue;
    }
    const std::string key = p.substr(0, eq), value = p.substr(eq + 1);
    in_targets = false;
    if (key == "r") {
      c.r = parse_int(key, value);
    } else if (key == "alpha") {
      c.alpha = parse_double(key, value);
    } else if (key == "targets") {
      c.targets = {parse_target(value)};
      in_targets = true;
    } else if (key == "dropout") {
      // The adapter path has no dropout: a mask would have to be drawn per step and kept for the
      // backward, and the merged model (dropout off at inference) is the same either way.
      if (parse_double(key, value) != 0.0)
        throw Error(str("--lora: dropout=", value, " is not supported (0 only: Forge's LoRA has no dropout)"));
    } else {
      throw Error(str("--lora: unknown key '", key, "' (keys: r, alpha, targets, dropout)"));
    }
  }
  c.validate();
  return c;
}

std::string lora_key(int layer, LoraTarget t, const char* which) {
  const bool attn = t == LoraTarget::kQ || t == LoraTarget::kK || t == LoraTarget::kV || t == LoraTarget::kO;
  return str("base_model.model.model.layers.", layer, attn ? ".self_attn." : ".mlp.", lora_target_module(t), ".",
             which, ".weight");
}

AdapterTable::AdapterTable(const ModelConfig& model, const LoraConfig& lora) : lora_(lora) {
  if (model.family == Family::kGpt2)
    throw Error(
        "--lora: GPT-2 is not supported (its fused c_attn is one Conv1D module, PEFT's fan_in_fan_out "
        "layout); LoRA targets the Llama-layout families (llama, mistral, qwen2, qwen3)");
  lora.validate();
  const int C = model.n_embd, FF = model.ffn_hidden;
  const int Q = model.n_head * model.head_dim(), KV = model.n_kv_head * model.head_dim();
  slots_.resize(model.n_layer);
  for (int l = 0; l < model.n_layer; ++l) {
    for (LoraTarget t : kAllTargets) {
      if (!lora.targets_has(t)) continue;
      LoraSlot& s = slots_[l][static_cast<int>(t)];
      switch (t) {
        case LoraTarget::kQ: s.in = C, s.out = Q; break;
        case LoraTarget::kK:
        case LoraTarget::kV: s.in = C, s.out = KV; break;
        case LoraTarget::kO: s.in = Q, s.out = C; break;
        case LoraTarget::kGate:
        case LoraTarget::kUp: s.in = C, s.out = FF; break;
        case LoraTarget::kDown: s.in = FF, s.out = C; break;
      }
      for (int which = 0; which < 2; ++which) {
        ParamInfo p;
        p.name = lora_key(l, t, which == 0 ? "lora_A" : "lora_B");
        p.shape = which == 0 ? Shape{lora.r, s.in} : Shape{s.out, lora.r};
        p.offset = total_;
        p.decay = true;
        (which == 0 ? s.a : s.b) = total_;
        total_ += p.numel();
        params_.push_back(std::move(p));
      }
    }
  }
}

std::vector<int64_t> AdapterTable::layer_starts() const {
  std::vector<int64_t> starts;
  for (const auto& row : slots_) {
    int64_t lo = total_;
    for (const LoraSlot& s : row)
      if (s.a >= 0) lo = std::min({lo, s.a, s.b});
    starts.push_back(lo);
  }
  return starts;
}

void AdapterTable::init(float* adapter, uint64_t seed) const {
  Rng rng(seed, kInitStream);
  for (const auto& row : slots_) {
    for (const LoraSlot& s : row) {
      if (s.a < 0) continue;
      const double bound = 1.0 / std::sqrt(static_cast<double>(s.in));
      const int64_t na = static_cast<int64_t>(lora_.r) * s.in, nb = static_cast<int64_t>(s.out) * lora_.r;
      for (int64_t i = 0; i < na; ++i) adapter[s.a + i] = static_cast<float>((2.0 * rng.uniform() - 1.0) * bound);
      for (int64_t i = 0; i < nb; ++i) adapter[s.b + i] = 0.0f;
    }
  }
}

template <typename T>
void merge_lora(const ParamTable& base_table, std::vector<T>& base, const AdapterTable& table,
                const std::vector<T>& adapter) {
  FORGE_CHECK(static_cast<int64_t>(base.size()) == base_table.total() &&
                  static_cast<int64_t>(adapter.size()) == table.total(),
              "merge_lora: buffer sizes");
  const int r = table.lora().r;
  const double scale = table.lora().scale();
  for (int l = 0; l < table.n_layer(); ++l) {
    const LayerOffsets& o = base_table.layer(l);
    const int64_t w_off[] = {o.q_w, o.k_w, o.v_w, o.attn_out_w, o.gate_w, o.up_w, o.down_w};
    for (LoraTarget t : kAllTargets) {
      const LoraSlot& s = table.slot(l, t);
      if (s.a < 0) continue;
      T* W = base.data() + w_off[static_cast<int>(t)];  // (out, in)
      const T* A = adapter.data() + s.a;                 // (r, in)
      const T* B = adapter.data() + s.b;                 // (out, r)
#pragma omp parallel for
      for (int i = 0; i < s.out; ++i) {
        for (int j = 0; j < s.in; ++j) {
          double acc = 0;
          for (int k = 0; k < r; ++k)
            acc += static_cast<double>(B[static_cast<int64_t>(i) * r + k]) * A[static_cast<int64_t>(k) * s.in + j];
          T& w = W[static_cast<int64_t>(i) * s.in + j];
          w = static_cast<T>(static_cast<double>(w) + scale * acc);
        }
      }
    }
  }
}

template void merge_lora<float>(const ParamTable&, std::vector<float>&, const AdapterTable&,
                                const std::vector<float>&);
template void merge_lora<double>(const ParamTable&, std::vector<double>&, const AdapterTable&,
                                 const std::vector<double>&);

}  // namespace forge
