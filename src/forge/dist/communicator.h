// The collectives that data-parallel training needs, behind one interface so that the runners
// are written once: LocalComm (a world of one, always built), MpiComm (CPU ranks over MPI;
// dist/mpi_comm.h) and NcclComm (GPU ranks; dist/nccl_comm.h).
//
// Every call is collective: all ranks make the same calls in the same order with the same sizes,
// or the run hangs (MPI and NCCL cannot tell a missing call from a slow rank). Buffers live where
// the implementation moves data: host memory for LocalComm and MpiComm, device memory on the
// communicator's stream for NcclComm.
//
// Sharding (reduce_scatter_sum / allgather): a flat buffer of n elements is padded with zeros to
// padded_size(n, W) = W · shard_size(n, W), shard_size = ceil(n / W), so that every rank holds
// an equal shard (NCCL's reduce-scatter and all-gather need equal counts). Rank r owns elements
// [r·s, (r+1)·s) of the padded buffer; the padding sits at the end, in the last rank(s)' shards,
// and its elements are zeros that no optimizer update reads back into the model.
//
// Determinism of sums: an element's sum over ranks is computed once (reduce_scatter_sum) or by
// MPI's allreduce. MPI_SUM of floats is commutative, so for 2 ranks every algorithm computes
// a + b = b + a: bit-exact and the same on both ranks. For 3 or more ranks MPI does not fix the
// association ((a + b) + c vs a + (b + c)), which may follow the rank count, the message size
// and the algorithm the library picks; the standard only *recommends* a result independent of
// the data's distribution. Where all ranks must agree bit for bit on a decision (the step guard,
// the clipping factor), callers use allgather_sum_in_rank_order() below, which is independent
// of the library's algorithm.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace forge {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;              // 0 .. size() − 1
  virtual int size() const = 0;              // ranks in the world
  virtual int local_rank() const = 0;        // rank among the ranks of this machine (GPU index)
  virtual std::string describe() const = 0;  // "mpi rank 1 of 2"

  // buf[i] ← Σ over ranks of buf[i], on every rank. n elements.
  virtual void allreduce_sum(float* buf, size_t n) = 0;
  virtual void allreduce_sum(double* buf, size_t n) = 0;
  // in: size() · shard elements (the padded flat buffer); out: shard elements, out[i] = Σ over
  // ranks of in[rank() · shard + i]. in and out must not overlap.
  virtual void reduce_scatter_sum(const float* in, float* out, size_t shard) = 0;
  // in: this rank's shard elements; out: size() · shard elements, rank r's at r · shard.
  // in and out must not overlap.
  virtual void allgather(const float* in, float* out, size_t shard) = 0;
  // n bytes of root's buf copied into every rank's buf.
  virtual void broadcast(void* buf, size_t n, int root) = 0;
  virtual void barrier() = 0;
  // Stops every rank of the world: prints "forge: rank R: message" on stderr and ends this
  // process with a non-zero status; the launcher (mpirun) then ends the others. For a failure on
  // one rank that the others cannot see (they would wait in the next collective forever).
  [[noreturn]] virtual void abort(const std::string& message) = 0;
};

// A world of one rank: every collective is a copy or nothing. What a run without a launcher uses.
class LocalComm final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_rank() const override { return 0; }
  std::string describe() const override { return "local (1 rank)"; }
  void allreduce_sum(float*, size_t) override {}
  void allreduce_sum(double*, size_t) override {}
  void reduce_scatter_sum(const float* in, float* out, size_t shard) override;
  void allgather(const float* in, float* out, size_t shard) override;
  void broadcast(void*, size_t, int root) override;
  void barrier() override {}
  [[noreturn]] void abort(const std::string& message) override;
};

// ceil(n / world): the elements of each rank's shard.
inline size_t shard_size(size_t n, int world) {
  return (n + world - 1) / world;
}
// world · shard_size(n, world): the flat buffer with its zero padding.
inline size_t padded_size(size_t n, int world) {
  return shard_size(n, world) * world;
}

// Each rank contributes `values` (the same count on every rank); returns, on every rank, the
// element-wise sum over ranks added in rank order (rank 0 first), bit-identical on all ranks
// whatever the collective algorithm: the values travel through allreduce_sum in one slot per
// rank, zeros elsewhere, and x + 0 is exact. For a few scalars per step (losses, Σ g²), not for
// gradients: it moves size() times the data.
std::vector<double> allgather_sum_in_rank_order(Communicator& comm,
                                                const std::vector<double>& values);

}  // namespace forge
