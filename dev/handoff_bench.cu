// handoff_bench: what a kernel boundary costs in a graph-replayed chain of small dependent kernels
// (the shape of a batch-1 decode step: ~150 of them a token), and whether a counter or flag
// handoff, or one persistent kernel with barriers, beats PDL's grid wait.
//
// Each kernel of a chain of K reads the whole 1,536-float vector the kernel before wrote, sums it
// (a block reduction: every block depends on every block before), and writes its slice of the next
// vector. Modes:
//   plain    launches in stream order (no PDL);
//   pdl      programmatic dependent launch: trigger at the start, griddepcontrol.wait before reading;
//   counter  PDL's early launch, but instead of the grid wait each block polls a counter that every
//            block of the kernel before increments (release) after its writes (acquire polls). The
//            counters count up across replays; the target is (epoch + 1) × blocks, epoch a step
//            counter the chain's last kernel advances;
//   flag     one flag a block (st.release of epoch + 1), thread t of the next kernel polls flag t;
//   flag, relaxed polls: the same with relaxed polls and one fence after them.
// Then the same K phases inside one kernel: a thread-block cluster's hardware barrier between
// phases (up to 16 blocks), or a grid-wide barrier of resident blocks (a counter).
// Prints µs per kernel or phase (graph replays, events) and checks every mode computes the same.
//
// H200, 2026-12-04 (150 kernels or phases; µs each): PDL 1.5–1.75 (8–132 blocks), plain launches
// 1.8–2.2, counter 2.1–2.9, flags 2.0–3.7; in one kernel, cluster barrier 1.45 (8 and 16
// blocks), grid barrier 1.8–2.1. So a dependent step costs ~1.5 µs whatever carries it, and PDL
// is as cheap as any: docs/perf-notes.md draws the conclusion for the decode step.
//
//   cmake --build build --target handoff_bench && build/handoff_bench [kernels 150] [replays 200]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                      \
  do {                                                                             \
    cudaError_t e_ = (x);                                                          \
    if (e_ != cudaSuccess) {                                                       \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                                \
    }                                                                              \
  } while (0)

