// What the CUPTI timeline tools share (dev/decode_timeline.cpp, dev/train_timeline.cpp): CUPTI
// activity collection of kernels, memcpys and memsets (graph-launched ones included, with their
// graph and node ids) and the short kernel names the tables print. nsys is not installed on the
// GPU machine; CUPTI ships with the CUDA toolkit, so this is the timeline we have.
//
// Header-only on purpose: each tool is one translation unit, and CUPTI's buffer callbacks need a
// place to put records (the recorder in flight; one at a time).
#pragma once

#include <cupti.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace forge::dev {

#define FORGE_CUPTI_CHECK(call)                                                      \
  do {                                                                               \
    CUptiResult r_ = (call);                                                         \
    if (r_ != CUPTI_SUCCESS) {                                                       \
      const char* m_ = nullptr;                                                      \
      cuptiGetResultString(r_, &m_);                                                 \
      std::fprintf(stderr, "cupti: %s: %s\n", #call, m_ ? m_ : "?");                 \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

// One GPU activity: start and end in ns (CUPTI's clock), the CUDA graph and node it ran from
// (graph_id 0: launched eagerly), the kernel's short name or "memcpy HtoD" / "memset".
struct ActivityRecord {
  enum Kind { kKernel, kMemcpy, kMemset };
  Kind kind;
  uint64_t start, end;
  uint32_t graph_id;
  uint64_t node_id;
  std::string name;
  uint64_t bytes;  // memcpy and memset; 0 for a kernel
  double us() const { return (end - start) * 1e-3; }
};

// "void forge::cuda::(anonymous namespace)::out_in_mma_kernel<__nv_bfloat16, 1, ...>(params)"
// → "out_in_mma_kernel<bfloat16, 1, ...>": no namespaces, no return type, no parameter list,
// at most max_len characters (cuBLAS kernel names run long; the tile sizes are in their tails).
inline std::string short_kernel_name(const char* mangled, size_t max_len = 60) {
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string s = status == 0 && d ? d : mangled;
  std::free(d);
  for (const char* cut : {"(anonymous namespace)::", "forge::cuda::kernels::", "forge::cuda::", "__nv_"})
    for (size_t p; (p = s.find(cut)) != std::string::npos;) s.erase(p, std::strlen(cut));
  int depth = 0;
  size_t name_start = 0, end = s.size();
  for (size_t i = 0; i < s.size(); ++i) {  // the parameter list: the first '(' outside <...>
    const char c = s[i];
    if (c == '<') ++depth;
    if (c == '>') --depth;
    if (depth == 0 && c == ' ') name_start = i + 1;  // after the return type
    if (depth == 0 && c == '(') {
      end = i;
      break;
    }
  }
  s = s.substr(name_start, end - name_start);
  return s.size() > max_len ? s.substr(0, max_len) : s;
}

inline const char* memcpy_kind_name(uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "memcpy HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "memcpy DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "memcpy DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH: return "memcpy HtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "memcpy PtoP";
    default: return "memcpy other";
  }
}

// Records GPU activity between start() and stop(). Kernels always; memcpys and memsets when
// asked. Only one recorder may be running (CUPTI's callbacks are process-wide).
class CuptiRecorder {
 public:
  explicit CuptiRecorder(size_t name_len = 60, bool copies = false) : name_len_(name_len), copies_(copies) {}

  void start() {
    records_.clear();
    current() = this;
    FORGE_CUPTI_CHECK(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
    for (CUpti_ActivityKind k : kinds()) FORGE_CUPTI_CHECK(cuptiActivityEnable(k));
  }
  // CUPTI's clock now (the records' clock): records of what starts later start after it.
  static uint64_t now() {
    uint64_t t = 0;
    FORGE_CUPTI_CHECK(cuptiGetTimestamp(&t));
    return t;
  }
  // Everything recorded since start(), sorted by start time. The caller synchronizes the device
  // first: CUPTI flushes what has completed.
  std::vector<ActivityRecord> stop() {
    FORGE_CUPTI_CHECK(cuptiActivityFlushAll(1));
    for (CUpti_ActivityKind k : kinds()) FORGE_CUPTI_CHECK(cuptiActivityDisable(k));
    current() = nullptr;
    std::sort(records_.begin(), records_.end(), [](const auto& a, const auto& b) { return a.start < b.start; });
    return std::move(records_);
  }

 private:
  std::vector<CUpti_ActivityKind> kinds() const {
    std::vector<CUpti_ActivityKind> k{CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL};
    if (copies_) k.insert(k.end(), {CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET});
    return k;
  }
  static CuptiRecorder*& current() {
    static CuptiRecorder* r = nullptr;
    return r;
  }
  static void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
    *size = 16 << 20;
    *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, *size));
    *max_records = 0;
  }
  static void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
    CuptiRecorder* self = current();
    CUpti_Activity* rec = nullptr;
    while (self != nullptr && cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
      if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || rec->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
        self->records_.push_back({ActivityRecord::kKernel, k->start, k->end, k->graphId, k->graphNodeId,
                                  short_kernel_name(k->name, self->name_len_), 0});
      } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
        self->records_.push_back({ActivityRecord::kMemcpy, m->start, m->end, m->graphId, m->graphNodeId,
                                  memcpy_kind_name(m->copyKind), m->bytes});
      } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
        self->records_.push_back(
            {ActivityRecord::kMemset, m->start, m->end, m->graphId, m->graphNodeId, "memset", m->bytes});
      }
    }
    std::free(buffer);
  }

  size_t name_len_;
  bool copies_;
  std::vector<ActivityRecord> records_;
};

}  // namespace forge::dev
