#include "forge/backend/cuda/allocator.h"

#include "cuda_testing.h"
#include "forge/core/error.h"

namespace forge::cuda {
namespace {

TEST(AllocatorSizes, RoundToClasses) {
  EXPECT_EQ(Allocator::round_size(1), 512u);
  EXPECT_EQ(Allocator::round_size(512), 512u);
  EXPECT_EQ(Allocator::round_size(513), 1024u);
  EXPECT_EQ(Allocator::round_size((1u << 20) + 1), 2u << 20);
  EXPECT_EQ(Allocator::round_size(5u << 20), 6u << 20);
}

class AllocatorTest : public testing::CudaTest {};

TEST_F(AllocatorTest, ReusesFreedBlocksAndCountsBytes) {
  Allocator a(0);
  void* p = a.alloc(1000);
  EXPECT_EQ(a.stats().in_use, 1024u);
  a.free(p);
  EXPECT_EQ(a.stats().in_use, 0u);
  void* q = a.alloc(900);  // same size class: the cached block comes back
  EXPECT_EQ(q, p);
  EXPECT_EQ(a.stats().cache_hits, 1);
  void* r = a.alloc(3u << 20);
  EXPECT_EQ(a.stats().peak_in_use, 1024u + (4u << 20));
  a.free(q);
  a.free(r);
  a.release_cache();
  EXPECT_EQ(a.stats().reserved, 0u);
}

TEST_F(AllocatorTest, OutOfMemoryIsAUserErrorThatSaysWhatToLower) {
  Allocator a(0);
  try {
    a.alloc(size_t{1} << 50);  // 1 PiB
    FAIL() << "expected an out-of-memory error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("CUDA out of memory"), std::string::npos) << msg;
    EXPECT_NE(msg.find("lower batch_size"), std::string::npos) << msg;
  }
  void* p = a.alloc(4096);  // the allocator still works afterwards
  EXPECT_NE(p, nullptr);
  a.free(p);
}

}  // namespace
}  // namespace forge::cuda
