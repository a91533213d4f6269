// The data-parallel CUDA runner (train/zero1_cuda.h): with a ONE-rank NCCL communicator and the
// ZeRO-1 path forced (CudaSettings::zero1_one_rank) it equals the plain runner bit for bit —
// reports (losses, norm, loss scale, skip), weights and Adam moments, fp32, bf16 and fp16, CUDA
// graph on, a poisoned step skipped the same way; a checkpoint's full Adam state carried into a
// fresh ZeRO-1 runner continues exactly as the plain runner does. With 2 or more GPUs, two
// ranks (two threads, one GPU each) training half of every batch follow a one-GPU run of the
// whole batch (fp32: losses within 1e-5 relative); skipped below 2 GPUs.
#include <cuda_runtime.h>

#include <barrier>
#include <cmath>
#include <cstring>
#include <mutex>
#include <thread>

#include "backend/cuda/op_testing.h"
#include "forge/core/error.h"
#include "forge/dist/communicator.h"
#include "forge/dist/nccl_comm.h"
#include "forge/model/transformer.h"
#include "forge/train/runner.h"
#include "model/small_configs.h"

namespace forge {
namespace {

using cuda::testing::bit_identical;
using cuda::testing::CudaTest;

struct Trace {
  std::vector<StepReport> reports;
  std::vector<float> w, m, v;
};

// `steps` steps of two micro-batches of rows [row0, row0 + rows) of a B-row batch; the step
// `fault_step` gets a NaN gradient; `ignore`: the second micro-batch has 5 ignored targets.
void run_steps(StepRunner& r, const ModelConfig& cfg, int first, int steps, int row0, int rows,
               Trace& t, int fault_step = -1, bool ignore = true) {
  const int B = 4, T = 16;
  for (int s = first; s < first + steps; ++s) {
    r.zero_grad();
    for (int micro = 0; micro < 2; ++micro) {
      const uint64_t seed = 1000 + 10 * s + 2 * micro;
      auto x = testing::random_ids(B * T, cfg.vocab_size, seed),
           y = testing::random_ids(B * T, cfg.vocab_size, seed + 1);
      if (micro == 1 && ignore)
        for (int i = 0; i < 5; ++i) y[7 * i] = -1;
      r.micro_step(x.data() + row0 * T, y.data() + row0 * T, rows, T, 0.5);
    }
    if (s == fault_step) r.inject_fault(StepFault::kNanGrad);
    AdamWParams p;
    p.lr = 1e-3f * static_cast<float>(s + 1);
    p.step = s + 1;
    r.optimizer_step(p, 1.0);
    while (static_cast<int>(t.reports.size()) < s + 1 - r.report_lag())
      t.reports.push_back(r.take_report());
  }
  while (static_cast<int>(t.reports.size()) < first + steps) t.reports.push_back(r.take_report());
  t.w = r.weights();
  t.m = r.adam_m();
  t.v = r.adam_v();
}

std::vector<float> init_weights(const ModelConfig& cfg) {
  Transformer<float> init(cfg);
  init.init_weights(21);
  return init.weights();
}

class Zero1RunnerTest : public CudaTest {
 protected:
  void SetUp() override {
    CudaTest::SetUp();
    if (IsSkipped()) return;
    if (!nccl_compiled()) GTEST_SKIP() << "built without NCCL";
  }
};

TEST_F(Zero1RunnerTest, OneRankNcclEqualsThePlainRunnerBitForBit) {
  const ModelConfig cfg = testing::small_config(Family::kGpt2);
  // Buckets: the default (one for this model) and one a layer, reduce-scattered on their own
  // stream during the last micro-batch's backward (dist/buckets.h; the top one through the
  // padded staging buffer): the same results, bit for bit.
  for (const size_t bucket : {CudaSettings{}.bucket_elems, size_t{1}})
  for (const char* precision : {"fp32", "bf16", "fp16"}) {
    SCOPED_TRACE(::testing::Message() << precision << ", bucket " << bucket);
    LocalComm boot;
    auto nccl = make_nccl_comm(boot, 0, nullptr);
    CudaSettings dp;
    dp.zero1_one_rank = true;
    dp.bucket_elems = bucket;
    auto plain = make_cuda_runner(cfg, precision);
    auto zero1 = make_cuda_runner(cfg, precision, dp, nccl.get());
    // A bucket a layer + the embedding's, or one; + the padding's own (not a multiple of 64).
    const size_t buckets = (bucket == 1 ? cfg.n_layer + 1 : 1) + (ParamTable(cfg).total() % 64 != 0);
    EXPECT_NE(zero1->describe().find(str("zero-1 over nccl rank 0 of 1 on GPU 0 (", buckets,
                                         " gradient buckets)")),
              std::string::npos)
        << zero1->describe();
    EXPECT_EQ(plain->describe().find("zero-1"), std::string::npos) << plain->describe();
    plain->set_weights(init_weights(cfg));
    zero1->set_weights(init_weights(cfg));
    Trace a, b;
    run_steps(*plain, cfg, 0, 6, 0, 4, a, /*fault_step=*/3);
    run_steps(*zero1, cfg, 0, 6, 0, 4, b, /*fault_step=*/3);
    ASSERT_EQ(a.reports.size(), b.reports.size()) << precision;
    for (size_t s = 0; s < a.reports.size(); ++s) {
      const StepReport &x = a.reports[s], &y = b.reports[s];
      EXPECT_EQ(y.micro_losses, x.micro_losses) << precision << " step " << s;
      EXPECT_EQ(y.rank_micro_losses, x.micro_losses) << precision << " step " << s;
      EXPECT_EQ(y.skipped, x.skipped) << precision << " step " << s;
      EXPECT_EQ(y.loss_scale, x.loss_scale) << precision << " step " << s;
      if (std::isfinite(x.grad_norm))
        EXPECT_EQ(y.grad_norm, x.grad_norm) << precision << " step " << s;
      else
        EXPECT_FALSE(std::isfinite(y.grad_norm)) << precision << " step " << s;
    }
    EXPECT_TRUE(a.reports[3].skipped) << precision;  // the poisoned step
    EXPECT_TRUE(bit_identical(a.w, b.w)) << precision;
    EXPECT_TRUE(bit_identical(a.m, b.m)) << precision;
    EXPECT_TRUE(bit_identical(a.v, b.v)) << precision;
    EXPECT_FALSE(bit_identical(a.w, init_weights(cfg))) << precision;  // it trained

    // The saved state (full buffers) in a fresh ZeRO-1 runner continues as the plain one does.
    if (std::string(precision) == "fp16") continue;  // the loss scale state is another test's
    auto resumed = make_cuda_runner(cfg, precision, dp, nccl.get());
    resumed->set_weights(b.w);
    resumed->set_adam_state(b.m, b.v);
    resumed->set_skipped_updates(1);
    Trace c = a, d;
    d.reports.resize(6);
    run_steps(*plain, cfg, 6, 3, 0, 4, c);
    run_steps(*resumed, cfg, 6, 3, 0, 4, d);
    for (size_t s = 6; s < 9; ++s)
      EXPECT_EQ(d.reports[s].micro_losses, c.reports[s].micro_losses) << precision << " step " << s;
    EXPECT_TRUE(bit_identical(c.w, d.w)) << precision;
    EXPECT_TRUE(bit_identical(c.m, d.m)) << precision;
  }
}

// Two ranks in one process (a thread per GPU): the NCCL id goes from rank 0 to rank 1 through
// memory, barrier() is a std::barrier.
class ThreadBootstrap final : public Communicator {
 public:
  struct Shared {
    std::mutex mu;
    std::vector<uint8_t> blob;
    std::barrier<> sync{2};
  };
  ThreadBootstrap(Shared& sh, int rank) : sh_(sh), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return 2; }
  int local_rank() const override { return rank_; }
  std::string describe() const override { return str("thread rank ", rank_, " of 2"); }
  void allreduce_sum(float*, size_t) override { FORGE_CHECK(false, "not in this test"); }
  void allreduce_sum(double*, size_t) override { FORGE_CHECK(false, "not in this test"); }
  void reduce_scatter_sum(const float*, float*, size_t) override { FORGE_CHECK(false, "not in this test"); }
  void allgather(const float*, float*, size_t) override { FORGE_CHECK(false, "not in this test"); }
  void broadcast(void* buf, size_t n, int root) override {
    if (rank_ == root) {
      std::lock_guard<std::mutex> lock(sh_.mu);
      sh_.blob.assign(static_cast<uint8_t*>(buf), static_cast<uint8_t*>(buf) + n);
    }
    sh_.sync.arrive_and_wait();
    if (rank_ != root) {
      std::lock_guard<std::mutex> lock(sh_.mu);
      std::memcpy(buf, sh_.blob.data(), n);
    }
    sh_.sync.arrive_and_wait();
  }
  void barrier() override { sh_.sync.arrive_and_wait(); }
  [[noreturn]] void abort(const std::string& message) override {
    std::fprintf(stderr, "rank %d: %s\n", rank_, message.c_str());
    std::abort();
  }

