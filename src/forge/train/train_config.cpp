#include "forge/train/train_config.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <limits>
#include <nlohmann/json.hpp>
#include <type_traits>

#include "forge/core/error.h"
#include "forge/model/model_dir.h"

namespace forge {

namespace {

constexpr int kIntMin = std::numeric_limits<int>::min();
constexpr int kIntMax = std::numeric_limits<int>::max();
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr const char* kSaveDtypes[] = {"f32", "bf16"};
constexpr const char* kSftOverlong[] = {"truncate", "skip"};
constexpr const char* kSftLayouts[] = {"pad", "pack"};
constexpr const char* kRecompute[] = {"none", "attn", "mlp", "full"};

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
    {"save_dtype", "D", "weights of the final model (checkpoints stay f32)",
     ChoiceMember{&TrainConfig::save_dtype, kSaveDtypes}},
    {"save_shard_size", "BYTES", "largest weights file of a saved model; above it: shards + index",
     ByteSizeMember{&TrainConfig::save_shard_size}},
    {"max_bad_steps", "N",
     "stop after N steps in a row with a non-finite loss or gradient norm (each is skipped)",
     IntMember{&TrainConfig::max_bad_steps, 1, kIntMax}},
    {"loss_spike_z", "X",
     "warn when a loss is X standard deviations above the last 128 steps' mean; 0: never",
     DoubleMember{&TrainConfig::loss_spike_z, {0, kInf}}},
    {"epochs", "N",
     "--sft: passes over the train examples, which sets steps; 0: steps decides",
     IntMember{&TrainConfig::epochs, 0, kIntMax}},
    {"sft_val_frac", "X", "--sft: fraction of the examples held out for validation",
     DoubleMember{&TrainConfig::sft_val_frac, {0, 0.5}}},
    {"sft_overlong", "M", "--sft: an example longer than seq_len + 1 tokens is cut or skipped",
     ChoiceMember{&TrainConfig::sft_overlong, kSftOverlong}},
    {"sft_layout", "L",
     "--sft: one example a row, padded, or several packed (attention kept inside each)",
     ChoiceMember{&TrainConfig::sft_layout, kSftLayouts}},
    {"recompute", "R",
     "activations the backward recomputes instead of keeping (less memory, same results)",
     ChoiceMember{&TrainConfig::recompute, kRecompute}},
    {"dp_bucket", "BYTES",
     "data parallel: smallest gradient bucket (f32) reduce-scattered during the backward",
     ByteSizeMember{&TrainConfig::dp_bucket}},
};

// "5GB" -> 5'000'000'000 (ByteSizeMember's syntax); throws naming `what` otherwise.
int64_t parse_byte_size(const std::string& what, std::string_view text) {
  auto bad = [&] {
    return Error(str(what,
                     ": expected a size in bytes >= 1 (an integer, optionally followed by K, ",
                     "M, G, T, KB, MB, GB, TB, KiB, MiB, GiB or TiB), got ", quote(text)));
  };
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  int64_t n = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + digits, n);
  if (digits == 0 || ec != std::errc() || end != text.data() + digits) throw bad();
  std::string unit;
  for (const char c : text.substr(digits))
    unit += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  constexpr std::pair<const char*, int64_t> kUnits[] = {{"", 1},
                                                        {"K", 1'000},
                                                        {"KB", 1'000},
                                                        {"M", 1'000'000},
                                                        {"MB", 1'000'000},
                                                        {"G", 1'000'000'000},
                                                        {"GB", 1'000'000'000},
                                                        {"T", 1'000'000'000'000},
                                                        {"TB", 1'000'000'000'000},
                                                        {"KIB", int64_t{1} << 10},
                                                        {"MIB", int64_t{1} << 20},
                                                        {"GIB", int64_t{1} << 30},
                                                        {"TIB", int64_t{1} << 40}};
  for (const auto& [name, scale] : kUnits) {
    if (unit != name) continue;
    int64_t bytes = 0;
    if (__builtin_mul_overflow(n, scale, &bytes) || bytes < 1) throw bad();
    return bytes;
  }
  throw bad();
}

std::string choices_text(const ChoiceMember& m) {
  std::string s;
  for (size_t i = 0; i < m.choices.size(); ++i)
    s += str(i == 0 ? "" : i + 1 == m.choices.size() ? " or " : ", ", m.choices[i]);
  return s;
}

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
        else if constexpr (std::is_same_v<M, DoubleMember>)
          cfg.*m.ptr = parse_double(what, text, ranged ? m.range : Interval{});
        else if constexpr (std::is_same_v<M, ByteSizeMember>)
          cfg.*m.ptr = parse_byte_size(what, text);
        else if (std::find(m.choices.begin(), m.choices.end(), text) != m.choices.end())
          cfg.*m.ptr = std::string(text);
        else
          throw Error(str(what, ": expected ", choices_text(m), ", got ", quote(text)));
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
  if (const auto* c = std::get_if<ChoiceMember>(&f.member)) return cfg.*c->ptr;
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
        } else if constexpr (std::is_same_v<M, DoubleMember>) {
          return m.range.bounds();
        } else if constexpr (std::is_same_v<M, ByteSizeMember>) {
          return ">= 1; K/M/G/KB/MB/GB = 10^3/10^6/10^9, KiB/MiB/GiB = 2^10/2^20/2^30";
        } else {
          return choices_text(m);
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
  // type ("5", null, 1.5 for an integer) fails it with the key named. Names and sizes may be
  // strings ("bf16", "2GB"): those are parsed as they are, without the quotes.
  for (const TrainField& f : kTrainFields) {
    if (!j.contains(f.name)) continue;
    const nlohmann::json& v = j.at(f.name);
    const bool text = std::holds_alternative<ChoiceMember>(f.member) ||
                      std::holds_alternative<ByteSizeMember>(f.member);
    set_field(cfg, f, str(where, ": train.", f.name),
              text && v.is_string() ? v.get<std::string>() : v.dump(), false);
  }
  return cfg;
}

}  // namespace forge
