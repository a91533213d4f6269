// Tensor: a non-owning view (pointer, shape, strides, dtype, device). Ownership lives with
// whoever allocated the memory (the parameter buffer, an activation arena, an mmap'd file).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "forge/core/dtype.h"

namespace forge {

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);  // "[2, 3, 4]"

struct Tensor {
  void* data = nullptr;
  Shape shape;
  Shape strides;  // in elements
  DType dtype = DType::kF32;
  Device device = Device::kCpu;

  // A contiguous (row-major) view.
  static Tensor contiguous(void* data, Shape shape, DType dtype, Device device = Device::kCpu);

  int64_t numel() const { return shape_numel(shape); }
  int64_t dim() const { return static_cast<int64_t>(shape.size()); }
  bool is_contiguous() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  template <typename T>
  T* ptr() const { return static_cast<T*>(data); }
};

}  // namespace forge
