// Safetensors: round trips through the writer, the writer's byte layout checked against the
// format (alignment, contiguity, key order), a hand-built file parsed byte for byte, every kind
// of malformed header rejected with a one-line message naming the file and the culprit, cheap
// fuzzing (truncations, byte flips), and the atomic-replace guarantees of the writer.
#include "forge/io/safetensors.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <nlohmann/json.hpp>

#include "forge/core/error.h"
#include "forge/core/rng.h"
#include "forge/io/bf16.h"
#include "fuzz_regression.h"
#include "testing.h"

namespace forge::io {
namespace {

namespace fs = std::filesystem;

class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/forge_safetensors_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  std::string dir_;
};

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A file from a header length, header text and data bytes, built without the writer.
std::string file_bytes(uint64_t header_len, const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(header_len >> (8 * i));
  return out + header + data;
}
std::string file_bytes(const std::string& header, const std::string& data) {
  return file_bytes(header.size(), header, data);
}

uint64_t header_len_of(const std::string& bytes) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  return n;
}

template <typename T>
std::string as_bytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

std::string bytes_of(const SafetensorsFile& f, const TensorInfo& t) {
  return std::string(reinterpret_cast<const char*>(f.data(t)), t.end - t.begin);
}

// The forge::Error that opening `path` throws; fails the test if it throws nothing or another
// exception type, or if the message is not one line starting with the path.
std::string open_error(const std::string& path) {
  try {
    SafetensorsFile::open(path);
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind(path + ": ", 0), 0u) << "message does not start with the path: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "message is not one line: " << msg;
    return msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "open(" << path << ") threw a non-forge exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "open(" << path << ") did not throw";
  return "";
}

// Writes a file with this header and data, expects open() to fail mentioning every needle.
void expect_rejected(const std::string& path, const std::string& header, const std::string& data,
                     std::initializer_list<const char*> needles) {
  SCOPED_TRACE(header.substr(0, 200));
  write_bytes(path, file_bytes(header, data));
  EXPECT_THROW(SafetensorsFile::open(path), Error);
  const std::string msg = open_error(path);
  for (const char* needle : needles)
    EXPECT_NE(msg.find(needle), std::string::npos) << "'" << needle << "' not in: " << msg;
}

// ---------------------------------------------------------------------------- round trips

TEST_F(Safetensors, RoundTripsSeveralDTypes) {
  const std::vector<float> w = testing::random_normal<float>(3 * 5, 1);
  std::vector<uint16_t> h(7);
  Rng rng(2, 0);
  for (auto& x : h) x = static_cast<uint16_t>(rng.next_u32());
  const std::vector<int32_t> ids = {1, -2, 3, 2147483647, -2147483647 - 1, 0};
  const std::vector<double> scalar = {3.25};
  const std::vector<int64_t> big = {int64_t{1} << 40, -5};
  const std::vector<uint8_t> flags = {1, 0, 1};
  const std::vector<TensorToWrite> in = {
      {"model.w", StDType::kF32, {3, 5}, w.data()}, {"h", StDType::kBF16, {7}, h.data()},
      {"empty", StDType::kU8, {0}, nullptr},        {"ids", StDType::kI32, {2, 3}, ids.data()},
      {"scalar", StDType::kF64, {}, scalar.data()}, {"big", StDType::kI64, {2}, big.data()},
      {"flags", StDType::kBool, {3}, flags.data()}, {"zero_rows", StDType::kF32, {0, 4}, nullptr},
  };
  const std::vector<std::string> want = {
      as_bytes(w),   as_bytes(h),     "", as_bytes(ids), as_bytes(scalar),
      as_bytes(big), as_bytes(flags), ""};
  write_safetensors(path("a.safetensors"), in);

  const SafetensorsFile f = SafetensorsFile::open(path("a.safetensors"));
  EXPECT_EQ(f.path(), path("a.safetensors"));
  ASSERT_EQ(f.tensors().size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    SCOPED_TRACE(in[i].name);
    const TensorInfo* t = f.find(in[i].name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->name, in[i].name);
    EXPECT_EQ(t->dtype, in[i].dtype);
    EXPECT_EQ(t->shape, in[i].shape);
    EXPECT_EQ(bytes_of(f, *t), want[i]);
  }
  EXPECT_EQ(f.find("missing"), nullptr);
  EXPECT_TRUE(f.metadata().empty());
  // Contiguous writes in the given order come back in the same order (sorted by offset).
  for (size_t i = 0; i < in.size(); ++i) EXPECT_EQ(f.tensors()[i].name, in[i].name);
  EXPECT_EQ(f.read_f32("model.w"), w);
  EXPECT_EQ(f.read_f32("scalar"), std::vector<float>{3.25f});
  EXPECT_TRUE(f.read_f32("zero_rows").empty());
}

