// A model ready to generate on one device, behind one interface: the CLI (forge generate, forge
// bench generate, later forge serve) picks the device at run time without knowing the backend
// types. Both engines run generate_batch (generator.h) over Model<Backend>, and open a decode loop
// (decode_loop.h) that requests join while it runs (forge serve).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "forge/core/dtype.h"
#include "forge/generate/generator.h"
#include "forge/model/config.h"

namespace forge {

template <class Backend>
class Model;
template <typename T>
class CpuBackend;

class Engine {
 public:
  virtual ~Engine() = default;
  virtual const ModelConfig& config() const = 0;
  virtual std::string device_name() const = 0;
  virtual std::vector<GenResult> generate(const std::vector<GenRequest>& reqs, const GenOptions& opt,
                                          const TokenCallback& on_token = {}, GenStats* stats = nullptr) = 0;
  // A decode loop over this engine's model (its decode cache planned as opt.slots × opt.capacity;
  // capacity 0: the model's context). It borrows the model: one at a time, used from one thread,
  // and no generate() while it is open. CUDA: `pdl` as in GenOptions.
  virtual std::unique_ptr<DecodeSession> open_loop(DecodeLoopOptions opt, TokenCallback on_token,
                                                   DoneCallback on_done, bool pdl = true) = 0;
};

// The CPU model (f32) with these weights (the parameter table's layout, f32), copied.
std::unique_ptr<Engine> make_cpu_engine(const ModelConfig& cfg, const std::vector<float>& weights);
// The CPU engine over this model, moved in (no copy of the weights): what the commands use, with
// the model loaded by load_model_dir(dir, GradBuffers::kNone).
std::unique_ptr<Engine> make_cpu_engine(Model<CpuBackend<float>>&& model);

// The CUDA model on GPU `device` computing in `dtype` ("bf16", "fp16" or "fp32"); throws
// forge::Error naming the reason when this build or machine has no CUDA GPU.
std::unique_ptr<Engine> make_cuda_engine(const ModelConfig& cfg, const std::vector<float>& weights,
                                         const std::string& dtype, int device = 0);

// A loaded model (moved in) made an engine on `device`: the CPU engine keeps it; the CUDA engine
// (GPU 0, computing in `dtype`) copies its weights to the GPU and the host copy is freed here.
std::unique_ptr<Engine> make_engine(Model<CpuBackend<float>>&& model, Device device, const std::string& dtype);

}  // namespace forge
