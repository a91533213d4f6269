// Safetensors reader (mmap + full header validation) and atomic writer. The format and the
// guarantees are described in safetensors.h; the notes here are about how.
//
// Validation order on open: file size -> header length -> JSON syntax -> each entry (types,
// dtype, shape, offsets against the data section and the shape) -> overlaps. Every message is
// "<path>: <problem>" on one line; names from the file are quoted with control characters
// escaped and long names cut, so a hostile header cannot forge extra lines or flood the log.
//
// Untrusted sizes: the header length is checked against the file size before anything is read
// past byte 8, and shape products and byte counts use checked multiplication, so no offset we
// keep can point outside the mapping. nlohmann::json (>= 3.10) parses and destroys without
// recursion, but we still refuse headers nested deeper than kMaxJsonDepth before parsing —
// a real header is 3 levels deep, and a megabyte of '[' would otherwise cost gigabytes of RAM.
//
// Unlike the Rust `safetensors` crate we do not require the tensors to tile the data section
// exactly (some writers leave alignment gaps); we require only that they are in range and do
// not overlap. Zero-byte tensors overlap nothing.
//
// Byte order: the format is little-endian and so is every machine Forge targets (x86-64,
// aarch64), so data are used as they lie; the header length is assembled byte by byte anyway.
#include "forge/io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <utility>

#include "forge/core/error.h"
#include "forge/io/atomic_file.h"
#include "forge/io/bf16.h"
#include "forge/io/fp8.h"

namespace forge::io {

static_assert(std::endian::native == std::endian::little, "safetensors data are little-endian");

namespace {

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the Rust crate's limit, too
constexpr int kMaxJsonDepth = 64;

struct DTypeEntry {
  StDType dtype;
  const char* name;
  size_t size;
};
constexpr DTypeEntry kDTypes[] = {
    {StDType::kF64, "F64", 8},   {StDType::kF32, "F32", 4}, {StDType::kF16, "F16", 2},
    {StDType::kBF16, "BF16", 2}, {StDType::kI64, "I64", 8}, {StDType::kI32, "I32", 4},
    {StDType::kI16, "I16", 2},   {StDType::kI8, "I8", 1},   {StDType::kU8, "U8", 1},
    {StDType::kU16, "U16", 2},   {StDType::kU32, "U32", 4}, {StDType::kU64, "U64", 8},
    {StDType::kBool, "BOOL", 1}, {StDType::kF8E4M3, "F8_E4M3", 1}, {StDType::kF8E5M2, "F8_E5M2", 1},
};

const DTypeEntry& dtype_entry(StDType t) {
  for (const DTypeEntry& e : kDTypes)
    if (e.dtype == t) return e;
  FORGE_CHECK(false, "unknown StDType ", static_cast<int>(t));
}

std::string offsets_str(uint64_t begin, uint64_t end) {
  return str("[", begin, ", ", end, "]");
}

// True when `a * b` overflows u64; otherwise stores the product.
bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}

// Nesting depth of JSON text, counting only brackets outside strings. Stops early at `limit`.
bool json_deeper_than(const char* p, size_t n, int limit) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < n; ++i) {
    const char c = p[i];
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > limit) return true;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return false;
}

// Reads a header entry into `info` (name already set); throws with the problem, not the path.
void parse_entry(const nlohmann::json& entry, uint64_t data_bytes, TensorInfo* info) {
  const std::string who = str("tensor ", quote(info->name));
  if (!entry.is_object())
    throw Error(str(who, " is a JSON ", entry.type_name(), ", expected an object"));
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!entry.contains(key)) throw Error(str(who, " has no \"", key, "\""));

  const nlohmann::json& dtype = entry["dtype"];
  if (!dtype.is_string())
    throw Error(str(who, " dtype is a JSON ", dtype.type_name(), ", expected a string"));
  const std::string& dtype_name = dtype.get_ref<const std::string&>();
  const DTypeEntry* dt = nullptr;
  for (const DTypeEntry& e : kDTypes)
    if (dtype_name == e.name) dt = &e;
  if (!dt)
    throw Error(
        str(who, " has unsupported dtype ", quote(dtype_name),
            " (expected F64, F32, F16, BF16, F8_E4M3, F8_E5M2, I64, I32, I16, I8, U8, U16, U32, U64 or BOOL)"));
  info->dtype = dt->dtype;

  const nlohmann::json& shape = entry["shape"];
  if (!shape.is_array())
    throw Error(str(who, " shape is a JSON ", shape.type_name(), ", expected an array"));
  info->shape.clear();
  bool any_zero = false;
  for (const nlohmann::json& d : shape) {
    if (!d.is_number_integer())
      throw Error(str(who, " shape has a ", d.type_name(), " entry, expected integers"));
    if (d.is_number_unsigned()) {
      const uint64_t u = d.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        throw Error(str(who, " shape dimension ", u, " is too large"));
      info->shape.push_back(static_cast<int64_t>(u));
    } else {
      const int64_t v = d.get<int64_t>();
      if (v < 0) throw Error(str(who, " shape has a negative dimension ", v));
      info->shape.push_back(v);
    }
    any_zero |= info->shape.back() == 0;
  }
  uint64_t nbytes = dt->size;  // a scalar (shape []) is one element
  if (any_zero) {
    nbytes = 0;
  } else {
    for (int64_t d : info->shape)
      if (mul_overflows(nbytes, static_cast<uint64_t>(d), &nbytes))
        throw Error(str(who, " shape ", shape_str(info->shape), " of ", dt->name,
                        " overflows 64-bit byte counts"));
  }

  const nlohmann::json& offsets = entry["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned())
    throw Error(str(who, " data_offsets must be two non-negative integers [begin, end]"));
  info->begin = offsets[0].get<uint64_t>();
  info->end = offsets[1].get<uint64_t>();
  const std::string range = offsets_str(info->begin, info->end);
  if (info->begin > info->end) throw Error(str(who, " data_offsets ", range, " have begin > end"));
  if (info->end > data_bytes)
    throw Error(str(who, " data_offsets ", range, " run past the end of the data section (",
                    data_bytes, " bytes); the file may be truncated"));
  if (info->end - info->begin != nbytes)
    throw Error(str(who, " data_offsets ", range, " do not match shape ", shape_str(info->shape),
                    " of ", dt->name, " (", nbytes, " bytes)"));
}