TEST_F(Safetensors, WritesAlignedContiguousHeader) {
  // Names of every length mod 8 so the unpadded header hits every remainder.
  const std::vector<float> v = {1, 2, 3};
  const std::vector<uint16_t> b = {1, 2, 3, 4, 5};
  for (int len = 1; len <= 9; ++len) {
    SCOPED_TRACE(len);
    const std::vector<TensorToWrite> in = {{std::string(len, 'x'), StDType::kF32, {3}, v.data()},
                                           {"b", StDType::kBF16, {5}, b.data()},
                                           {"c", StDType::kF32, {1, 2}, v.data()}};
    const std::string p = path("aligned.safetensors");
    write_safetensors(p, in, {{"format", "pt"}});
    const std::string bytes = read_bytes(p);
    const uint64_t n = header_len_of(bytes);
    EXPECT_EQ((8 + n) % 8, 0u);
    ASSERT_EQ(bytes.size(), 8 + n + 12 + 10 + 8);  // no gaps, nothing after the last tensor
    const std::string header = bytes.substr(8, n);
    EXPECT_EQ(header.rfind("{\"__metadata__\":", 0), 0u) << header;  // as Python writes it
    const size_t close = header.rfind('}');
    EXPECT_EQ(header.find_first_not_of(' ', close + 1), std::string::npos) << "pad is spaces";
    EXPECT_LT(header.size() - close - 1, 8u);

    const nlohmann::json j = nlohmann::json::parse(header);
    uint64_t offset = 0;
    for (const TensorToWrite& t : in) {
      const auto& offs = j.at(t.name).at("data_offsets");
      EXPECT_EQ(offs[0].get<uint64_t>(), offset) << t.name;
      offset += t.name == "b" ? 10 : t.name == "c" ? 8 : 12;
      EXPECT_EQ(offs[1].get<uint64_t>(), offset) << t.name;
      EXPECT_EQ(j.at(t.name).at("shape").get<Shape>(), t.shape);
    }
    EXPECT_EQ(j.at("b").at("dtype"), "BF16");
    EXPECT_EQ(bytes.substr(8 + n + 12, 10), as_bytes(b));
  }
}

TEST_F(Safetensors, MetadataRoundTrips) {
  const std::map<std::string, std::string> meta = {
      {"format", "pt"}, {"note", "ünïcode, \"quotes\", a\nnewline"}, {"empty", ""}};
  const std::vector<float> v = {1};
  write_safetensors(path("m.safetensors"), {{"v", StDType::kF32, {1}, v.data()}}, meta);
  EXPECT_EQ(SafetensorsFile::open(path("m.safetensors")).metadata(), meta);
  // A file with only metadata and no tensors is legal too.
  write_safetensors(path("only.safetensors"), {}, meta);
  const SafetensorsFile f = SafetensorsFile::open(path("only.safetensors"));
  EXPECT_EQ(f.metadata(), meta);
  EXPECT_TRUE(f.tensors().empty());
}

