#include "forge/generate/sampling_settings.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "forge/core/error.h"
#include "forge/core/parse.h"

namespace forge {

namespace {

constexpr double kFloatMax = std::numeric_limits<float>::max();

std::string name_of(const char* key, SettingNames names) {
  if (names == SettingNames::kKeys) return key;
  std::string flag = std::string("--") + key;
  for (char& c : flag)
    if (c == '_') c = '-';
  return flag;
}

// The sampler holds these as floats: a value must fit one (and be finite) as well.
void check_number(const std::optional<double>& v, const char* key, const Interval& range,
                  SettingNames names) {
  if (!v) return;
  if (!range.contains(*v))
    throw Error(str(name_of(key, names), ": expected ", range.describe(), ", got ",
                    nlohmann::json(*v).dump()));  // shortest text that reads back as *v
  if (std::fabs(*v) > kFloatMax)
    throw Error(str(name_of(key, names), ": expected a value that fits a 32-bit float, got ",
                    nlohmann::json(*v).dump()));
}

void check_integer(const std::optional<int64_t>& v, const char* key, int64_t hi,
                   SettingNames names) {
  if (v && (*v < 0 || *v > hi))
    throw Error(str(name_of(key, names), ": expected an integer in [0, ", hi, "], got ", *v));
}

}  // namespace

SamplingOverrides SamplingOverrides::over(const SamplingOverrides& base) const {
  SamplingOverrides r = base;
  if (temperature) r.temperature = temperature;
  if (top_k) r.top_k = top_k;
  if (top_p) r.top_p = top_p;
  if (min_p) r.min_p = min_p;
  if (repetition_penalty) r.repetition_penalty = repetition_penalty;
  if (max_new_tokens) r.max_new_tokens = max_new_tokens;
  if (seed) r.seed = seed;
  return r;
}

void check_sampling(const SamplingOverrides& s, SettingNames names) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  check_number(s.temperature, "temperature", {0, kInf}, names);
  check_integer(s.top_k, "top_k", std::numeric_limits<int32_t>::max(), names);
  check_number(s.top_p, "top_p", {0, 1, true, false}, names);
  check_number(s.min_p, "min_p", {0, 1, false, true}, names);
  check_number(s.repetition_penalty, "repetition_penalty", {0, kInf, true, false}, names);
  check_integer(s.max_new_tokens, "max_new_tokens", std::numeric_limits<int>::max(), names);
}

SamplerSettings apply_sampling(const SamplingOverrides& s, SamplerSettings base) {
  check_sampling(s);
  if (s.temperature) base.temperature = static_cast<float>(*s.temperature);
  if (s.top_k) base.top_k = static_cast<int32_t>(*s.top_k);
  if (s.top_p) base.top_p = static_cast<float>(*s.top_p);
  if (s.min_p) base.min_p = static_cast<float>(*s.min_p);
  if (s.repetition_penalty) base.repetition_penalty = static_cast<float>(*s.repetition_penalty);
  if (s.seed) base.seed = *s.seed;
  return base;
}

}  // namespace forge
