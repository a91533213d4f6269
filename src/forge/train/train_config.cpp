#include "forge/train/train_config.h"

#include <limits>
#include <nlohmann/json.hpp>
#include <type_traits>

#include "forge/core/error.h"

namespace forge {

namespace {

constexpr int kIntMin = std::numeric_limits<int>::min();
constexpr int kIntMax = std::numeric_limits<int>::max();
constexpr double kInf = std::numeric_limits<double>::infinity();

// The ranges are those the loop can run with: run() and the optimizer need positive counts,
// AdamW's bias correction divides by 1 - beta^t (beta < 1), and eps keeps never-updated rows
// (the padded vocabulary) from 0 / 0.
constexpr TrainField kTrainFields[] = {
    {"steps", "N", "optimizer steps", IntMember{&TrainConfig::steps, 1, kIntMax}},
    {"batch_size", "N", "B: sequences per micro-batch",
     IntMember{&TrainConfig::batch_size, 1, kIntMax}},
    {"seq_len", "N", "T: tokens per sequence; 0: the model's max_seq_len",
     IntMember{&TrainConfig::seq_len, 0, kIntMax}},
    {"grad_accum", "N", "micro-batches per optimizer step",
     IntMember{&TrainConfig::grad_accum, 1, kIntMax}},
    {"lr", "X", "peak learning rate", DoubleMember{&TrainConfig::lr, {0, kInf}}},
    {"min_lr_frac", "X", "cosine floor as a fraction of lr",
     DoubleMember{&TrainConfig::min_lr_frac, {0, 1}}},
    {"warmup_steps", "N", "linear warm-up steps; -1: 5% of steps",
     IntMember{&TrainConfig::warmup_steps, -1, kIntMax}},
    {"weight_decay", "X", "AdamW weight decay, on tensors with >= 2 dims",
     DoubleMember{&TrainConfig::weight_decay, {0, kInf}}},
    {"beta1", "X", "AdamW first-moment decay",
     DoubleMember{&TrainConfig::beta1, {0, 1, false, true}}},
    {"beta2", "X", "AdamW second-moment decay",
     DoubleMember{&TrainConfig::beta2, {0, 1, false, true}}},
    {"eps", "X", "AdamW epsilon", DoubleMember{&TrainConfig::eps, {0, kInf, true, false}}},
    {"grad_clip", "X", "clip the global gradient norm to X; <= 0 disables",
     DoubleMember{&TrainConfig::grad_clip, {}}},
    {"eval_every", "N", "validation every N steps and after the last",
     IntMember{&TrainConfig::eval_every, 1, kIntMax}},
    {"eval_windows", "N", "validation windows of T + 1 tokens per evaluation",
     IntMember{&TrainConfig::eval_windows, 1, kIntMax}},
    {"seed", "N", "initialisation and data order", Uint64Member{&TrainConfig::seed}},
    {"save_every", "K", "checkpoint every K steps and after the last; 0: never",
     IntMember{&TrainConfig::save_every, 0, kIntMax}},
    {"keep_checkpoints", "N", "newest checkpoints kept; 0 keeps all",
     IntMember{&TrainConfig::keep_checkpoints, 0, kIntMax}},
};

// One parse for every way in. `ranged`: the setting's own range (what users type); otherwise
// only what the member's type holds exactly, for a run's own config.json: a run written
// before the ranges were checked (keep_checkpoints=-1, eval_windows=0 ran then) still resumes.
void set_field(TrainConfig& cfg, const TrainField& f, const std::string& what,
               std::string_view text, bool ranged) {
  std::visit(
      [&](const auto& m) {
        using M = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<M, IntMember>)
          cfg.*m.ptr = parse_int(what, text, ranged ? m.lo : kIntMin, ranged ? m.hi : kIntMax);
        else if constexpr (std::is_same_v<M, Uint64Member>)
          cfg.*m.ptr = parse_uint64(what, text);
        else
          cfg.*m.ptr = parse_double(what, text, ranged ? m.range : Interval{});
      },
      f.member);
}

}  // namespace

std::span<const TrainField> train_fields() {
  return kTrainFields;
}

const TrainField* find_train_field(std::string_view name) {
  for (const TrainField& f : kTrainFields)
    if (name == f.name) return &f;
  return nullptr;
}

void set_train_field(TrainConfig& cfg, const TrainField& f, const std::string& what,
                     std::string_view text) {
  set_field(cfg, f, what, text, true);
}

bool TrainConfig::apply_override(const std::string& key, const std::string& value) {
  const TrainField* f = find_train_field(key);
  if (!f) return false;
  set_train_field(*this, *f, key, value);
  return true;
}

std::string train_field_text(const TrainConfig& cfg, const TrainField& f) {
  // nlohmann's number output: exact integers, shortest round-trip doubles ("0.0006").
  return std::visit([&](const auto& m) { return nlohmann::json(cfg.*m.ptr).dump(); }, f.member);
}

std::string train_field_range(const TrainField& f) {
  return std::visit(
      [](const auto& m) -> std::string {
        using M = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<M, IntMember>) {
          if (m.hi == kIntMax) return str(">= ", m.lo);
          return str("[", m.lo, ", ", m.hi, "]");
        } else if constexpr (std::is_same_v<M, Uint64Member>) {
          return "0 to 2^64-1";
        } else {
          return m.range.bounds();
        }
      },
      f.member);
}

nlohmann::json train_config_json(const TrainConfig& cfg) {
  nlohmann::json j = nlohmann::json::object();
  for (const TrainField& f : kTrainFields)
    std::visit([&](const auto& m) { j[f.name] = cfg.*m.ptr; }, f.member);
  return j;
}

TrainConfig train_config_from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object())
    throw Error(str(where, ": bad training configuration: expected an object, got ", j.dump()));
  TrainConfig cfg;
  // dump() of a JSON number is its exact text (integers as stored, doubles round-trip), so
  // the checked parser reads back exactly what train_config_json wrote; a value of another
  // type ("5", null, 1.5 for an integer) fails it with the key named.
  for (const TrainField& f : kTrainFields)
    if (j.contains(f.name))
      set_field(cfg, f, str(where, ": train.", f.name), j.at(f.name).dump(), false);
  return cfg;
}

}  // namespace forge