TEST_F(Safetensors, ReadF32ConvertsHalfTypes) {
  // 1.5, -2.0, 0.25 as known bit patterns.
  const std::vector<uint16_t> bf16 = {0x3FC0, 0xC000, 0x3E80};
  const std::vector<uint16_t> f16 = {0x3E00, 0xC000, 0x3400};
  const std::vector<double> f64 = {1.5, -2.0, 0.25};
  const std::vector<uint8_t> e4m3 = {0x3C, 0xC0, 0x28};  // 0 0111 100, 1 1000 000, 0 0101 000
  const std::vector<uint8_t> e5m2 = {0x3E, 0xC0, 0x34};  // 0 01111 10, 1 10000 00, 0 01101 00
  const std::vector<int32_t> i32 = {1, 2, 3};
  write_safetensors(path("h.safetensors"), {{"bf", StDType::kBF16, {3}, bf16.data()},
                                            {"f16", StDType::kF16, {3}, f16.data()},
                                            {"f64", StDType::kF64, {1, 3}, f64.data()},
                                            {"e4m3", StDType::kF8E4M3, {3}, e4m3.data()},
                                            {"e5m2", StDType::kF8E5M2, {3}, e5m2.data()},
                                            {"ints", StDType::kI32, {3}, i32.data()}});
  const SafetensorsFile f = SafetensorsFile::open(path("h.safetensors"));
  const std::vector<float> want = {1.5f, -2.0f, 0.25f};
  EXPECT_EQ(f.read_f32("bf"), want);
  EXPECT_EQ(f.read_f32("f16"), want);
  EXPECT_EQ(f.read_f32("f64"), want);
  EXPECT_EQ(f.read_f32("e4m3"), want);
  EXPECT_EQ(f.read_f32("e5m2"), want);
  EXPECT_EQ(f.find("e4m3")->dtype, StDType::kF8E4M3);  // and the header names round-trip
  EXPECT_EQ(f.find("e5m2")->dtype, StDType::kF8E5M2);
  try {
    f.read_f32("ints");
    ADD_FAILURE() << "read_f32 of I32 did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'ints'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("I32"), std::string::npos) << e.what();
  }
  try {
    f.read_f32("nope");
    ADD_FAILURE() << "read_f32 of a missing tensor did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'nope'"), std::string::npos) << e.what();
  }
}

TEST_F(Safetensors, ReadsIntoACallersBufferAndRereadsReleasedPages) {
  // Three pages' worth of bf16 values (so release_pages has whole pages to give back) and a
  // small f32 tensor after it.
  Rng rng(7);
  std::vector<uint16_t> big(3 * 4096);
  for (auto& h : big) h = static_cast<uint16_t>(0x3F00 + rng.below(0x100));
  const std::vector<float> small = {0.5f, -3.25f, 7.0f};
  write_safetensors(path("p.safetensors"),
                    {{"big", StDType::kBF16, {3, 4096}, big.data()}, {"small", StDType::kF32, {3}, small.data()}});
  const SafetensorsFile f = SafetensorsFile::open(path("p.safetensors"));
  const std::vector<float> want = f.read_f32("big");
  ASSERT_EQ(want.size(), big.size());
  EXPECT_EQ(want[5], bf16_to_f32(big[5]));
  std::vector<float> got(big.size(), -1.0f);
  f.read_f32_into("big", got.data(), got.size());
  EXPECT_EQ(got, want);
  // The released pages come back from the file with the same bytes; the tensor after is untouched.
  f.release_pages(*f.find("big"));
  std::fill(got.begin(), got.end(), -1.0f);
  f.read_f32_into("big", got.data(), got.size());
  EXPECT_EQ(got, want);
  EXPECT_EQ(f.read_f32("small"), small);
  // A buffer of another size is refused, naming the tensor and both counts.
  try {
    f.read_f32_into("small", got.data(), 4);
    ADD_FAILURE() << "read_f32_into with the wrong count did not throw";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'small'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("3 elements where 4"), std::string::npos) << msg;
  }
}

