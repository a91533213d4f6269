// LoRA on the GPU (make_lora_cuda_runner, CudaBackend's adapters): five steps of the CUDA LoRA
// runner track the CPU LoRA runner from the same base and adapters (fp32 tightly, bf16 loosely);
// the frozen base has no gradient buffer and no Adam state, and its weights are bit-identical
// after steps; adapters and Adam state carried into a fresh runner continue bit for bit (what a
// checkpoint and resume rely on); the data-parallel path (ZeRO-1 over the adapters, forced on a
// one-rank NCCL communicator) equals the plain runner bit for bit; and forge's trainer on
// --device cuda --lora logs the CPU run's losses and saves the PEFT adapter directory the CPU run
// saves.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/cuda/op_testing.h"
#include "forge/core/rng.h"
#include "forge/dist/communicator.h"
#include "forge/dist/nccl_comm.h"
#include "forge/model/lora_dir.h"
#include "forge/model/model_dir.h"
#include "forge/model/transformer.h"
#include "forge/model/transformer_cuda.h"
#include "forge/train/runner.h"
#include "forge/train/trainer.h"
#include "model/small_configs.h"
#include "train/sft_task.h"

namespace forge {
namespace {

namespace fs = std::filesystem;
using cuda::testing::bit_identical;
using cuda::testing::CudaTest;

LoraConfig all_targets() {
  LoraConfig l;
  l.r = 4;
  l.alpha = 8;
  l.targets = {LoraTarget::kQ, LoraTarget::kK, LoraTarget::kV, LoraTarget::kO,
               LoraTarget::kGate, LoraTarget::kUp, LoraTarget::kDown};
  return l;
}

// A small Llama with adapters on every projection; B made nonzero (a fresh adapter's B = 0 would
// leave A's gradient zero in the first step).
Transformer<float> lora_model() {
  Transformer<float> m(testing::small_config(Family::kLlama));
  m.init_weights(21);
  m.attach_lora(all_targets(), 5);
  const std::vector<float> noise = testing::random_normal<float>(m.adapter_weights().size(), 77, 0.05);
  for (size_t i = 0; i < noise.size(); ++i) m.adapter_weights()[i] += noise[i];
  return m;
}

constexpr int kB = 4, kT = 16;

// Step s of every run here: two micro-batches, lr 1e-2, weight decay 0.1, clipping at 1; the
// step `poison` gets a NaN gradient (the guard skips it).
void run_step(StepRunner& r, const ModelConfig& cfg, int s, int poison = -1) {
  r.zero_grad();
  for (int micro = 0; micro < 2; ++micro) {
    const uint64_t seed = 3000 + 10 * s + 2 * micro;
    auto x = testing::random_ids(kB * kT, cfg.vocab_size, seed), y = testing::random_ids(kB * kT, cfg.vocab_size, seed + 1);
    if (micro == 1) y[3] = -1;
    r.micro_step(x.data(), y.data(), kB, kT, 0.5);
  }
  if (s == poison) r.inject_fault(StepFault::kNanGrad);
  AdamWParams p;
  p.lr = 1e-2f;
  p.weight_decay = 0.1f;
  p.step = s + 1;
  r.optimizer_step(p, 1.0);
}

std::vector<StepReport> run_steps(StepRunner& r, const ModelConfig& cfg, int from, int to, int poison = -1) {
  std::vector<StepReport> out;
  for (int s = from; s < to; ++s) {
    run_step(r, cfg, s, poison);
    while (static_cast<int>(out.size()) < s + 1 - from - r.report_lag()) out.push_back(r.take_report());
  }
  while (static_cast<int>(out.size()) < to - from) out.push_back(r.take_report());
  return out;
}

double norm_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
  return std::sqrt(s);
}

class LoraCudaRunnerTest : public CudaTest {};

// Tolerances: fp32 computes what the CPU does in another summation order (losses 1e-4 relative;
// adapters, after five Adam steps whose first update is ~lr·sign(g), within 0.5% of how far they
// moved). bf16 rounds every activation to 8 bits (losses 2e-2 relative, norms 5e-2; adapters
// within 50% of how far they moved, since Adam's first steps take the sign of gradients that bf16
// noise can flip where they are small; a wrong product, transpose or scale moves them elsewhere,
// a difference of the order of the move itself).
TEST_F(LoraCudaRunnerTest, FiveStepsTrackTheCpuLoraRunner) {
  for (const char* precision : {"fp32", "bf16"}) {
    SCOPED_TRACE(precision);
    const bool fp32 = std::string(precision) == "fp32";
    const Transformer<float> host = lora_model();
    const ModelConfig& cfg = host.config();
    auto cpu = make_lora_cpu_runner(host);
    auto gpu = make_lora_cuda_runner(host, precision);
    cpu->set_weights(host.adapter_weights());  // as the trainer does
    gpu->set_weights(host.adapter_weights());
    const std::vector<StepReport> rc = run_steps(*cpu, cfg, 0, 5), rg = run_steps(*gpu, cfg, 0, 5);
    const double tol_loss = fp32 ? 1e-4 : 2e-2, tol_norm = fp32 ? 1e-3 : 5e-2;
    for (int s = 0; s < 5; ++s) {
      ASSERT_EQ(rg[s].micro_losses.size(), 2u);
      EXPECT_FALSE(rg[s].skipped) << "step " << s;
      for (int i = 0; i < 2; ++i)
        EXPECT_NEAR(rg[s].micro_losses[i], rc[s].micro_losses[i], tol_loss * rc[s].micro_losses[i])
            << "step " << s << " micro " << i;
      EXPECT_GT(rc[s].grad_norm, 0.0);
      EXPECT_NEAR(rg[s].grad_norm, rc[s].grad_norm, tol_norm * rc[s].grad_norm) << "step " << s;
    }
    const std::vector<float> w0 = host.adapter_weights(), wc = cpu->weights(), wg = gpu->weights();
    ASSERT_EQ(wg.size(), w0.size());
    const double moved = norm_diff(wc, w0);
    EXPECT_GT(moved, 0.0);
    EXPECT_LT(norm_diff(wg, wc), (fp32 ? 5e-3 : 0.5) * moved) << "moved " << moved;
    // Adam's state is the adapters' alone.
    EXPECT_EQ(gpu->adam_m().size(), w0.size());
    EXPECT_EQ(gpu->adam_v().size(), w0.size());
    EXPECT_NE(gpu->describe().find("lora r=4"), std::string::npos) << gpu->describe();
  }
}

// The base on the model level: attaching adapters releases the base's gradients and Adam state
// (and, in bf16, its f32 master: weights_host() is then the bf16 working copy), and steps leave
// the base's weights bit for bit while the adapters move. Llama in fp32 and bf16, and in bf16 the
// Llama-layout variants whose extra base tensors have their own gradient paths (q/k/v/o biases,
// Qwen3's per-head q/k norms, SmolLM3's layer without RoPE): each must take a null gradient.
TEST_F(LoraCudaRunnerTest, BaseStaysFrozenWithoutGradientsOrAdamState) {
  const ModelConfig llama = testing::small_config(Family::kLlama);
  std::vector<std::pair<std::string, ModelConfig>> cases = testing::llama_family_variants(llama);
  cases.emplace(cases.begin(), "llama", llama);
  for (const auto& [name, cfg] : cases)
    for (DType dt : {DType::kF32, DType::kBF16}) {
      if (dt == DType::kF32 && name != "llama") continue;
      SCOPED_TRACE(name + " " + dtype_name(dt));
      Transformer<float> init(cfg);
      init.init_weights(21);
      testing::perturb_weights(init.weights(), init.table(), 8);
      Transformer<float> ref(cfg);  // adapters of this shape with B nonzero
      ref.attach_lora(all_targets(), 5);
      const std::vector<float> noise = testing::random_normal<float>(ref.adapter_weights().size(), 77, 0.05);
      for (size_t i = 0; i < noise.size(); ++i) ref.adapter_weights()[i] += noise[i];
      CudaModelOptions o;
      o.dtype = dt;
      CudaTransformer gm(cfg, ctx(), o);
      gm.set_weights(init.weights());
      ASSERT_EQ(gm.grads_host().size(), init.weights().size());  // not frozen yet
      gm.attach_lora(all_targets(), 5);
      gm.backend().set_adapter_weights(ref.adapter_weights());
      EXPECT_TRUE(gm.grads_host().empty());
      EXPECT_EQ(gm.backend().adam_m_host().size(), ref.adapter_weights().size());
      const std::vector<float> base = gm.weights_host(), a0 = gm.backend().adapter_weights_host();
      EXPECT_TRUE(cuda::testing::same_bits(base, cuda::testing::round_to(dt, init.weights())));
      for (int s = 0; s < 3; ++s) {
        auto x = testing::random_ids(kB * kT, cfg.vocab_size, 50 + s),
             y = testing::random_ids(kB * kT, cfg.vocab_size, 60 + s);
        cuda::DeviceBuffer<int32_t> dx = upload(x), dy = upload(y);
        cuda::DeviceBuffer<float> dloss = upload(std::vector<float>{1.0f / (kB * kT)});
        gm.zero_grad();
        gm.forward(dx.data(), dy.data(), dloss.data(), kB, kT);
        gm.backward();
        AdamWParams p;
        p.lr = 1e-2f;
        p.weight_decay = 0.1f;
        p.step = s + 1;
        gm.backend().optimizer_step(p, 1.0f, 0);
        ctx().synchronize();
      }
      EXPECT_TRUE(cuda::testing::same_bits(gm.weights_host(), base));
      const std::vector<float> a1 = gm.backend().adapter_weights_host();
      EXPECT_FALSE(bit_identical(a1, a0));
      for (float v : a1) ASSERT_TRUE(std::isfinite(v));
      EXPECT_TRUE(gm.grads_host().empty());
    }
}

// The LoRA runner never allocates the base's gradients, Adam state or (bf16) f32 master: its
// peak device memory is below the full runner's on the same model by at least half of those
// 16 bytes per base parameter (the adapters and their activations take far less than the rest;
// bf16 size classes round by at most 512 bytes per buffer).
TEST_F(LoraCudaRunnerTest, FrozenBaseHoldsNoBaseGradientOrAdamMemory) {
  const Transformer<float> host = lora_model();
  const ModelConfig& cfg = host.config();
  auto full = make_cuda_runner(cfg, "bf16");
  full->set_weights(host.weights());
  run_steps(*full, cfg, 0, 1);
  auto lora = make_lora_cuda_runner(host, "bf16");
  lora->set_weights(host.adapter_weights());
  run_steps(*lora, cfg, 0, 1);
  const size_t P = host.weights().size();
  EXPECT_LT(lora->peak_device_bytes() + 8 * P, full->peak_device_bytes())
      << "lora " << lora->peak_device_bytes() << " full " << full->peak_device_bytes() << " P " << P;
}

// What a checkpoint holds (adapters, Adam's m and v) carried into a fresh runner: the next steps
// are bit-identical to the runner that kept going (bf16, CUDA graphs).
TEST_F(LoraCudaRunnerTest, AdaptersAndAdamStateCarryIntoAFreshRunner) {
  const Transformer<float> host = lora_model();
  const ModelConfig& cfg = host.config();
  auto a = make_lora_cuda_runner(host, "bf16");
  a->set_weights(host.adapter_weights());
  run_steps(*a, cfg, 0, 3);
  const std::vector<float> w = a->weights(), m = a->adam_m(), v = a->adam_v();
  auto b = make_lora_cuda_runner(host, "bf16");
  b->set_weights(w);
  b->set_adam_state(m, v);
  b->set_skipped_updates(0);
  const std::vector<StepReport> ra = run_steps(*a, cfg, 3, 5), rb = run_steps(*b, cfg, 3, 5);
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(rb[s].micro_losses, ra[s].micro_losses) << "step " << s;
    EXPECT_EQ(rb[s].grad_norm, ra[s].grad_norm) << "step " << s;
  }
  EXPECT_TRUE(cuda::testing::same_bits(b->weights(), a->weights()));
  EXPECT_TRUE(cuda::testing::same_bits(b->adam_m(), a->adam_m()));
  EXPECT_TRUE(cuda::testing::same_bits(b->adam_v(), a->adam_v()));
  // Wrong sizes are one-line errors.
  EXPECT_THROW(b->set_weights(std::vector<float>(3)), Error);
  EXPECT_THROW(b->set_adam_state(std::vector<float>(3), std::vector<float>(3)), Error);
}

