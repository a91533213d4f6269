// The model on the CUDA backend: the one orchestration of transformer_impl.h, instantiated for
// CudaBackend (backend/cuda/backend.h).
#include "forge/model/transformer_cuda.h"

#include "forge/model/transformer_impl.h"

namespace forge {

template class Model<CudaBackend>;

}  // namespace forge