TEST_F(Safetensors, ParsesHandBuiltFile) {
  // Keys deliberately not in offset order, unpadded (data section at an odd offset), metadata
  // last. Data: w = [1.0f, -2.0f], b = bf16 1.5 (scalar), e = empty at the very end.
  const std::string header = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("e":{"dtype":"I64","shape":[0,3],"data_offsets":[10,10]},)"
                             R"( "b" : {"shape":[], "data_offsets":[8,10], "dtype":"BF16"},)"
                             R"("__metadata__":{"format":"pt"}})";
  const std::string data("\x00\x00\x80\x3F\x00\x00\x00\xC0\xC0\x3F", 10);
  ASSERT_EQ(header.size() % 8, 1u);
  write_bytes(path("hand.safetensors"), file_bytes(header, data));

  const SafetensorsFile f = SafetensorsFile::open(path("hand.safetensors"));
  ASSERT_EQ(f.tensors().size(), 3u);
  EXPECT_EQ(f.tensors()[0].name, "w");
  EXPECT_EQ(f.tensors()[1].name, "b");
  EXPECT_EQ(f.tensors()[2].name, "e");
  const TensorInfo& b = f.tensors()[1];
  EXPECT_EQ(b.dtype, StDType::kBF16);
  EXPECT_EQ(b.shape, Shape{});
  EXPECT_EQ(b.begin, 8u);
  EXPECT_EQ(b.end, 10u);
  EXPECT_EQ(f.tensors()[2].shape, (Shape{0, 3}));
  EXPECT_EQ(f.data(b) - f.data(f.tensors()[0]), 8);
  EXPECT_EQ(f.read_f32("w"), (std::vector<float>{1.0f, -2.0f}));
  EXPECT_EQ(f.read_f32("b"), std::vector<float>{1.5f});
  EXPECT_EQ(f.metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
}

TEST_F(Safetensors, AllowsGapsAndEmptyTensorsAnywhere) {
  // A hole before and between tensors, and empty tensors sitting inside another's range.
  const std::string header = R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[4,6]},)"
                             R"("b":{"dtype":"U8","shape":[2],"data_offsets":[8,10]},)"
                             R"("z":{"dtype":"F32","shape":[0],"data_offsets":[5,5]},)"
                             R"("y":{"dtype":"F32","shape":[0],"data_offsets":[12,12]}})";
  write_bytes(path("gaps.safetensors"), file_bytes(header, "0123456789AB"));
  const SafetensorsFile f = SafetensorsFile::open(path("gaps.safetensors"));
  EXPECT_EQ(bytes_of(f, *f.find("a")), "45");
  EXPECT_EQ(bytes_of(f, *f.find("b")), "89");
  EXPECT_EQ(f.tensors().size(), 4u);
}

TEST_F(Safetensors, AcceptsDuplicateNames) {
  // JSON allows duplicate keys; nlohmann keeps one. We only require that it opens sanely.
  const std::string header = R"({"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                             R"("x":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})";
  write_bytes(path("dup.safetensors"), file_bytes(header, "ab"));
  const SafetensorsFile f = SafetensorsFile::open(path("dup.safetensors"));
  ASSERT_EQ(f.tensors().size(), 1u);
  ASSERT_NE(f.find("x"), nullptr);
}

TEST_F(Safetensors, IsMovable) {
  const std::vector<float> v = {4, 5};
  write_safetensors(path("mv.safetensors"), {{"v", StDType::kF32, {2}, v.data()}});
  SafetensorsFile a = SafetensorsFile::open(path("mv.safetensors"));
  SafetensorsFile b = std::move(a);
  EXPECT_EQ(b.read_f32("v"), v);
  SafetensorsFile c = SafetensorsFile::open(path("mv.safetensors"));
  c = std::move(b);
  EXPECT_EQ(c.read_f32("v"), v);
  EXPECT_EQ(bytes_of(c, c.tensors()[0]), as_bytes(v));
}

// ------------------------------------------------------------------------------ bad input

TEST_F(Safetensors, RejectsMissingAndShortFiles) {
  std::string msg = open_error(path("absent.safetensors"));
  EXPECT_NE(msg.find("No such file"), std::string::npos) << msg;

  write_bytes(path("empty.safetensors"), "");
  msg = open_error(path("empty.safetensors"));
  EXPECT_NE(msg.find("0 bytes"), std::string::npos) << msg;

  write_bytes(path("short.safetensors"), std::string("\x05\x00\x00\x00\x00", 5));
  msg = open_error(path("short.safetensors"));
  EXPECT_NE(msg.find("5 bytes"), std::string::npos) << msg;

  msg = open_error(dir_);  // a directory
  EXPECT_NE(msg.find("not a regular file"), std::string::npos) << msg;
}

