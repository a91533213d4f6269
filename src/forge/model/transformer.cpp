// The model on the CPU backend: the one orchestration of transformer_impl.h, instantiated for
// float (training) and double (finite-difference checks).
#include "forge/model/transformer_impl.h"

namespace forge {

template class Model<CpuBackend<float>>;
template class Model<CpuBackend<double>>;

}  // namespace forge
