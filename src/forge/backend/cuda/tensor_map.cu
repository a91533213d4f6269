#include "forge/backend/cuda/tensor_map.h"

#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include "forge/core/error.h"

namespace forge::cuda {
namespace {

// cuTensorMapEncodeTiled through the runtime's entry-point query, so the binary does not link
// libcuda (it must start on machines without a driver: CI).
PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q);
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !p)
      throw Error(str("cuTensorMapEncodeTiled is not available from the driver (", cudaGetErrorString(e), ")"));
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

}  // namespace

CUtensorMap make_tile_map(const void* base, DType dt, int64_t W, int64_t ld, int64_t T, int64_t B, int box_rows) {
  FORGE_CHECK(dt == DType::kBF16 || dt == DType::kF16, "make_tile_map: 16-bit dtypes only, not ", dtype_name(dt));
  CUtensorMap map{};
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(W), static_cast<cuuint64_t>(T), static_cast<cuuint64_t>(B)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(ld) * 2, static_cast<cuuint64_t>(ld) * T * 2};
  const cuuint32_t box[3] = {64, static_cast<cuuint32_t>(box_rows), 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUresult r = encode_fn()(
      &map, dt == DType::kBF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3,
      const_cast<void*>(base), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw Error(str("make_tile_map: cuTensorMapEncodeTiled failed (error ", static_cast<int>(r), ") for W=", W,
                    " ld=", ld, " T=", T, " B=", B, " box rows ", box_rows));
  return map;
}

}  // namespace forge::cuda