namespace {

constexpr int kN = 1536;
constexpr int kThreads = 256;

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ unsigned ld_relaxed(const unsigned* p) {
  unsigned v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_relaxed(unsigned* p, unsigned v) {
  asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void st_release(unsigned* p, unsigned v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void red_release_add(unsigned* p, unsigned v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// mode 0 plain, 1 pdl, 2 flag. wait_on: the counter of the kernel before (nullptr for the first).
__global__ void chain_kernel(const float* in, float* out, int mode, unsigned* my_count, const unsigned* wait_on,
                             unsigned wait_blocks, unsigned* epoch, int last) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  __shared__ float red[kThreads / 32];
  const unsigned ep0 = *reinterpret_cast<volatile unsigned*>(epoch);  // before anything can advance it
  if (mode == 2) {
    if (threadIdx.x == 0) {
      const unsigned ep = *reinterpret_cast<volatile unsigned*>(epoch);
      if (wait_on) {
        const unsigned target = (ep + 1) * wait_blocks;
        while (static_cast<int>(ld_acquire(wait_on) - target) < 0) {
        }
      }
    }
    __syncthreads();
  } else if (mode == 4) {  // mode 3 with relaxed polls and one fence after them
    if (wait_on && threadIdx.x < wait_blocks) {
      while (ld_relaxed(wait_on + threadIdx.x) != ep0 + 1) {
      }
      __threadfence();
    }
    __syncthreads();
  } else if (mode == 3) {  // one flag a block: flags[k][b] = epoch + 1; every thread t < G polls one
    if (wait_on && threadIdx.x < wait_blocks)
      while (ld_acquire(wait_on + threadIdx.x) != ep0 + 1) {
      }
    __syncthreads();
  } else {
    asm volatile("griddepcontrol.wait;" ::: "memory");
  }
  float s = 0;
  for (int i = threadIdx.x; i < kN; i += kThreads) s += in[i];
  for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = s;
  __syncthreads();
  float tot = 0;
  for (int w = 0; w < kThreads / 32; ++w) tot += red[w];
  const int per = (kN + gridDim.x - 1) / gridDim.x;
  for (int i = threadIdx.x; i < per; i += kThreads) {
    const int j = blockIdx.x * per + i;
    if (j < kN) out[j] = 0.5f * in[j] + tot * (1.0f / kN) * 0.25f + 0.001f;
  }
  if (mode == 4) {
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      st_relaxed(my_count + blockIdx.x, ep0 + 1);
      if (last && blockIdx.x == 0) atomicAdd(epoch, 1u);
    }
  }
  if (mode == 3) {
    __syncthreads();
    if (threadIdx.x == 0) {
      st_release(my_count + blockIdx.x, ep0 + 1);
      if (last && blockIdx.x == 0) atomicAdd(epoch, 1u);
    }
  }
  if (mode == 2) {
    __syncthreads();
    if (threadIdx.x == 0) {
      red_release_add(my_count, 1u);
      if (last && blockIdx.x == 0) {
        // Every kernel of this step has read the epoch: each block reads it before it signals, and
        // this block waited (transitively) for all of them.
        atomicAdd(epoch, 1u);
      }
    }
  }
}

// One kernel, K phases of the same work, a barrier between phases: a thread-block cluster's
// hardware barrier (kind 0, G <= 16 blocks of one cluster) or a grid-wide barrier of G resident
// blocks (kind 1: a counter, release add and acquire polls). Reads through L2 (ld.cg).
__global__ void phases_kernel(float* buf, int K, int kind, unsigned* count) {
  __shared__ float red[kThreads / 32];
  const unsigned G = gridDim.x;
  for (int k = 0; k < K; ++k) {
    const float* in = buf + (k % 3) * kN;
    float* out = buf + ((k + 1) % 3) * kN;
    float s = 0;
    for (int i = threadIdx.x; i < kN; i += kThreads) s += __ldcg(in + i);
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = s;
    __syncthreads();
    float tot = 0;
    for (int w = 0; w < kThreads / 32; ++w) tot += red[w];
    const int per = (kN + G - 1) / G;
    for (int i = threadIdx.x; i < per; i += kThreads) {
      const int j = blockIdx.x * per + i;
      if (j < kN) out[j] = 0.5f * __ldcg(in + j) + tot * (1.0f / kN) * 0.25f + 0.001f;
    }
    if (kind == 0) {
      asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
    } else {
      __syncthreads();
      if (threadIdx.x == 0) {
        red_release_add(count, 1u);
        const unsigned target = (k + 1) * G;
        while (static_cast<int>(ld_acquire(count) - target) < 0) {
        }
      }
      __syncthreads();
    }
  }
}

float run_phases(int kind, int K, int G, std::vector<float>* result) {
  float* buf;
  unsigned* count;
  CK(cudaMalloc(&buf, 3 * kN * sizeof(float)));
  CK(cudaMalloc(&count, sizeof(unsigned)));
  std::vector<float> init(kN);
  for (int i = 0; i < kN; ++i) init[i] = std::sin(0.1f * i);
  if (kind == 0) CK(cudaFuncSetAttribute(phases_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = G;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(G);
  cfg.blockDim = dim3(kThreads);
  cfg.attrs = attr;
  cfg.numAttrs = kind == 0 ? 1 : 0;
  float best = 1e30f;
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int r = 0; r < 6; ++r) {
    CK(cudaMemcpy(buf, init.data(), kN * sizeof(float), cudaMemcpyHostToDevice));
    CK(cudaMemset(count, 0, sizeof(unsigned)));
    CK(cudaEventRecord(a));
    CK(cudaLaunchKernelEx(&cfg, phases_kernel, buf, K, kind, count));
    CK(cudaEventRecord(b));
    CK(cudaDeviceSynchronize());
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    if (r > 0) best = std::min(best, ms);
  }
  result->resize(kN);
  CK(cudaMemcpy(result->data(), buf + (K % 3) * kN, kN * sizeof(float), cudaMemcpyDeviceToHost));
  CK(cudaFree(buf));
  CK(cudaFree(count));
  return best * 1000.0f / K;
}

float run(int mode, int K, int G, int replays, std::vector<float>* result) {
  float* buf;
  unsigned* counts;
  unsigned* epoch;
  CK(cudaMalloc(&buf, 3 * kN * sizeof(float)));
  CK(cudaMalloc(&counts, K * 256 * sizeof(unsigned)));
  CK(cudaMalloc(&epoch, sizeof(unsigned)));
  CK(cudaMemset(counts, 0, K * 256 * sizeof(unsigned)));
  CK(cudaMemset(epoch, 0, sizeof(unsigned)));
  std::vector<float> init(kN);
  for (int i = 0; i < kN; ++i) init[i] = std::sin(0.1f * i);
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  for (int k = 0; k < K; ++k) {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(G);
    cfg.blockDim = dim3(kThreads);
    cfg.stream = st;
    cfg.attrs = attr;
    cfg.numAttrs = (mode != 0 && k > 0) ? 1 : 0;
    const float* in = buf + (k % 3) * kN;
    float* out = buf + ((k + 1) % 3) * kN;
    // The first kernel waits for nothing (the replay before has completed: graphs are in order).
    const int stride = mode >= 3 ? 256 : 1;
    CK(cudaLaunchKernelEx(&cfg, chain_kernel, in, out, mode, counts + k * stride,
                          k > 0 ? counts + (k - 1) * stride : nullptr,
                          static_cast<unsigned>(G), epoch, k == K - 1 ? 1 : 0));
  }
  CK(cudaStreamEndCapture(st, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  // Warm-up, then timed replays; the input is reset before each so all modes compute the same.
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int r = 0; r < 20; ++r) CK(cudaGraphLaunch(exec, st));
  CK(cudaEventRecord(a, st));
  for (int r = 0; r < replays; ++r) CK(cudaGraphLaunch(exec, st));
  CK(cudaEventRecord(b, st));
  CK(cudaStreamSynchronize(st));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, a, b));
  CK(cudaMemcpy(buf, init.data(), kN * sizeof(float), cudaMemcpyHostToDevice));
  CK(cudaGraphLaunch(exec, st));
  CK(cudaStreamSynchronize(st));
  result->resize(kN);
  CK(cudaMemcpy(result->data(), buf + (K % 3) * kN, kN * sizeof(float), cudaMemcpyDeviceToHost));
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  CK(cudaFree(buf));
  CK(cudaFree(counts));
  CK(cudaFree(epoch));
  CK(cudaStreamDestroy(st));
  return ms * 1000.0f / (static_cast<float>(replays) * K);
}

}  // namespace

int main(int argc, char** argv) {
  const int K = argc > 1 ? std::atoi(argv[1]) : 150;
  const int replays = argc > 2 ? std::atoi(argv[2]) : 200;
  std::printf("handoff_bench: chains of %d kernels (256 threads, a 1,536-float vector each), %d graph replays\n\n", K,
              replays);
  std::printf("| blocks | plain µs/kernel | pdl | counter | flag a block | flag, relaxed polls |\n"
              "| ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (int G : {8, 24, 48, 96, 132}) {
    std::vector<float> r0, r1, r2, r3, r4;
    const float t0 = run(0, K, G, replays, &r0);
    const float t1 = run(1, K, G, replays, &r1);
    const float t2 = run(2, K, G, replays, &r2);
    const float t3 = run(3, K, G, replays, &r3);
    const float t4 = run(4, K, G, replays, &r4);
    for (int i = 0; i < kN; ++i)
      if (r0[i] != r1[i] || r0[i] != r2[i] || r0[i] != r3[i] || r0[i] != r4[i]) {
        std::printf("MISMATCH at blocks %d, element %d: %g %g %g\n", G, i, r0[i], r1[i], r2[i]);
        return 1;
      }
    std::printf("| %d | %.2f | %.2f | %.2f | %.2f | %.2f |\n", G, t0, t1, t2, t3, t4);
  }
  std::printf("\nOne kernel of %d phases, a barrier between phases (µs a phase; the same result as the chains):\n\n"
              "| blocks | cluster barrier | grid barrier (counter) |\n| ---: | ---: | ---: |\n", K);
  for (int G : {8, 16, 48, 132}) {
    std::vector<float> want, rc, rg;
    run(1, K, G, 4, &want);
    const float tc = G <= 16 ? run_phases(0, K, G, &rc) : 0.0f;
    const float tg = run_phases(1, K, G, &rg);
    for (int i = 0; i < kN; ++i)
      if ((G <= 16 && rc[i] != want[i]) || rg[i] != want[i]) {
        std::printf("MISMATCH (phases) at blocks %d, element %d\n", G, i);
        return 1;
      }
    if (G <= 16)
      std::printf("| %d | %.2f | %.2f |\n", G, tc, tg);
    else
      std::printf("| %d | — | %.2f |\n", G, tg);
  }
  return 0;
}