TEST_F(Safetensors, RejectsBadHeaderLength) {
  const std::string p = path("len.safetensors");
  write_bytes(p, file_bytes(100, "{}", "0123456789"));  // 100 > 12 bytes left
  std::string msg = open_error(p);
  EXPECT_NE(msg.find("header length 100"), std::string::npos) << msg;
  EXPECT_NE(msg.find("past the end"), std::string::npos) << msg;

  write_bytes(p, file_bytes(uint64_t{1} << 63, "{}", ""));  // would overflow 8 + N
  msg = open_error(p);
  EXPECT_NE(msg.find("9223372036854775808"), std::string::npos) << msg;
  EXPECT_NE(msg.find("larger than"), std::string::npos) << msg;

  write_bytes(p, file_bytes(~uint64_t{0}, "{}", ""));
  EXPECT_FALSE(open_error(p).empty());

  write_bytes(p, file_bytes(200'000'000, "{}", ""));  // "absurd", even before the file size
  msg = open_error(p);
  EXPECT_NE(msg.find("larger than"), std::string::npos) << msg;
}

TEST_F(Safetensors, RejectsHeaderThatIsNotAJsonObject) {
  const std::string p = path("json.safetensors");
  expect_rejected(p, "{not json", "", {"not valid JSON"});
  expect_rejected(p, "", "", {"not valid JSON"});
  expect_rejected(p, R"({"a":1} {"b":2})", "", {"not valid JSON"});
  expect_rejected(p, "{\"a\xff\":1}", "", {"not valid JSON"});  // invalid UTF-8
  expect_rejected(p, "[1, 2]", "", {"array", "expected an object"});
  expect_rejected(p, "\"x\"", "", {"string", "expected an object"});
  expect_rejected(p, "{\"__metadata__\":" + std::string(100000, '['), "", {"nested"});
}

TEST_F(Safetensors, RejectsMalformedEntries) {
  const std::string p = path("entry.safetensors");
  const std::string d16(16, '\0');
  expect_rejected(p, R"({"x":5})", d16, {"'x'", "number", "expected an object"});
  expect_rejected(p, R"({"x":{"shape":[4],"data_offsets":[0,16]}})", d16, {"'x'", "dtype"});
  expect_rejected(p, R"({"x":{"dtype":"F32","data_offsets":[0,16]}})", d16, {"'x'", "shape"});
  expect_rejected(p, R"({"x":{"dtype":"F32","shape":[4]}})", d16, {"'x'", "data_offsets"});
  expect_rejected(p, R"({"x":{"dtype":32,"shape":[4],"data_offsets":[0,16]}})", d16,
                  {"'x'", "dtype", "expected a string"});
  expect_rejected(p, R"({"x":{"dtype":"F32","shape":"4","data_offsets":[0,16]}})", d16,
                  {"'x'", "shape", "expected an array"});
  expect_rejected(p, R"({"x":{"dtype":"F32","shape":[4.0],"data_offsets":[0,16]}})", d16,
                  {"'x'", "shape", "integers"});
  expect_rejected(p, R"({"x":{"dtype":"F32","shape":[[4]],"data_offsets":[0,16]}})", d16,
                  {"'x'", "shape", "integers"});
  for (const char* offs :
       {"[0]", "[0,16,16]", "\"0,16\"", "[\"0\",\"16\"]", "[-1,15]", "[0,1.6e1]"})
    expect_rejected(p, str(R"({"x":{"dtype":"F32","shape":[4],"data_offsets":)", offs, "}}"), d16,
                    {"'x'", "data_offsets"});
}

