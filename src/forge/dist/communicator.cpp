// LocalComm and the rank-order sum (dist/communicator.h).
#include "forge/dist/communicator.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "forge/core/error.h"

namespace forge {

void LocalComm::reduce_scatter_sum(const float* in, float* out, size_t shard) {
  std::memcpy(out, in, shard * sizeof(float));
}

void LocalComm::allgather(const float* in, float* out, size_t shard) {
  std::memcpy(out, in, shard * sizeof(float));
}

void LocalComm::broadcast(void*, size_t, int root) {
  FORGE_CHECK(root == 0, "[broadcast] root ", root, " in a world of 1");
}

void LocalComm::abort(const std::string& message) {
  std::fprintf(stderr, "forge: rank 0: %s\n", message.c_str());
  std::fflush(stderr);
  std::exit(1);
}

std::vector<double> allgather_sum_in_rank_order(Communicator& comm,
                                                const std::vector<double>& values) {
  const size_t k = values.size();
  const int world = comm.size();
  std::vector<double> slots(k * world, 0.0);  // (world, k): this rank's row holds its values
  for (size_t i = 0; i < k; ++i) slots[comm.rank() * k + i] = values[i];
  comm.allreduce_sum(slots.data(), slots.size());
  std::vector<double> sum(k, 0.0);
  for (int r = 0; r < world; ++r)
    for (size_t i = 0; i < k; ++i) sum[i] += slots[r * k + i];
  return sum;
}

}  // namespace forge
