// libFuzzer target: arbitrary bytes as a safetensors file. Opening must either succeed with
// every tensor inside the mapping or throw forge::Error; reading any tensor as f32 must either
// convert it or throw forge::Error. Anything else (a crash, an ASan report, another exception,
// a FORGE_CHECK abort) is a bug.
//
// SafetensorsFile::open takes a path, so each input is written to a memfd and opened through
// /proc/self/fd: no disk traffic, and the real mmap path is what gets exercised.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "forge/core/error.h"
#include "forge/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const int fd = memfd_create("fuzz.safetensors", 0);
  if (fd < 0) return 0;
  if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) return 0;
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  try {
    const auto f = forge::io::SafetensorsFile::open(path);
    uint64_t sum = 0;
    for (const auto& t : f.tensors()) {
      const uint8_t* p = f.data(t);
      for (uint64_t i = t.begin; i < t.end; ++i) sum += p[i - t.begin];  // in range, per ASan
      try {
        const std::vector<float> v = f.read_f32(t.name);
        sum += v.size();
      } catch (const forge::Error&) {
      }
    }
    f.find("x");
    (void)sum;
  } catch (const forge::Error&) {
  }
  return 0;
}