 private:
  Shared& sh_;
  int rank_;
};

TEST_F(Zero1RunnerTest, TwoGpusFollowOneGpuOnTheWholeBatch) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 2)
    GTEST_SKIP() << "needs 2 GPUs, found " << devices;
  const ModelConfig cfg = testing::small_config(Family::kLlama);
  Trace one;
  {
    auto r = make_cuda_runner(cfg, "fp32");
    r->set_weights(init_weights(cfg));
    run_steps(*r, cfg, 0, 5, 0, 4, one, -1, /*ignore=*/false);
  }
  ThreadBootstrap::Shared shared;
  Trace two[2];
  std::string errors[2];
  auto rank_main = [&](int rank) {
    try {
      ThreadBootstrap boot(shared, rank);
      auto nccl = make_nccl_comm(boot, rank, nullptr);
      CudaSettings s;
      s.device = rank;
      s.bucket_elems = 1;  // a bucket a layer: reduce-scatters during the backward
      auto r = make_cuda_runner(cfg, "fp32", s, nccl.get());
      r->set_weights(init_weights(cfg));
      run_steps(*r, cfg, 0, 5, 2 * rank, 2, two[rank], -1, /*ignore=*/false);
      r.reset();
    } catch (const std::exception& e) {
      errors[rank] = e.what();
    }
  };
  std::thread t0(rank_main, 0), t1(rank_main, 1);
  t0.join();
  t1.join();
  ASSERT_EQ(errors[0], "");
  ASSERT_EQ(errors[1], "");
  for (int s = 0; s < 5; ++s) {
    // Every rank reports the same global numbers.
    EXPECT_EQ(two[0].reports[s].micro_losses, two[1].reports[s].micro_losses) << "step " << s;
    EXPECT_EQ(two[0].reports[s].grad_norm, two[1].reports[s].grad_norm) << "step " << s;
    // Equal target counts on both halves: the mean of the ranks' means is the batch's mean.
    for (int i = 0; i < 2; ++i)
      EXPECT_NEAR(two[0].reports[s].micro_losses[i], one.reports[s].micro_losses[i],
                  1e-5 * one.reports[s].micro_losses[i])
          << "step " << s;
    EXPECT_NEAR(two[0].reports[s].grad_norm, one.reports[s].grad_norm,
                1e-4 * one.reports[s].grad_norm)
        << "step " << s;
  }
  EXPECT_TRUE(bit_identical(two[0].w, two[1].w));
  EXPECT_TRUE(bit_identical(two[0].m, two[1].m));
  ASSERT_EQ(two[0].w.size(), one.w.size());
  double max_rel = 0;
  for (size_t i = 0; i < one.w.size(); ++i)
    max_rel = std::max(max_rel, std::abs(double(two[0].w[i]) - one.w[i]) / (std::abs(one.w[i]) + 1e-3));
  EXPECT_LT(max_rel, 1e-3);
}

}  // namespace
}  // namespace forge
