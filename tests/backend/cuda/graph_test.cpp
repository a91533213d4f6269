// CUDA graphs (backend/cuda/graph.h) and the allocator's capture pool: a captured AdamW step
// replayed with new factors in device memory equals eager calls bit for bit; a capture after
// a warm-up run allocates nothing from the driver; the temporaries of a capture stay out of the
// cache while the graph lives and go back when it is reset.
#include "forge/backend/cuda/graph.h"

#include "forge/backend/cuda/ops.h"
#include "forge/ops/adamw.h"
#include "op_testing.h"

namespace forge::cuda {
namespace {

using namespace forge::cuda::testing;

class GraphTest : public CudaTest {};

// Three AdamW steps with clipping and a bf16 working copy, as CudaTransformer::optimizer_step
// enqueues them (sum_squares allocates a temporary): eagerly, and as one graph replayed with
// each step's factors (lr and t change) copied from pinned memory before every launch.
TEST_F(GraphTest, ReplayWithFactorsInDeviceMemoryEqualsEagerCalls) {
  const int64_t n = 40003;
  const auto param0 = random_normal<float>(n, 300);
  std::vector<std::vector<float>> grads;
  for (int s = 0; s < 3; ++s) grads.push_back(random_normal<float>(n, 301 + s));
  auto factors_of = [](int s) {
    AdamWParams p;
    p.lr = 1e-3f * static_cast<float>(s + 1);
    p.step = s + 1;
    return adamw_factors(p);
  };
  struct Result {
    std::vector<float> param, m, v, sq;
    std::vector<uint16_t> work;
  };
  auto run = [&](bool graph) {
    auto dparam = upload(param0), dm = upload(std::vector<float>(n, 0.0f));
    auto dv = upload(std::vector<float>(n, 0.0f)), dgrad = upload(grads[0]);
    auto work = poisoned<uint16_t>(n);
    auto sq = poisoned<float>(1);
    DeviceBuffer<AdamWFactors> dfactors(ctx().allocator(), 1);
    PinnedBuffer<AdamWFactors> staged(1);
    auto step = [&] {
      sum_squares(ctx(), sq.data(), dgrad.data(), n);
      adamw_update(ctx(), dparam.data(), dm.data(), dv.data(), dgrad.data(), work.data(),
                   DType::kBF16, n, dfactors.data(), 0, sq.data(), 1.0f);
    };
    Graph g;
    for (int s = 0; s < 3; ++s) {
      ctx().synchronize();  // the previous step has read `staged` and the gradient
      staged.data()[0] = factors_of(s);
      FORGE_CUDA_CHECK(cudaMemcpyAsync(dgrad.data(), grads[s].data(), n * 4, cudaMemcpyHostToDevice,
                                       ctx().stream()));
      FORGE_CUDA_CHECK(cudaMemcpyAsync(dfactors.data(), staged.data(), sizeof(AdamWFactors),
                                       cudaMemcpyHostToDevice, ctx().stream()));
      if (!graph || s == 0) {
        step();  // the graph run's first step is its eager warm-up
      } else {
        if (g.empty()) g.capture(ctx(), step);
        g.launch();
      }
    }
    return Result{download(dparam), download(dm), download(dv), download(sq), download(work)};
  };
  const Result eager = run(false), replayed = run(true);
  EXPECT_TRUE(bit_identical(replayed.param, eager.param));
  EXPECT_TRUE(bit_identical(replayed.m, eager.m));
  EXPECT_TRUE(bit_identical(replayed.v, eager.v));
  EXPECT_TRUE(bit_identical(replayed.sq, eager.sq));
  EXPECT_TRUE(bit_identical(replayed.work, eager.work));
}

TEST_F(GraphTest, CaptureKeepsItsTemporariesUntilReset) {
  Allocator& a = ctx().allocator();
  auto src = upload(random_normal<float>(1 << 20, 310));
  auto out = poisoned<float>(1);
  // sum_squares allocates (and frees) a small partials buffer on every call.
  auto enqueue = [&] { sum_squares(ctx(), out.data(), src.data(), 1 << 20); };
  enqueue();  // warm-up: the temporary's block is now in the cache
  ctx().synchronize();
  const int64_t mallocs_before = a.stats().allocations - a.stats().cache_hits;
  Graph g;
  g.capture(ctx(), enqueue);
  EXPECT_EQ(a.stats().capture_mallocs, 0);
  EXPECT_EQ(a.stats().allocations - a.stats().cache_hits, mallocs_before);
  EXPECT_GT(a.stats().pooled, 0u);
  // While the graph lives, a request of the temporary's size class (256 partials = 1 KiB, the
  // only block of that class) cannot get the graph's block: it comes from the driver, so a
  // replay cannot scribble over it.
  void* other = a.alloc(1024);
  EXPECT_EQ(a.stats().allocations - a.stats().cache_hits, mallocs_before + 1);
  g.launch();
  const float got = download(out)[0];
  out = poisoned<float>(1);
  enqueue();
  EXPECT_EQ(download(out)[0], got);  // the replay computed what an eager call computes
  a.free(other);
  g.reset();
  EXPECT_EQ(a.stats().pooled, 0u);
}

}  // namespace
}  // namespace forge::cuda