// Data-parallel LoRA on the GPU (train/zero1_cuda.h over the adapter buffer): with a ONE-rank
// NCCL communicator and the ZeRO-1 path forced (CudaSettings::zero1_one_rank) the LoRA runner
// equals the plain one bit for bit — reports (losses, norm, skip), adapters, Adam's m and v, a
// poisoned step skipped alike, CUDA graphs on — in fp32, bf16 and fp16; and a fresh ZeRO-1 LoRA
// runner given the saved adapters and Adam state (a checkpoint's) continues as the plain one does.
TEST_F(LoraCudaRunnerTest, OneRankNcclEqualsThePlainLoraRunnerBitForBit) {
  if (!nccl_compiled()) GTEST_SKIP() << "built without NCCL";
  // Buckets: the default (one for this model) and one a layer (dist/buckets.h; the adapters of
  // layer 0 start at 0, so that bucket waits for step()).
  for (const size_t bucket : {CudaSettings{}.bucket_elems, size_t{1}})
  for (const char* precision : {"fp32", "bf16", "fp16"}) {
    SCOPED_TRACE(::testing::Message() << precision << ", bucket " << bucket);
    const Transformer<float> host = lora_model();
    const ModelConfig& cfg = host.config();
    LocalComm boot;
    auto nccl = make_nccl_comm(boot, 0, nullptr);
    CudaSettings dp;
    dp.zero1_one_rank = true;
    dp.bucket_elems = bucket;
    auto plain = make_lora_cuda_runner(host, precision);
    auto zero1 = make_lora_cuda_runner(host, precision, dp, nccl.get());
    EXPECT_NE(zero1->describe().find("zero-1 over nccl rank 0 of 1"), std::string::npos) << zero1->describe();
    EXPECT_NE(zero1->describe().find("lora r=4"), std::string::npos) << zero1->describe();
    plain->set_weights(host.adapter_weights());
    zero1->set_weights(host.adapter_weights());
    const std::vector<StepReport> ra = run_steps(*plain, cfg, 0, 5, /*poison=*/2),
                                  rb = run_steps(*zero1, cfg, 0, 5, /*poison=*/2);
    for (int s = 0; s < 5; ++s) {
      EXPECT_EQ(rb[s].micro_losses, ra[s].micro_losses) << "step " << s;
      EXPECT_EQ(rb[s].rank_micro_losses, ra[s].micro_losses) << "step " << s;
      EXPECT_EQ(rb[s].skipped, ra[s].skipped) << "step " << s;
      EXPECT_EQ(rb[s].loss_scale, ra[s].loss_scale) << "step " << s;
      if (std::isfinite(ra[s].grad_norm))
        EXPECT_EQ(rb[s].grad_norm, ra[s].grad_norm) << "step " << s;
      else
        EXPECT_FALSE(std::isfinite(rb[s].grad_norm)) << "step " << s;
    }
    EXPECT_TRUE(ra[2].skipped);  // the poisoned step
    const std::vector<float> wa = plain->weights(), wb = zero1->weights();
    const std::vector<float> mb = zero1->adam_m(), vb = zero1->adam_v();
    ASSERT_EQ(wb.size(), host.adapter_weights().size());
    EXPECT_TRUE(bit_identical(wa, wb));
    EXPECT_TRUE(bit_identical(plain->adam_m(), mb));
    EXPECT_TRUE(bit_identical(plain->adam_v(), vb));
    EXPECT_FALSE(bit_identical(wb, host.adapter_weights()));  // it trained

    if (std::string(precision) == "fp16") continue;  // the loss scale state is another test's
    auto resumed = make_lora_cuda_runner(host, precision, dp, nccl.get());
    resumed->set_weights(wb);
    resumed->set_adam_state(mb, vb);
    resumed->set_skipped_updates(1);
    const std::vector<StepReport> rc = run_steps(*plain, cfg, 5, 8), rd = run_steps(*resumed, cfg, 5, 8);
    for (int s = 0; s < 3; ++s) {
      EXPECT_EQ(rd[s].micro_losses, rc[s].micro_losses) << "step " << 5 + s;
      EXPECT_EQ(rd[s].grad_norm, rc[s].grad_norm) << "step " << 5 + s;
    }
    EXPECT_TRUE(bit_identical(resumed->weights(), plain->weights()));
    EXPECT_TRUE(bit_identical(resumed->adam_m(), plain->adam_m()));
  }
}

