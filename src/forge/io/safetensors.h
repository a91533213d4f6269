// Reading and writing safetensors files, the format of Hugging Face model directories.
//
// Layout: an 8-byte little-endian u64 N, N bytes of UTF-8 JSON mapping each tensor name to
// {"dtype", "shape", "data_offsets": [begin, end]} (plus an optional "__metadata__" object of
// string -> string), then the data section; offsets are relative to its start (byte 8 + N).
//
// Reading maps the file read-only and validates the whole header on open, so that afterwards
// every TensorInfo describes bytes inside the mapping: data(t) never needs a check, and a
// corrupt or hostile file fails once, with one line naming the file and the problem, instead
// of crashing a load halfway. Nothing in the header is trusted: sizes are checked for overflow
// before use, and the data are never copied until a caller asks for them.
//
// Writing produces what the Python `safetensors` library writes: compact JSON with
// "__metadata__" first, padded with spaces so the data section starts 8-byte aligned, tensors
// contiguous in the order given. The file is streamed through io::AtomicFile (atomic_file.h:
// `path.tmp`, fsync, rename), so a crash or an I/O error never leaves a half-written file where
// a good one was.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "forge/core/tensor.h"

namespace forge::io {

// kF8E4M3 / kF8E5M2: "F8_E4M3" / "F8_E5M2", the 8-bit floats of FP8 checkpoints (io/fp8.h).
enum class StDType { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kU16, kU32, kU64, kBool, kF8E4M3, kF8E5M2 };

// Bytes per element of a safetensors dtype.
size_t st_dtype_size(StDType t);
// The dtype's name in the header: "F32", "BF16", "BOOL", ...
const char* st_dtype_name(StDType t);

struct TensorInfo {
  std::string name;
  StDType dtype = StDType::kF32;
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte range within the data section
};

// A safetensors file mapped into memory; valid (every tensor in range, sized to its shape,
// none overlapping) once open() returns.
class SafetensorsFile {
 public:
  // Maps and validates the file; throws forge::Error "<path>: <problem>".
  static SafetensorsFile open(const std::string& path);

  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  // All tensors, sorted by data offset (the order they lie in the file).
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // The tensor called `name`, or nullptr.
  const TensorInfo* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The tensor's bytes inside the mapping (little-endian, no alignment guaranteed).
  const uint8_t* data(const TensorInfo& t) const { return data_section_ + t.begin; }
  // The tensor converted to f32 (from F32, F16, BF16, F64, F8_E4M3 or F8_E5M2); throws forge::Error naming the
  // tensor when it is missing or of another dtype.
  std::vector<float> read_f32(const std::string& name) const;
  // The same into out[0, n); throws forge::Error when n is not the tensor's element count.
  void read_f32_into(const std::string& name, float* out, size_t n) const;
  // Gives the whole pages inside the tensor's bytes back to the kernel: a loader that has
  // converted a tensor keeps its memory to the converted copy (the pages are read from the file
  // again if the tensor is read again).
  void release_pages(const TensorInfo& t) const;
  const std::string& path() const { return path_; }

 private:
  SafetensorsFile() = default;
  void unmap();

  std::string path_;
  const uint8_t* map_ = nullptr;  // the whole file
  size_t map_size_ = 0;
  const uint8_t* data_section_ = nullptr;  // map_ + 8 + N
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> index_;  // name -> position in tensors_
  std::map<std::string, std::string> metadata_;
};

struct TensorToWrite {
  std::string name;
  StDType dtype = StDType::kF32;
  Shape shape;
  const void* data = nullptr;  // numel · st_dtype_size(dtype) bytes, little-endian
};

// Writes `tensors` (in this order) and `metadata` to `path` atomically (via path + ".tmp").
// Throws forge::Error on a bad tensor (duplicate or reserved name, negative dim) or an I/O
// failure, naming the path and the system's reason; the previous file at `path` is untouched.
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace forge::io
