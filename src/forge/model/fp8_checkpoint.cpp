#include "forge/model/fp8_checkpoint.h"

#include "forge/core/error.h"

namespace forge {

namespace {

Error unsupported(const std::string& what) {
  return Error(str("quantization_config: ", what, " is not supported (Forge reads unquantized checkpoints and "
                   "block-scaled FP8 ones, quant_method \"fp8\")"));
}

}  // namespace

Fp8Blocks fp8_quantization(const nlohmann::json& config) {
  if (!config.is_object() || !config.contains("quantization_config")) return {};
  const nlohmann::json& q = config["quantization_config"];
  if (q.is_null()) return {};
  if (!q.is_object()) throw Error(str("quantization_config is a JSON ", q.type_name(), ", expected an object"));
  const nlohmann::json method = q.value("quant_method", nlohmann::json());
  if (!method.is_string()) throw unsupported("a quantization_config without a quant_method string");
  if (method != "fp8") throw unsupported(str("quant_method ", quote(method.get<std::string>())));
  const nlohmann::json fmt = q.value("fmt", nlohmann::json("e4m3"));
  if (fmt != "e4m3") throw unsupported(str("fmt ", quote(fmt.is_string() ? fmt.get<std::string>() : fmt.dump())));
  const nlohmann::json act = q.value("activation_scheme", nlohmann::json("dynamic"));
  if (act != "dynamic")
    throw unsupported(str("activation_scheme ", quote(act.is_string() ? act.get<std::string>() : act.dump())));
  const nlohmann::json& bs = q.contains("weight_block_size") ? q["weight_block_size"] : nlohmann::json();
  auto positive = [](const nlohmann::json& v) {
    return v.is_number_integer() && v.get<int64_t>() > 0 && v.get<int64_t>() <= (1 << 20);
  };
  if (!bs.is_array() || bs.size() != 2 || !positive(bs[0]) || !positive(bs[1]))
    throw unsupported(str("weight_block_size ", bs.is_null() ? std::string("(missing: per-tensor FP8 scales)") : bs.dump()));
  return {bs[0].get<int>(), bs[1].get<int>()};
}

void apply_fp8_block_scales(float* w, int64_t rows, int64_t cols, const float* s, Fp8Blocks b) {
  const int64_t scale_cols = (cols + b.cols - 1) / b.cols;
  for (int64_t r = 0; r < rows; ++r) {
    const float* srow = s + (r / b.rows) * scale_cols;
    float* wrow = w + r * cols;
    for (int64_t c = 0; c < cols; ++c) wrow[c] *= srow[c / b.cols];
  }
}

std::string fp8_feature(Fp8Blocks b) {
  return str("FP8 weights (E4M3, ", b.rows, "x", b.cols, " blocks), dequantized to f32 on load");
}

}  // namespace forge