void parse_metadata(const nlohmann::json& meta, std::map<std::string, std::string>* out) {
  if (!meta.is_object())
    throw Error(str("__metadata__ is a JSON ", meta.type_name(), ", expected an object"));
  for (const auto& [key, value] : meta.items()) {
    if (!value.is_string())
      throw Error(str("__metadata__ value for key ", quote(key), " is a JSON ",
                      value.type_name(), ", expected a string"));
    (*out)[key] = value.get<std::string>();
  }
}

}  // namespace

size_t st_dtype_size(StDType t) {
  return dtype_entry(t).size;
}
const char* st_dtype_name(StDType t) {
  return dtype_entry(t).name;
}

// ---------------------------------------------------------------------------------------------
// Reader

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  f.path_ = path;
  auto fail = [&](const std::string& problem) { return Error(str(path, ": ", problem)); };

  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw fail(str("cannot open: ", std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw fail(str("cannot stat: ", std::strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw fail("not a regular file");
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    throw fail(str("file is ", size,
                   " bytes, too short for the 8-byte header length; not a "
                   "safetensors file?"));
  }
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int mmap_err = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (p == MAP_FAILED) throw fail(str("cannot mmap: ", std::strerror(mmap_err)));
  f.map_ = static_cast<const uint8_t*>(p);
  f.map_size_ = size;  // from here on ~SafetensorsFile unmaps if we throw

  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | f.map_[i];
  if (header_len > kMaxHeaderBytes)
    throw fail(str("header length ", header_len, " is larger than ", kMaxHeaderBytes,
                   " bytes; not a safetensors file?"));
  if (header_len > size - 8)
    throw fail(str("header length ", header_len, " runs past the end of the file (", size,
                   " bytes); the file may be truncated"));
  const char* header = reinterpret_cast<const char*>(f.map_ + 8);
  f.data_section_ = f.map_ + 8 + header_len;
  const uint64_t data_bytes = size - 8 - header_len;

  if (json_deeper_than(header, header_len, kMaxJsonDepth))
    throw fail(str("header JSON is nested deeper than ", kMaxJsonDepth, " levels"));
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(header, header + header_len);
  } catch (const nlohmann::json::exception& e) {
    // Any parse failure, including a number that overflows a double ("1e999" throws
    // out_of_range.406, found by fuzz/fuzz_safetensors). e.what() is
    // "[json.exception.parse_error.101] parse error at line 1, column 3: ...".
    const std::string what = e.what();
    const size_t bracket = what.find("] ");
    throw fail(str("header is not valid JSON: ",
                   bracket == std::string::npos ? what : what.substr(bracket + 2)));
  }
  if (!root.is_object())
    throw fail(str("header is a JSON ", root.type_name(), ", expected an object"));

  try {
    for (const auto& [name, entry] : root.items()) {
      if (name == "__metadata__") {
        parse_metadata(entry, &f.metadata_);
        continue;
      }
      TensorInfo info;
      info.name = name;
      parse_entry(entry, data_bytes, &info);
      f.tensors_.push_back(std::move(info));
    }
  } catch (const Error& e) {
    throw fail(e.what());
  }

  std::sort(f.tensors_.begin(), f.tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    if (a.begin != b.begin) return a.begin < b.begin;
    return a.end != b.end ? a.end < b.end : a.name < b.name;  // empty tensors tie on begin
  });
  // Sorted by begin, non-empty tensors are disjoint iff each starts at or after the end of the
  // previous one (which then also has the furthest end so far). Empty tensors occupy nothing.
  const TensorInfo* prev = nullptr;
  for (const TensorInfo& t : f.tensors_) {
    if (t.begin == t.end) continue;
    if (prev && t.begin < prev->end)
      throw fail(str("tensors ", quote(prev->name), " ", offsets_str(prev->begin, prev->end),
                     " and ", quote(t.name), " ", offsets_str(t.begin, t.end), " overlap"));
    prev = &t;
  }
  for (size_t i = 0; i < f.tensors_.size(); ++i) f.index_.emplace(f.tensors_[i].name, i);
  return f;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept {
  *this = std::move(other);
}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this == &other) return *this;
  unmap();
  path_ = std::move(other.path_);
  map_ = std::exchange(other.map_, nullptr);
  map_size_ = std::exchange(other.map_size_, 0);
  data_section_ = std::exchange(other.data_section_, nullptr);
  tensors_ = std::move(other.tensors_);
  index_ = std::move(other.index_);
  metadata_ = std::move(other.metadata_);
  return *this;
}

