// The NCCL communicator (dist/nccl_comm.h) with one rank — what a one-GPU machine can run — gives
// what LocalComm gives for every collective, on device buffers: sums over one rank are the
// values, reduce-scatter and all-gather are copies, broadcast leaves the root's bytes, barrier
// returns. And set_nccl_stream refuses a communicator that is not NCCL's. Skips without a GPU
// or without NCCL.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

#include "backend/cuda/op_testing.h"
#include "forge/core/error.h"
#include "forge/dist/communicator.h"
#include "forge/dist/nccl_comm.h"

namespace forge {
namespace {

using cuda::testing::CudaTest;

class NcclCommTest : public CudaTest {
 protected:
  void SetUp() override {
    CudaTest::SetUp();
    if (IsSkipped()) return;
    if (!nccl_compiled()) GTEST_SKIP() << "built without NCCL";
    nccl_ = make_nccl_comm(boot_, 0, ctx().stream());
  }
  template <typename T>
  std::vector<T> down(const cuda::DeviceBuffer<T>& d) {
    std::vector<T> h(d.size());
    ctx().synchronize();
    FORGE_CUDA_CHECK(cudaMemcpy(h.data(), d.data(), d.size() * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  LocalComm boot_;
  std::unique_ptr<Communicator> nccl_;
};

TEST_F(NcclCommTest, OneRankCollectivesEqualLocalComm) {
  EXPECT_EQ(nccl_->rank(), 0);
  EXPECT_EQ(nccl_->size(), 1);
  EXPECT_EQ(nccl_->local_rank(), 0);
  EXPECT_NE(nccl_->describe().find("nccl rank 0 of 1"), std::string::npos) << nccl_->describe();
  const std::vector<float> xf = forge::testing::random_normal<float>(1000, 3);
  std::vector<double> xd(xf.begin(), xf.end());
  for (double& d : xd) d = d / 3.0 + 1e-12;

  // allreduce_sum, f32 and f64
  std::vector<float> local_f = xf;
  boot_.allreduce_sum(local_f.data(), local_f.size());
  auto df = upload(xf);
  nccl_->allreduce_sum(df.data(), xf.size());
  EXPECT_TRUE(cuda::testing::bit_identical(down(df), local_f));
  std::vector<double> local_d = xd;
  boot_.allreduce_sum(local_d.data(), local_d.size());
  auto dd = upload(xd);
  nccl_->allreduce_sum(dd.data(), xd.size());
  EXPECT_EQ(down(dd), local_d);

  // reduce_scatter_sum and allgather: a shard of the whole buffer
  std::vector<float> rs_local(xf.size());
  boot_.reduce_scatter_sum(xf.data(), rs_local.data(), xf.size());
  auto in = upload(xf);
  cuda::DeviceBuffer<float> out(ctx().allocator(), xf.size());
  nccl_->reduce_scatter_sum(in.data(), out.data(), xf.size());
  EXPECT_TRUE(cuda::testing::bit_identical(down(out), rs_local));
  std::vector<float> ag_local(xf.size());
  boot_.allgather(xf.data(), ag_local.data(), xf.size());
  cuda::DeviceBuffer<float> gathered(ctx().allocator(), xf.size());
  nccl_->allgather(in.data(), gathered.data(), xf.size());
  EXPECT_TRUE(cuda::testing::bit_identical(down(gathered), ag_local));

  // broadcast from the root (this rank) keeps its bytes; barrier returns
  std::vector<uint8_t> bytes = {1, 2, 3, 250, 0, 7};
  auto db = upload(bytes);
  nccl_->broadcast(db.data(), bytes.size(), 0);
  EXPECT_EQ(down(db), bytes);
  nccl_->barrier();
}

TEST_F(NcclCommTest, SetStreamRefusesAnotherCommunicator) {
  LocalComm local;
  try {
    set_nccl_stream(local, ctx().stream());
    FAIL() << "expected forge::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs an NCCL communicator"), std::string::npos) << e.what();
  }
  set_nccl_stream(*nccl_, ctx().stream());  // an NcclComm is accepted
}

}  // namespace
}  // namespace forge
