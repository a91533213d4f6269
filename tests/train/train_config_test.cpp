#include "forge/train/train_config.h"

#include <charconv>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "forge/core/error.h"
#include "forge/model/model_dir.h"
#include "testing.h"

namespace forge {
namespace {

// The members, listed by hand a second time on purpose: the table's rows are checked against
// the struct's real fields, so a row pointing at the wrong member (or a missing row) fails.
const std::map<std::string, std::function<std::string(const TrainConfig&)>>& real_members() {
  auto i = [](int TrainConfig::*m) {
    return [m](const TrainConfig& c) { return std::to_string(c.*m); };
  };
  auto d = [](double TrainConfig::*m) {
    return [m](const TrainConfig& c) {
      char buf[32];
      return std::string(buf, std::to_chars(buf, buf + sizeof(buf), c.*m).ptr);
    };
  };
  static const std::map<std::string, std::function<std::string(const TrainConfig&)>> m = {
      {"steps", i(&TrainConfig::steps)},
      {"batch_size", i(&TrainConfig::batch_size)},
      {"seq_len", i(&TrainConfig::seq_len)},
      {"grad_accum", i(&TrainConfig::grad_accum)},
      {"lr", d(&TrainConfig::lr)},
      {"min_lr_frac", d(&TrainConfig::min_lr_frac)},
      {"warmup_steps", i(&TrainConfig::warmup_steps)},
      {"weight_decay", d(&TrainConfig::weight_decay)},
      {"beta1", d(&TrainConfig::beta1)},
      {"beta2", d(&TrainConfig::beta2)},
      {"eps", d(&TrainConfig::eps)},
      {"grad_clip", d(&TrainConfig::grad_clip)},
      {"eval_every", i(&TrainConfig::eval_every)},
      {"eval_windows", i(&TrainConfig::eval_windows)},
      {"seed", [](const TrainConfig& c) { return std::to_string(c.seed); }},
      {"save_every", i(&TrainConfig::save_every)},
      {"keep_checkpoints", i(&TrainConfig::keep_checkpoints)},
      {"save_dtype", [](const TrainConfig& c) { return c.save_dtype; }},
      {"save_shard_size", [](const TrainConfig& c) { return std::to_string(c.save_shard_size); }},
      {"max_bad_steps", i(&TrainConfig::max_bad_steps)},
      {"loss_spike_z", d(&TrainConfig::loss_spike_z)},
      {"epochs", i(&TrainConfig::epochs)},
      {"sft_val_frac", d(&TrainConfig::sft_val_frac)},
      {"sft_overlong", [](const TrainConfig& c) { return c.sft_overlong; }},
      {"sft_layout", [](const TrainConfig& c) { return c.sft_layout; }},
      {"recompute", [](const TrainConfig& c) { return c.recompute; }},
      {"dp_bucket", [](const TrainConfig& c) { return std::to_string(c.dp_bucket); }},
  };
  return m;
}

// A value for field number k that no other field gets and no default equals: integers
// 2 + k, doubles just above 1 / (k + 3) (a value with all 52 mantissa bits in play), the seed
// 2^64 - 1, a size beyond 32 bits, the last choice (the defaults are the first). Each is inside
// its field's range.
std::string distinct_value(const TrainField& f, int k) {
  return std::visit(
      [&](const auto& m) -> std::string {
        using M = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<M, IntMember>) return std::to_string(2 + k);
        if constexpr (std::is_same_v<M, Uint64Member>) return "18446744073709551615";
        if constexpr (std::is_same_v<M, ByteSizeMember>)
          return std::to_string((int64_t{1} << 33) + k);
        if constexpr (std::is_same_v<M, ChoiceMember>) return m.choices.back();
        char buf[32];
        const double x = std::nextafter(1.0 / (k + 3), 1.0);
        return std::string(buf, std::to_chars(buf, buf + sizeof(buf), x).ptr);
      },
      f.member);
}

TEST(TrainConfig, TableListsEveryFieldOnce) {
  std::set<std::string> names;
  for (const TrainField& f : train_fields()) {
    EXPECT_TRUE(names.insert(f.name).second) << f.name << " twice";
    EXPECT_TRUE(real_members().count(f.name)) << f.name << " is not a TrainConfig member";
    EXPECT_EQ(find_train_field(f.name), &f);
  }
  EXPECT_EQ(names.size(), real_members().size());
  EXPECT_EQ(find_train_field("n_layer"), nullptr);
  EXPECT_EQ(find_train_field("quiet"), nullptr);  // a run option, not a setting
}

// config.json exactly as the hand-written train_config_json wrote it before the table: same
// keys, same JSON types, same text (plus the keys added since: save_dtype, save_shard_size,
// max_bad_steps, loss_spike_z, epochs, sft_val_frac, sft_overlong, sft_layout, recompute,
// dp_bucket).
// Old run directories are read with these keys.
TEST(TrainConfig, JsonIsTheFormatOldRunsHave) {
  EXPECT_EQ(train_config_json(TrainConfig{}).dump(),
            R"({"batch_size":8,"beta1":0.9,"beta2":0.95,"dp_bucket":16777216,"epochs":0,"eps":1e-08,"eval_every":100,)"
            R"("eval_windows":64,"grad_accum":1,"grad_clip":1.0,"keep_checkpoints":3,)"
            R"("loss_spike_z":5.0,"lr":0.0006,"max_bad_steps":5,)"
            R"("min_lr_frac":0.1,"recompute":"none","save_dtype":"f32","save_every":0,"save_shard_size":5000000000,)"
            R"("seed":1337,"seq_len":0,"sft_layout":"pad","sft_overlong":"truncate","sft_val_frac":0.05,)"
            R"("steps":1000,"warmup_steps":-1,"weight_decay":0.1})");
  EXPECT_TRUE(train_config_json(TrainConfig{})["seed"].is_number_unsigned());
}

TEST(TrainConfig, OldRunConfigReadsBackExactly) {
  // As an older forge wrote it, with values that a double or an int would not carry.
  const auto j = nlohmann::json::parse(
      R"({"batch_size":3,"beta1":0.8999999999999999,"beta2":0.999,"eps":1e-10,"eval_every":7,)"
      R"("eval_windows":5,"grad_accum":4,"grad_clip":0.0,"keep_checkpoints":2,)"
      R"("lr":0.00030000000000000003,"min_lr_frac":0.05,"save_every":6,)"
      R"("seed":18446744073709551615,"seq_len":32,"steps":12,"warmup_steps":3,)"
      R"("weight_decay":0.0})");
  const TrainConfig c = train_config_from_json(j, "run/config.json");
  EXPECT_EQ(c.steps, 12);
  EXPECT_EQ(c.batch_size, 3);
  EXPECT_EQ(c.seq_len, 32);
  EXPECT_EQ(c.grad_accum, 4);
  EXPECT_EQ(c.lr, 0.00030000000000000003);
  EXPECT_NE(c.lr, 3e-4);  // the test can see a rounding
  EXPECT_EQ(c.min_lr_frac, 0.05);
  EXPECT_EQ(c.warmup_steps, 3);
  EXPECT_EQ(c.weight_decay, 0.0);
  EXPECT_EQ(c.beta1, 0.8999999999999999);
  EXPECT_NE(c.beta1, 0.9);
  EXPECT_EQ(c.beta2, 0.999);
  EXPECT_EQ(c.eps, 1e-10);
  EXPECT_EQ(c.grad_clip, 0.0);
  EXPECT_EQ(c.eval_every, 7);
  EXPECT_EQ(c.eval_windows, 5);
  EXPECT_EQ(c.seed, UINT64_MAX);
  EXPECT_EQ(c.save_every, 6);
  EXPECT_EQ(c.keep_checkpoints, 2);
  EXPECT_EQ(c.save_dtype, "f32");  // keys added since: their defaults
  EXPECT_EQ(c.save_shard_size, 5'000'000'000);
  EXPECT_EQ(c.max_bad_steps, 5);
  EXPECT_EQ(c.loss_spike_z, 5.0);
  EXPECT_EQ(c.epochs, 0);
  EXPECT_EQ(c.sft_val_frac, 0.05);
  EXPECT_EQ(c.sft_overlong, "truncate");
  EXPECT_EQ(c.sft_layout, "pad");
  EXPECT_EQ(c.recompute, "none");
  nlohmann::json back = j;  // and writes back the same object, with those keys added
  back["save_dtype"] = "f32";
  back["save_shard_size"] = 5'000'000'000;
  back["max_bad_steps"] = 5;
  back["loss_spike_z"] = 5.0;
  back["epochs"] = 0;
  back["sft_val_frac"] = 0.05;
  back["sft_overlong"] = "truncate";
  back["sft_layout"] = "pad";
  back["recompute"] = "none";
  back["dp_bucket"] = 16777216;
  EXPECT_EQ(train_config_json(c), back);
}

// For every row: the override sets the real member, config.json holds the value under the
// row's key with the same bits, and reading config.json gives the same configuration.
TEST(TrainConfig, OverrideJsonWriteAndReadAgreeForEveryField) {
  TrainConfig c;
  std::map<std::string, std::string> given;
  int k = 0;
  for (const TrainField& f : train_fields()) {
    const std::string v = distinct_value(f, k++);
    ASSERT_TRUE(c.apply_override(f.name, v)) << f.name;
    given[f.name] = v;
  }
  const nlohmann::json j = train_config_json(c);
  const TrainConfig back = train_config_from_json(nlohmann::json::parse(j.dump()), "config.json");
  for (const auto& [name, v] : given) {
    SCOPED_TRACE(name);
    EXPECT_EQ(real_members().at(name)(c), v);  // the override reached the member of that name
    EXPECT_EQ(real_members().at(name)(back), v);
    ASSERT_TRUE(j.contains(name));
    const std::string text = j[name].is_string() ? j[name].get<std::string>() : j[name].dump();
    if (j[name].is_number_float()) {
      EXPECT_EQ(j[name].get<double>(), std::stod(v));
    } else {
      EXPECT_EQ(text, v);
    }
    EXPECT_EQ(train_field_text(c, *find_train_field(name)), text);
  }
  EXPECT_EQ(train_config_json(back), j);
}

// Every row refuses the value just outside its range, naming the key and the range.
TEST(TrainConfig, OverridesOutsideTheRangeAreErrorsNamingTheKey) {
  for (const TrainField& f : train_fields()) {
    SCOPED_TRACE(f.name);
    std::string below;
    std::visit(
        [&](const auto& m) {
          using M = std::decay_t<decltype(m)>;
          if constexpr (std::is_same_v<M, IntMember>) {
            below = std::to_string(static_cast<int64_t>(m.lo) - 1);
          } else if constexpr (std::is_same_v<M, Uint64Member>) {
            below = "-1";
          } else if constexpr (std::is_same_v<M, ByteSizeMember>) {
            below = "0";
          } else if constexpr (std::is_same_v<M, ChoiceMember>) {
            below = "f16";
          } else if (std::isfinite(m.range.lo)) {
            const double x = m.range.lo_open ? m.range.lo : std::nextafter(m.range.lo, -1e300);
            char buf[32];
            below = std::string(buf, std::to_chars(buf, buf + sizeof(buf), x).ptr);
          } else {
            below = "nan";
          }
        },
        f.member);
    TrainConfig c;
    try {
      c.apply_override(f.name, below);
      ADD_FAILURE() << f.name << "=" << below << " was accepted";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.find(std::string(f.name) + ": expected "), 0u) << msg;
      EXPECT_NE(msg.find("got '" + below + "'"), std::string::npos) << msg;
    }
    EXPECT_THROW(c.apply_override(f.name, ""), Error);
    EXPECT_THROW(c.apply_override(f.name, "1x"), Error);
  }
  TrainConfig c;
  EXPECT_THROW(c.apply_override("steps", "4294967297"), Error);
  EXPECT_THROW(c.apply_override("beta2", "1"), Error);
  EXPECT_THROW(c.apply_override("eps", "0"), Error);
  EXPECT_THROW(c.apply_override("min_lr_frac", "1.5"), Error);
  EXPECT_FALSE(c.apply_override("n_layer", "2"));
}

TEST(TrainConfig, BadConfigJsonIsAnErrorNamingFileAndKey) {
  auto error_of = [](const char* text) -> std::string {
    try {
      train_config_from_json(nlohmann::json::parse(text), "run/config.json");
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(error_of(R"({"steps": 4294967297})"),
            "run/config.json: train.steps: expected an integer in [-2147483648, 2147483647], "
            "got '4294967297'");
  EXPECT_NE(error_of(R"({"steps": "5"})").find("train.steps"), std::string::npos);
  EXPECT_NE(error_of(R"({"steps": 5.0})").find("train.steps"), std::string::npos);
  EXPECT_NE(error_of(R"({"seed": -1})").find("train.seed"), std::string::npos);
  EXPECT_NE(error_of(R"({"lr": null})").find("train.lr"), std::string::npos);
  EXPECT_NE(error_of(R"([1, 2])").find("expected an object"), std::string::npos);
  // A run's own file is read for what its types hold, not today's ranges: a run written
  // before the ranges were checked resumes. Missing keys keep their defaults, unknown ones
  // are ignored.
  EXPECT_EQ(error_of(R"({"keep_checkpoints": -1, "eval_windows": 0, "future_key": 1})"), "");
  const TrainConfig c = train_config_from_json(nlohmann::json::parse(R"({"steps": 5})"), "x");
  EXPECT_EQ(c.steps, 5);
  EXPECT_EQ(c.lr, TrainConfig{}.lr);
  EXPECT_EQ(c.seed, TrainConfig{}.seed);
}

// save_shard_size takes byte counts as transformers' max_shard_size does ("5GB" = 5·10^9) and
// binary units; save_dtype takes f32 or bf16. Anything else is a one-line error naming the key.
TEST(TrainConfig, SaveSettingsParseSizesAndDtypes) {
  TrainConfig c;
  // A test, not a static_assert in train_config.cpp: clang 14 cannot evaluate TrainConfig{}
  // (its std::string members) in a constant expression with libstdc++ 12.
  EXPECT_EQ(c.save_shard_size, kDefaultShardSize);
  const std::pair<const char*, int64_t> sizes[] = {{"1", 1},
                                                   {"300", 300},
                                                   {"5GB", 5'000'000'000},
                                                   {"5gb", 5'000'000'000},
                                                   {"2G", 2'000'000'000},
                                                   {"10MB", 10'000'000},
                                                   {"7K", 7'000},
                                                   {"3KB", 3'000},
                                                   {"1TB", 1'000'000'000'000},
                                                   {"2GiB", int64_t{2} << 30},
                                                   {"4MiB", int64_t{4} << 20},
                                                   {"1kib", 1024},
                                                   {"9223372036854775807", INT64_MAX}};
  for (const auto& [text, bytes] : sizes) {
    ASSERT_TRUE(c.apply_override("save_shard_size", text)) << text;
    EXPECT_EQ(c.save_shard_size, bytes) << text;
  }
  for (const char* bad : {"0", "0GB", "-1", "5XB", "GB", "5 GB", "1.5GB", "+5",
                          "9223372036854775808", "10000000000TB", "5GBB"}) {
    try {
      c.apply_override("save_shard_size", bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.find("save_shard_size: expected a size in bytes >= 1"), 0u) << msg;
      EXPECT_NE(msg.find(std::string("got '") + bad + "'"), std::string::npos) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
  }
  ASSERT_TRUE(c.apply_override("save_dtype", "bf16"));
  EXPECT_EQ(c.save_dtype, "bf16");
  for (const char* bad : {"fp16", "BF16", "bfloat16", ""}) {
    try {
      c.apply_override("save_dtype", bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()),
                std::string("save_dtype: expected f32 or bf16, got '") + bad + "'");
    }
  }
  // config.json: sizes as numbers (what train_config_json writes) or strings; dtypes as strings.
  const TrainConfig j = train_config_from_json(
      nlohmann::json::parse(R"({"save_shard_size": "2MiB", "save_dtype": "bf16"})"), "c.json");
  EXPECT_EQ(j.save_shard_size, 2 << 20);
  EXPECT_EQ(j.save_dtype, "bf16");
  EXPECT_EQ(train_config_json(j)["save_shard_size"], 2 << 20);
  EXPECT_THROW(train_config_from_json(nlohmann::json::parse(R"({"save_dtype": 16})"), "c.json"),
               Error);
  EXPECT_EQ(train_field_range(*find_train_field("save_dtype")), "f32 or bf16");
}

// recompute: the four levels, kept in config.json (what --resume reads); anything else is one
// line naming the key and the levels.
TEST(TrainConfig, RecomputeTakesTheFourLevels) {
  for (const char* level : {"none", "attn", "mlp", "full"}) {
    TrainConfig c;
    ASSERT_TRUE(c.apply_override("recompute", level));
    EXPECT_EQ(c.recompute, level);
    EXPECT_EQ(train_config_json(c)["recompute"], level);
    EXPECT_EQ(train_config_from_json(train_config_json(c), "config.json").recompute, level);
  }
  TrainConfig c;
  try {
    c.apply_override("recompute", "everything");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "recompute: expected none, attn, mlp or full, got 'everything'");
  }
  EXPECT_EQ(c.recompute, "none");
  nlohmann::json j = train_config_json(TrainConfig{});
  j["recompute"] = "some";
  try {
    train_config_from_json(j, "run/config.json");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "run/config.json: train.recompute: expected none, attn, mlp or full, got 'some'");
  }
}

}  // namespace
}  // namespace forge