TEST_F(Safetensors, RejectsUnknownDType) {
  const std::string p = path("dtype.safetensors");
  expect_rejected(p, R"({"x":{"dtype":"float32","shape":[4],"data_offsets":[0,16]}})",
                  std::string(16, '\0'), {"'x'", "unsupported dtype 'float32'"});
  expect_rejected(p, R"({"x":{"dtype":"f32","shape":[4],"data_offsets":[0,16]}})",
                  std::string(16, '\0'), {"'x'", "'f32'"});  // names are case-sensitive
  expect_rejected(p, R"({"x":{"dtype":"F8_E8M0","shape":[4],"data_offsets":[0,4]}})",
                  std::string(4, '\0'), {"'x'", "F8_E8M0"});
}

TEST_F(Safetensors, RejectsBadShapes) {
  const std::string p = path("shape.safetensors");
  expect_rejected(p, R"({"x":{"dtype":"F32","shape":[-1,4],"data_offsets":[0,16]}})",
                  std::string(16, '\0'), {"'x'", "negative"});
  // 2^32 · 2^32 · 4 bytes wraps to 0 in 64 bits; must not pass as an empty tensor.
  expect_rejected(p,
                  R"({"x":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})",
                  "", {"'x'", "overflow"});
  expect_rejected(p,
                  R"({"x":{"dtype":"U8","shape":[3,6148914691236517206],)"
                  R"("data_offsets":[0,2]}})",
                  "ab", {"'x'", "overflow"});  // 3 · 6148914691236517206 wraps to 2
  expect_rejected(p,
                  R"({"x":{"dtype":"U8","shape":[18446744073709551615],)"
                  R"("data_offsets":[0,0]}})",
                  "", {"'x'", "too large"});
}

TEST_F(Safetensors, RejectsBadOffsets) {
  const std::string p = path("offsets.safetensors");
  expect_rejected(p, R"({"x":{"dtype":"U8","shape":[0],"data_offsets":[8,4]}})",
                  std::string(16, '\0'), {"'x'", "[8, 4]", "begin > end"});
  expect_rejected(p, R"({"x":{"dtype":"F32","shape":[8],"data_offsets":[0,32]}})",
                  std::string(16, '\0'), {"'x'", "[0, 32]", "16 bytes"});
  expect_rejected(p, R"({"x":{"dtype":"U8","shape":[1],"data_offsets":[18446744073709551615,0]}})",
                  "", {"'x'"});
  expect_rejected(p,
                  R"({"x":{"dtype":"U8","shape":[0],)"
                  R"("data_offsets":[18446744073709551615,18446744073709551615]}})",
                  "", {"'x'", "past the end"});
  // The message the brief promises, word for word.
  expect_rejected(p, R"({"x":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})",
                  std::string(16, '\0'),
                  {"tensor 'x' data_offsets [0, 12] do not match shape [2, 2] of F32 (16 bytes)"});
  expect_rejected(p, R"({"s":{"dtype":"F64","shape":[],"data_offsets":[0,4]}})",
                  std::string(16, '\0'), {"'s'", "shape [] of F64 (8 bytes)"});
}

TEST_F(Safetensors, RejectsOverlappingTensors) {
  const std::string p = path("overlap.safetensors");
  expect_rejected(p,
                  R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                  R"("b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
                  std::string(24, '\0'), {"'a' [0, 16]", "'b' [8, 24]", "overlap"});
  // The overlap is with a long tensor that is not the immediately preceding one.
  expect_rejected(p,
                  R"({"long":{"dtype":"U8","shape":[20],"data_offsets":[0,20]},)"
                  R"("c":{"dtype":"U8","shape":[2],"data_offsets":[2,4]},)"
                  R"("d":{"dtype":"U8","shape":[2],"data_offsets":[10,12]}})",
                  std::string(20, '\0'), {"'long'", "overlap"});
  expect_rejected(p,
                  R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                  R"("a2":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}})",
                  std::string(4, '\0'), {"'a'", "'a2'", "overlap"});
}

TEST_F(Safetensors, RejectsBadMetadata) {
  const std::string p = path("meta.safetensors");
  expect_rejected(p, R"({"__metadata__":{"format":"pt","step":100}})", "",
                  {"__metadata__", "'step'", "number", "expected a string"});
  expect_rejected(p, R"({"__metadata__":["pt"]})", "", {"__metadata__", "expected an object"});
}

