// MpiComm (dist/mpi_comm.h): each collective is the one MPI call of the same name, on host
// buffers. Counts are int in MPI; buffers longer than that go in pieces where the collective
// allows (allreduce, broadcast) and are refused as a broken invariant where it does not
// (reduce-scatter and all-gather shards of 2^31 elements: 8 GB of f32 per rank).
#include "forge/dist/mpi_comm.h"

#include "forge/core/error.h"

#ifdef FORGE_HAVE_MPI

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>

namespace forge {

namespace {

[[noreturn]] void mpi_failed(const char* expr, const char* file, int line, int rc) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  check_failed(expr, file, line, std::string("MPI error: ") + std::string(msg, len));
}

#define FORGE_MPI_CHECK(expr)                                                       \
  do {                                                                              \
    const int forge_rc_ = (expr);                                                   \
    if (forge_rc_ != MPI_SUCCESS) mpi_failed(#expr, __FILE__, __LINE__, forge_rc_); \
  } while (0)

constexpr size_t kMaxCount = INT_MAX;

class MpiComm final : public Communicator {
 public:
  MpiComm() {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (finalized) throw Error("MPI was already finalized in this process: it cannot start again");
    if (!initialized) {
      int provided = 0;
      FORGE_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided));
      owns_mpi_ = true;
    }
    FORGE_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm_));
    // Errors come back as codes, so that FORGE_MPI_CHECK names the failed call.
    FORGE_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    FORGE_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    FORGE_MPI_CHECK(MPI_Comm_size(comm_, &size_));
    MPI_Comm node;
    FORGE_MPI_CHECK(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
    FORGE_MPI_CHECK(MPI_Comm_rank(node, &local_rank_));
    FORGE_MPI_CHECK(MPI_Comm_free(&node));
  }

  ~MpiComm() override {
    MPI_Comm_free(&comm_);
    if (owns_mpi_) MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  std::string describe() const override { return str("mpi rank ", rank_, " of ", size_); }

  void allreduce_sum(float* buf, size_t n) override { allreduce(buf, n, MPI_FLOAT); }
  void allreduce_sum(double* buf, size_t n) override { allreduce(buf, n, MPI_DOUBLE); }

  void reduce_scatter_sum(const float* in, float* out, size_t shard) override {
    FORGE_CHECK(shard <= kMaxCount, "[reduce_scatter_sum] shard of ", shard, " elements");
    FORGE_MPI_CHECK(
        MPI_Reduce_scatter_block(in, out, static_cast<int>(shard), MPI_FLOAT, MPI_SUM, comm_));
  }

  void allgather(const float* in, float* out, size_t shard) override {
    FORGE_CHECK(shard <= kMaxCount, "[allgather] shard of ", shard, " elements");
    const int count = static_cast<int>(shard);
    FORGE_MPI_CHECK(MPI_Allgather(in, count, MPI_FLOAT, out, count, MPI_FLOAT, comm_));
  }

  void broadcast(void* buf, size_t n, int root) override {
    FORGE_CHECK(root >= 0 && root < size_, "[broadcast] root ", root, " of ", size_, " ranks");
    char* p = static_cast<char*>(buf);
    for (size_t done = 0; done < n;) {
      const size_t len = std::min(n - done, kMaxCount);
      FORGE_MPI_CHECK(MPI_Bcast(p + done, static_cast<int>(len), MPI_BYTE, root, comm_));
      done += len;
    }
  }

  void barrier() override { FORGE_MPI_CHECK(MPI_Barrier(comm_)); }

  void abort(const std::string& message) override {
    std::fprintf(stderr, "forge: rank %d: %s\n", rank_, message.c_str());
    std::fflush(stderr);
    MPI_Abort(comm_, 1);
    std::_Exit(1);  // MPI_Abort does not return; this is for the compiler
  }

 private:
  void allreduce(void* buf, size_t n, MPI_Datatype type) {
    int elem = 0;
    MPI_Type_size(type, &elem);
    char* p = static_cast<char*>(buf);
    for (size_t done = 0; done < n;) {
      const size_t len = std::min(n - done, kMaxCount);
      FORGE_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, p + done * elem, static_cast<int>(len), type,
                                    MPI_SUM, comm_));
      done += len;
    }
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1, local_rank_ = 0;
  bool owns_mpi_ = false;
};

}  // namespace

bool mpi_compiled() {
  return true;
}
std::unique_ptr<Communicator> make_mpi_comm() {
  return std::make_unique<MpiComm>();
}

}  // namespace forge

#else  // no MPI

namespace forge {

bool mpi_compiled() {
  return false;
}
std::unique_ptr<Communicator> make_mpi_comm() {
  throw Error(
      "this forge was built without MPI: install libopenmpi-dev and openmpi-bin "
      "(scripts/setup.sh) and configure again");
}

}  // namespace forge

#endif
