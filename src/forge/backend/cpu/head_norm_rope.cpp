// CPU per-head RMSNorm + RoPE (Qwen3's q/k norm in training): the reference for the CUDA fused
// op, composed of the unfused kernels in the order the model ran them before the fusion —
// rmsnorm_fwd over the B·T·H heads of HS, then rope_fwd in place; backward rope_bwd on a copy of
// dx, then rmsnorm_bwd into a zeroed dx_raw. The copy lets dx_raw alias dx and leaves dx as it
// was when it does not.
#include "forge/ops/head_norm_rope.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "forge/core/error.h"
#include "forge/ops/rmsnorm.h"

namespace forge::cpu {

template <typename T>
void head_norm_rope_fwd(T* x, T* rstd, const T* x_raw, const T* weight, int B, int T_, int H,
                        int HS, float eps, const Rope* rope, const int32_t* pos) {
  FORGE_CHECK(B >= 0 && T_ >= 0 && H > 0 && HS > 0, "[head_norm_rope_fwd] bad shape B=", B,
              " T=", T_, " H=", H, " HS=", HS);
  FORGE_CHECK(x != x_raw, "[head_norm_rope_fwd] x must not alias x_raw (the backward reads x_raw)");
  const int64_t rows = static_cast<int64_t>(B) * T_ * H;
  FORGE_CHECK(rows < (int64_t{1} << 31), "[head_norm_rope_fwd] B·T·H = ", rows,
              " exceeds int32 rows");
  rmsnorm_fwd<T>(x, rstd, x_raw, weight, static_cast<int>(rows), HS, eps);
  if (rope != nullptr) rope_fwd<T>(x, B, T_, H, HS, *rope, 0, pos);
}

template <typename T>
void head_norm_rope_bwd(T* dx_raw, T* dweight, const T* dx, const T* x_raw, const T* weight,
                        const T* rstd, int B, int T_, int H, int HS, const Rope* rope,
                        const int32_t* pos) {
  FORGE_CHECK(B >= 0 && T_ >= 0 && H > 0 && HS > 0, "[head_norm_rope_bwd] bad shape B=", B,
              " T=", T_, " H=", H, " HS=", HS);
  const int64_t rows = static_cast<int64_t>(B) * T_ * H;
  FORGE_CHECK(rows < (int64_t{1} << 31), "[head_norm_rope_bwd] B·T·H = ", rows,
              " exceeds int32 rows");
  const size_t n = static_cast<size_t>(rows) * HS;
  std::vector<T> dnorm(dx, dx + n);  // (B, T, H, HS): the gradient of the norm's output
  if (rope != nullptr) rope_bwd<T>(dnorm.data(), B, T_, H, HS, *rope, 0, pos);
  std::fill_n(dx_raw, n, T(0));
  rmsnorm_bwd<T>(dx_raw, dweight, dnorm.data(), x_raw, weight, rstd, static_cast<int>(rows), HS);
}

#define FORGE_INSTANTIATE(T)                                                                    \
  template void head_norm_rope_fwd<T>(T*, T*, const T*, const T*, int, int, int, int, float,    \
                                      const Rope*, const int32_t*);                             \
  template void head_norm_rope_bwd<T>(T*, T*, const T*, const T*, const T*, const T*, int, int, \
                                      int, int, const Rope*, const int32_t*);
FORGE_INSTANTIATE(float)
FORGE_INSTANTIATE(double)
#undef FORGE_INSTANTIATE

}  // namespace forge::cpu
