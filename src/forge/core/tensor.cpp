#include "forge/core/tensor.h"

#include "forge/core/error.h"

namespace forge {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF64: return 8;
    case DType::kF32: case DType::kI32: case DType::kU32: return 4;
    case DType::kBF16: case DType::kF16: case DType::kU16: return 2;
    case DType::kF8E4M3: case DType::kF8E5M2: return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kF64: return "f64";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
    case DType::kI32: return "i32";
    case DType::kU16: return "u16";
    case DType::kU32: return "u32";
    case DType::kF8E4M3: return "f8e4m3";
    case DType::kF8E5M2: return "f8e5m2";
  }
  return "?";
}

const char* device_name(Device d) { return d == Device::kCpu ? "cpu" : "cuda"; }

Device parse_device(const std::string& s) {
  if (s == "cpu") return Device::kCpu;
  if (s == "cuda") return Device::kCuda;
  throw Error(str("unknown device ", quote(s), " (expected cpu or cuda)"));
}

DType parse_precision(const std::string& s) {
  if (s == "fp32") return DType::kF32;
  if (s == "bf16") return DType::kBF16;
  if (s == "fp16") return DType::kF16;
  throw Error(str("unknown precision ", quote(s), " (expected fp32, bf16 or fp16)"));
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

Tensor Tensor::contiguous(void* data, Shape shape, DType dtype, Device device) {
  Tensor t;
  t.data = data;
  t.strides.assign(shape.size(), 1);
  for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) t.strides[i] = t.strides[i + 1] * shape[i + 1];
  t.shape = std::move(shape);
  t.dtype = dtype;
  t.device = device;
  return t;
}

bool Tensor::is_contiguous() const {
  int64_t expect = 1;
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
    if (shape[i] != 1 && strides[i] != expect) return false;
    expect *= shape[i];
  }
  return true;
}

}  // namespace forge
