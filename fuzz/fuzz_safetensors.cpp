// libFuzzer target: arbitrary bytes as a safetensors file (io/safetensors.h). Opening must either
// succeed with every tensor inside the mapping, sized to its shape, or throw a one-line
// forge::Error; reading any tensor as f32 must either convert it or throw one. The input is
// opened through a memfd, so the real open/mmap path is what runs.
#include <cstddef>
#include <cstdint>

#include "forge/io/safetensors.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static forge::fuzz::MemFile file("fuzz.safetensors");
  const std::string& path = file.set(data, size);
  forge::fuzz::expect_ok_or_error([&] {
    const auto f = forge::io::SafetensorsFile::open(path);
    uint64_t sum = 0;
    for (const auto& t : f.tensors()) {
      forge::fuzz::require(f.find(t.name) == &t, "find() returns the listed tensor");
      const uint64_t bytes = forge::io::st_dtype_size(t.dtype) * forge::shape_numel(t.shape);
      forge::fuzz::require(t.end - t.begin == bytes, "tensor bytes match its shape");
      const uint8_t* p = f.data(t);
      for (uint64_t i = t.begin; i < t.end; ++i) sum += p[i - t.begin];  // in range, per ASan
      forge::fuzz::expect_ok_or_error([&] {
        const std::vector<float> v = f.read_f32(t.name);
        forge::fuzz::require(v.size() == static_cast<size_t>(forge::shape_numel(t.shape)),
                             "read_f32 gives one float per element");
      });
    }
    (void)sum;
  });
  return 0;
}
