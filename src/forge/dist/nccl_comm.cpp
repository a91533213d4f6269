// NcclComm (dist/nccl_comm.h): each collective is the NCCL call of the same name on the
// communicator's stream. Sums over ranks follow NCCL's ring or tree order, which depends on the
// rank count and topology: run-to-run deterministic on the same machine and rank count
// (NCCL_ALGO / NCCL_PROTO unchanged), not across rank counts.
#include "forge/dist/nccl_comm.h"

#include "forge/core/error.h"

#ifdef FORGE_HAVE_NCCL

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdlib>

#include "forge/backend/cuda/check.h"

namespace forge {

namespace {

[[noreturn]] void nccl_failed(const char* expr, const char* file, int line, ncclResult_t r) {
  check_failed(expr, file, line, std::string("NCCL error: ") + ncclGetErrorString(r));
}

#define FORGE_NCCL_CHECK(expr)                                                       \
  do {                                                                               \
    const ncclResult_t forge_nr_ = (expr);                                           \
    if (forge_nr_ != ncclSuccess) nccl_failed(#expr, __FILE__, __LINE__, forge_nr_); \
  } while (0)

class NcclComm final : public Communicator {
 public:
  NcclComm(Communicator& bootstrap, int device, cudaStream_t stream)
      : bootstrap_(bootstrap), stream_(stream), device_(device) {
    ::setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
    ncclUniqueId id{};
    if (bootstrap_.rank() == 0) FORGE_NCCL_CHECK(ncclGetUniqueId(&id));
    bootstrap_.broadcast(&id, sizeof id, 0);
    FORGE_CUDA_CHECK(cudaSetDevice(device_));
    FORGE_NCCL_CHECK(ncclCommInitRank(&comm_, bootstrap_.size(), id, bootstrap_.rank()));
  }

  ~NcclComm() override { ncclCommDestroy(comm_); }

  void set_stream(cudaStream_t stream) { stream_ = stream; }

  int rank() const override { return bootstrap_.rank(); }
  int size() const override { return bootstrap_.size(); }
  int local_rank() const override { return bootstrap_.local_rank(); }
  std::string describe() const override {
    return str("nccl rank ", rank(), " of ", size(), " on GPU ", device_);
  }

  void allreduce_sum(float* buf, size_t n) override {
    FORGE_NCCL_CHECK(ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, comm_, stream_));
  }
  void allreduce_sum(double* buf, size_t n) override {
    FORGE_NCCL_CHECK(ncclAllReduce(buf, buf, n, ncclFloat64, ncclSum, comm_, stream_));
  }
  void reduce_scatter_sum(const float* in, float* out, size_t shard) override {
    FORGE_NCCL_CHECK(ncclReduceScatter(in, out, shard, ncclFloat32, ncclSum, comm_, stream_));
  }
  void allgather(const float* in, float* out, size_t shard) override {
    FORGE_NCCL_CHECK(ncclAllGather(in, out, shard, ncclFloat32, comm_, stream_));
  }
  void broadcast(void* buf, size_t n, int root) override {
    FORGE_NCCL_CHECK(ncclBroadcast(buf, buf, n, ncclUint8, root, comm_, stream_));
    FORGE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void barrier() override {
    FORGE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    bootstrap_.barrier();
  }
  // ncclCommAbort first: a rank blocked in a collective on another rank's stream would
  // otherwise keep the GPU busy after its process is told to stop.
  [[noreturn]] void abort(const std::string& message) override {
    ncclCommAbort(comm_);
    bootstrap_.abort(message);
    std::_Exit(1);  // not reached: abort() ends the process; this is for the compiler
  }

 private:
  Communicator& bootstrap_;
  cudaStream_t stream_;
  int device_;
  ncclComm_t comm_ = nullptr;
};

}  // namespace

bool nccl_compiled() {
  return true;
}
std::unique_ptr<Communicator> make_nccl_comm(Communicator& bootstrap, int device, void* stream) {
  return std::make_unique<NcclComm>(bootstrap, device, static_cast<cudaStream_t>(stream));
}
void set_nccl_stream(Communicator& comm, void* stream) {
  auto* nccl = dynamic_cast<NcclComm*>(&comm);
  if (nccl == nullptr)
    throw Error(str("data-parallel training on GPUs needs an NCCL communicator, not ", comm.describe()));
  nccl->set_stream(static_cast<cudaStream_t>(stream));
}

}  // namespace forge

#else  // no NCCL

namespace forge {

bool nccl_compiled() {
  return false;
}
std::unique_ptr<Communicator> make_nccl_comm(Communicator&, int, void*) {
  throw Error(
      "this forge was built without NCCL: it needs the CUDA backend and nccl.h + libnccl found "
      "at configure time");
}
void set_nccl_stream(Communicator& comm, void*) {
  throw Error(str("data-parallel training on GPUs needs an NCCL communicator, not ", comm.describe(),
                  " (this forge was built without NCCL)"));
}

}  // namespace forge

#endif
