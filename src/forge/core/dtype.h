// Element types and devices. Dispatch on dtype happens in one place per op (a switch over
// DType), never through a global precision typedef.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace forge {

// kF8E4M3 / kF8E5M2: the 8-bit floats of Hopper's tensor cores (io/fp8.h), GEMM operands only.
enum class DType : uint8_t { kF32, kF64, kBF16, kF16, kI32, kU16, kU32, kF8E4M3, kF8E5M2 };
enum class Device : uint8_t { kCpu, kCuda };

size_t dtype_size(DType t);
const char* dtype_name(DType t);   // "f32", "bf16", ...
const char* device_name(Device d); // "cpu", "cuda"
// Parses "cpu" / "cuda"; throws forge::Error naming the bad value.
Device parse_device(const std::string& s);
// Parses a GPU compute precision: "fp32", "bf16" or "fp16" (the --precision values); throws
// forge::Error naming the bad value.
DType parse_precision(const std::string& s);

}  // namespace forge
