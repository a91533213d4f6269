// libFuzzer target: arbitrary bytes as a token shard (data/shard.h, llm.c's format), opened as
// training and evaluation open it: with the vocabulary to check ids against, then split into a
// Dataset (train and held-out ranges) and read as windows by both loaders. A shard that opens
// must hold exactly its header's token count, every id below the vocabulary.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "forge/data/loader.h"
#include "forge/data/shard.h"
#include "fuzz_util.h"

namespace {

constexpr int64_t kVocab = 300;  // a 16-bit shard's ids reach 65,535: many are out of range
constexpr int kT = 4;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static forge::fuzz::MemFile file("train_000000.bin");
  const std::string& path = file.set(data, size);
  forge::fuzz::expect_ok_or_error([&] {
    const forge::Shard s = forge::Shard::open(path, kVocab);
    const size_t header = forge::kShardHeaderInts * 4;
    forge::fuzz::require(header + static_cast<size_t>(s.size()) * s.token_bytes() == size,
                         "shard size matches its header");
    std::vector<int32_t> ids(static_cast<size_t>(s.size()));
    s.read(0, s.size(), ids.data());
    for (const int32_t id : ids) forge::fuzz::require(id >= 0 && id < kVocab, "id in vocabulary");
  });
  forge::fuzz::expect_ok_or_error([&] {
    forge::Dataset d = forge::Dataset::open(path, kVocab);
    std::vector<int32_t> x(2 * kT), y(2 * kT);
    forge::TrainLoader train(&d.shards, d.train, kT, 7);
    train.next_batch(2, x.data(), y.data());
    forge::EvalWindows val(&d.shards, d.val, kT);
    for (int64_t i = 0; i < val.count() && i < 4; ++i) val.window(i, x.data(), y.data());
  });
  return 0;
}