TEST_F(Safetensors, MessagesStayOnOneLine) {
  // A name with a newline and a very long name: quoted safely and cut, not echoed raw.
  const std::string p = path("names.safetensors");
  expect_rejected(p, R"({"evil\nname":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})",
                  std::string(4, '\0'), {"evil\\x0aname"});
  const std::string long_name(10000, 'n');
  write_bytes(p, file_bytes(str(R"({")", long_name,
                                R"(":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})"),
                            std::string(4, '\0')));
  EXPECT_LT(open_error(p).size(), 600u);
}

// Every truncation and many single-byte corruptions of a valid file either open (and then
// describe only bytes inside the file) or throw forge::Error; nothing crashes or reads outside.
TEST_F(Safetensors, SurvivesTruncationAndCorruption) {
  const std::vector<float> v = {1, 2, 3};
  const std::vector<uint16_t> h = {7, 8};
  const std::string good = path("good.safetensors");
  write_safetensors(good,
                    {{"v", StDType::kF32, {3}, v.data()}, {"h", StDType::kBF16, {2}, h.data()}},
                    {{"k", "v"}});
  const std::string bytes = read_bytes(good);
  const std::string p = path("fuzz.safetensors");
  auto check = [&](const std::string& b) {
    write_bytes(p, b);
    try {
      const SafetensorsFile f = SafetensorsFile::open(p);
      const uint64_t data_bytes = b.size() - 8 - header_len_of(b);
      for (const TensorInfo& t : f.tensors()) {
        EXPECT_LE(t.begin, t.end);
        EXPECT_LE(t.end, data_bytes);
        if (t.dtype == StDType::kF32 || t.dtype == StDType::kBF16) f.read_f32(t.name);
      }
    } catch (const Error&) {
    } catch (const std::exception& e) {
      ADD_FAILURE() << "non-forge exception " << e.what();
    }
  };
  for (size_t n = 0; n < bytes.size(); ++n) check(bytes.substr(0, n));
  for (size_t i = 0; i < bytes.size(); ++i)
    for (const char c : {'\0', '"', '9', '-', '{', ']', '\xff'}) {
      std::string b = bytes;
      b[i] = c;
      check(b);
    }
}

// ---------------------------------------------------------------------------- atomic write