// forge train --init-from BASE --sft FILE --lora ... on --device cuda (fp32): the same losses as
// the CPU run and a PEFT adapter directory with the same configuration and close weights.
TEST_F(LoraCudaRunnerTest, TrainerSavesTheAdapterDirectoryAsTheCpuRunDoes) {
  const fs::path dir = fs::temp_directory_path() / ("forge_lora_cuda_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  ModelConfig m;
  m.family = Family::kLlama;
  m.n_layer = 2;
  m.n_embd = 64;
  m.n_head = 4;
  m.n_kv_head = 2;
  m.ffn_hidden = 128;
  m.tie_embeddings = true;
  const std::string base = sft_task::pretrained_model(dir, 2, m);
  {
    Rng rng(5, 0);
    std::ofstream f(dir / "rev.jsonl");
    for (int i = 0; i < 200; ++i) {
      const std::string w = sft_task::word(rng);
      f << sft_task::pair_line(w, sft_task::reversed(w));
    }
  }
  TrainConfig t = sft_task::sft_config(6, 5e-3);
  auto run = [&](const std::string& device, const std::string& name) {
    RunOptions o;
    o.sft = true;
    o.quiet = true;
    o.lora = parse_lora_spec("r=4,alpha=8,targets=q,k,v,o,gate,up,down");
    o.device = device;
    o.precision = "fp32";
    train_from(base, t, (dir / "rev.jsonl").string(), (dir / name).string(), o);
    return dir / name;
  };
  const fs::path cpu = run("cpu", "cpu"), gpu = run("cuda", "gpu");
  const auto mc = sft_task::metrics(cpu), mg = sft_task::metrics(gpu);
  ASSERT_EQ(mg.size(), mc.size());
  int losses = 0;
  for (size_t i = 0; i < mc.size(); ++i)
    if (mc[i].contains("loss")) {
      ++losses;
      const double lc = mc[i]["loss"].get<double>();
      EXPECT_NEAR(mg[i]["loss"].get<double>(), lc, 1e-4 * lc) << "line " << i;
    }
  EXPECT_GE(losses, 6);
  const Transformer<float> b = load_model_dir(base);
  const LoadedAdapter ac = load_adapter_dir((cpu / "model").string(), b.config()),
                      ag = load_adapter_dir((gpu / "model").string(), b.config());
  EXPECT_EQ(nlohmann::json::parse(std::ifstream(gpu / "model" / "adapter_config.json")),
            nlohmann::json::parse(std::ifstream(cpu / "model" / "adapter_config.json")));
  ASSERT_EQ(ag.weights.size(), ac.weights.size());
  Transformer<float> fresh(b.config());
  fresh.attach_lora(ac.lora, t.seed);  // the run's initial adapters (A from the seed, B = 0)
  const double moved = norm_diff(ac.weights, fresh.adapter_weights());
  EXPECT_GT(moved, 0.0);
  EXPECT_LT(norm_diff(ag.weights, ac.weights), 5e-3 * moved);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace forge