SafetensorsFile::~SafetensorsFile() {
  unmap();
}

void SafetensorsFile::unmap() {
  if (map_) ::munmap(const_cast<uint8_t*>(map_), map_size_);
  map_ = nullptr;
  map_size_ = 0;
  data_section_ = nullptr;
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

std::vector<float> SafetensorsFile::read_f32(const std::string& name) const {
  const TensorInfo* t = find(name);
  if (!t)
    throw Error(str(path_, ": no tensor ", quote(name), " (the file has ", tensors_.size(),
                    " tensors)"));
  std::vector<float> out((t->end - t->begin) / st_dtype_size(t->dtype));
  read_f32_into(name, out.data(), out.size());
  return out;
}

void SafetensorsFile::release_pages(const TensorInfo& t) const {
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t a = reinterpret_cast<uintptr_t>(data(t)), b = a + (t.end - t.begin);
  const uintptr_t first = (a + page - 1) / page * page, last = b / page * page;
  // Advice only: a failure leaves the pages mapped, which is what not calling it does.
  if (first < last) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

void SafetensorsFile::read_f32_into(const std::string& name, float* out_ptr, size_t n_out) const {
  const TensorInfo* t = find(name);
  if (!t)
    throw Error(str(path_, ": no tensor ", quote(name), " (the file has ", tensors_.size(),
                    " tensors)"));
  const uint8_t* src = data(*t);
  const size_t n = (t->end - t->begin) / st_dtype_size(t->dtype);
  if (n != n_out)
    throw Error(str(path_, ": tensor ", quote(name), " has ", n, " elements where ", n_out, " are expected"));
  float* out = out_ptr;
  // The mapping is not aligned for the element type, hence memcpy per element.
  switch (t->dtype) {
    case StDType::kF32:
      if (n) std::memcpy(out, src, n * sizeof(float));
      break;
    case StDType::kF64:
      for (size_t i = 0; i < n; ++i) {
        double v;
        std::memcpy(&v, src + 8 * i, 8);
        out[i] = static_cast<float>(v);
      }
      break;
    case StDType::kBF16:
    case StDType::kF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        out[i] = t->dtype == StDType::kBF16 ? bf16_to_f32(h) : f16_to_f32(h);
      }
      break;
    case StDType::kF8E4M3:
    case StDType::kF8E5M2:
      for (size_t i = 0; i < n; ++i) out[i] = t->dtype == StDType::kF8E4M3 ? e4m3_to_f32(src[i]) : e5m2_to_f32(src[i]);
      break;
    default:
      throw Error(str(path_, ": tensor ", quote(name), " is ", st_dtype_name(t->dtype),
                      "; only F32, F16, BF16, F64, F8_E4M3 and F8_E5M2 tensors can be read as f32"));
  }
}

// ---------------------------------------------------------------------------------------------
// Writer

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  // Validate and lay out everything before touching the file system.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<uint64_t> sizes;
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    const std::string who = str(path, ": tensor ", quote(t.name));
    if (t.name == "__metadata__") throw Error(str(who, " uses the reserved name"));
    if (header.contains(t.name)) throw Error(str(who, " appears twice"));
    uint64_t nbytes = st_dtype_size(t.dtype);
    for (int64_t d : t.shape) {
      if (d < 0) throw Error(str(who, " has negative dimension in shape ", shape_str(t.shape)));
      if (mul_overflows(nbytes, static_cast<uint64_t>(d), &nbytes))
        throw Error(str(who, " shape ", shape_str(t.shape), " overflows 64-bit byte counts"));
    }
    if (nbytes > 0 && !t.data) throw Error(str(who, " has no data"));
    if (offset + nbytes < offset) throw Error(str(who, " ends past 2^64 bytes"));
    header[t.name] = {{"dtype", st_dtype_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + nbytes}}};
    sizes.push_back(nbytes);
    offset += nbytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::type_error&) {  // invalid UTF-8 in a name or metadata
    throw Error(str(path, ": tensor names and metadata must be valid UTF-8"));
  }
  // Pad with spaces (as the Python library does) so the data section starts 8-byte aligned.
  text.append((8 - text.size() % 8) % 8, ' ');
  uint8_t len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<uint8_t>(uint64_t{text.size()} >> (8 * i));

  AtomicFile f(path);
  f.write(len_bytes, 8);
  f.write(text);
  for (size_t i = 0; i < tensors.size(); ++i) f.write(tensors[i].data, sizes[i]);
  f.commit();
}

}  // namespace forge::io