TEST_F(Safetensors, WriteIntoMissingDirectoryThrowsAndCreatesNothing) {
  const std::vector<float> v = {1};
  const std::string p = path("no/such/dir/x.safetensors");
  try {
    write_safetensors(p, {{"v", StDType::kF32, {1}, v.data()}});
    ADD_FAILURE() << "did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("No such file"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(path("no")));
  EXPECT_TRUE(fs::is_empty(dir_));
}

TEST_F(Safetensors, OverwriteReplacesTheWholeFile) {
  const std::string p = path("model.safetensors");
  const std::vector<float> big = testing::random_normal<float>(1000, 3);
  write_safetensors(p, {{"big", StDType::kF32, {1000}, big.data()}}, {{"v", "1"}});
  write_bytes(p + ".tmp", "stale leftover of a crashed write");
  const std::vector<int32_t> small = {42};
  write_safetensors(p, {{"small", StDType::kI32, {1}, small.data()}});

  const SafetensorsFile f = SafetensorsFile::open(p);
  ASSERT_EQ(f.tensors().size(), 1u);
  EXPECT_EQ(f.tensors()[0].name, "small");
  EXPECT_TRUE(f.metadata().empty());
  EXPECT_EQ(fs::file_size(p), 8 + header_len_of(read_bytes(p)) + 4);
  EXPECT_FALSE(fs::exists(p + ".tmp"));
}

TEST_F(Safetensors, FailedWriteLeavesOldFileIntact) {
  const std::string p = path("model.safetensors");
  const std::vector<float> v = {1, 2, 3};
  write_safetensors(p, {{"v", StDType::kF32, {3}, v.data()}});
  const std::string before = read_bytes(p);

  // Rejected before any I/O: negative dimension, duplicate and reserved names, missing data.
  const std::vector<std::vector<TensorToWrite>> bad = {
      {{"neg", StDType::kF32, {-3}, v.data()}},
      {{"a", StDType::kF32, {1}, v.data()}, {"a", StDType::kF32, {1}, v.data()}},
      {{"__metadata__", StDType::kF32, {1}, v.data()}},
      {{"null", StDType::kF32, {3}, nullptr}},
      {{"huge", StDType::kF32, {int64_t{1} << 62, 8}, v.data()}},
      {{"bad\xff utf8", StDType::kF32, {1}, v.data()}},
  };
  for (const auto& tensors : bad) {
    SCOPED_TRACE(tensors.back().name);
    EXPECT_THROW(write_safetensors(p, tensors), Error);
    EXPECT_EQ(read_bytes(p), before);
    EXPECT_FALSE(fs::exists(p + ".tmp"));
  }
  try {
    write_safetensors(p, bad[1]);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'a'"), std::string::npos) << e.what();
  }

  // Fails at the rename (the target is a non-empty directory): the temp file is cleaned up.
  const std::string d = path("dir.safetensors");
  fs::create_directory(d);
  write_bytes(d + "/keep", "x");
  try {
    write_safetensors(d, {{"v", StDType::kF32, {3}, v.data()}});
    ADD_FAILURE() << "did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rename"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::is_directory(d));
  EXPECT_EQ(read_bytes(d + "/keep"), "x");
  EXPECT_FALSE(fs::exists(d + ".tmp"));
}

TEST_F(Safetensors, WriteErrorRemovesTempAndKeepsOldFile) {
  // The temp name points at /dev/full, so every write fails with ENOSPC mid-file.
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  const std::string p = path("model.safetensors");
  const std::vector<float> v = {1, 2, 3};
  write_safetensors(p, {{"v", StDType::kF32, {3}, v.data()}});
  const std::string before = read_bytes(p);
  fs::create_symlink("/dev/full", p + ".tmp");
  try {
    write_safetensors(p, {{"w", StDType::kF32, {3}, v.data()}});
    ADD_FAILURE() << "did not throw";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(p + ": cannot write"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::strerror(ENOSPC)), std::string::npos) << msg;
  }
  EXPECT_EQ(read_bytes(p), before);
  EXPECT_FALSE(fs::is_symlink(p + ".tmp"));
}

// Found by fuzz/fuzz_safetensors (fuzz/regressions/safetensors-number_overflow, replayed as it
// is): a number that overflows a double made nlohmann throw out_of_range instead of a named
// forge::Error.
TEST_F(Safetensors, RejectsNumbersThatOverflow) {
  expect_rejected(path("overflow.safetensors"),
                  R"({"a":{"dtype":"F32","shape":[1e999],"data_offsets":[0,4]}})", "abcd",
                  {"overflow.safetensors", "not valid JSON"});
  const std::string finding =
      std::string(FORGE_SOURCE_DIR) + "/fuzz/regressions/safetensors-number_overflow";
  testing::expect_one_line_error([&] { SafetensorsFile::open(finding); },
                                 {finding + ": ", "not valid JSON", "number overflow"});
}

TEST(SafetensorsDType, NamesAndSizes) {
  EXPECT_STREQ(st_dtype_name(StDType::kF32), "F32");
  EXPECT_STREQ(st_dtype_name(StDType::kBF16), "BF16");
  EXPECT_STREQ(st_dtype_name(StDType::kBool), "BOOL");
  EXPECT_STREQ(st_dtype_name(StDType::kU64), "U64");
  EXPECT_EQ(st_dtype_size(StDType::kF64), 8u);
  EXPECT_EQ(st_dtype_size(StDType::kF16), 2u);
  EXPECT_EQ(st_dtype_size(StDType::kI8), 1u);
  EXPECT_EQ(st_dtype_size(StDType::kBool), 1u);
  EXPECT_EQ(st_dtype_size(StDType::kU32), 4u);
}

}  // namespace
}  // namespace forge::io
