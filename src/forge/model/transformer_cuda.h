// The model on the CUDA backend: Model<CudaBackend>, the same orchestration as the CPU model
// (transformer_impl.h) over backend/cuda/backend.h. Built only with CUDA.
#pragma once

#include "forge/backend/cuda/backend.h"
#include "forge/model/transformer.h"

namespace forge {

// Constructed as CudaTransformer(cfg, ctx, CudaModelOptions{...}).
using CudaTransformer = Model<CudaBackend>;

extern template class Model<CudaBackend>;

}  // namespace forge
