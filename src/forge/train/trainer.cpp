#include "forge/train/trainer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "forge/core/error.h"
#include "forge/core/timer.h"
#include "forge/model/model_dir.h"
#include "forge/model/transformer.h"
#include "forge/ops/adamw.h"
#include "forge/ops/grad_norm.h"
#include "forge/train/plot.h"
#include "forge/train/schedule.h"

namespace forge {

namespace fs = std::filesystem;

namespace {

int parse_int(const std::string& k, const std::string& v) {
  try {
    size_t pos = 0;
    const long x = std::stol(v, &pos);
    if (pos == v.size()) return static_cast<int>(x);
  } catch (...) {
  }
  throw Error(str("override ", k, "=", v, ": expected an integer"));
}

double parse_double(const std::string& k, const std::string& v) {
  try {
    size_t pos = 0;
    const double x = std::stod(v, &pos);
    if (pos == v.size()) return x;
  } catch (...) {
  }
  throw Error(str("override ", k, "=", v, ": expected a number"));
}

std::string format_duration(double s) {
  char buf[32];
  const long t = static_cast<long>(std::max(0.0, s) + 0.5);
  if (t >= 3600) std::snprintf(buf, sizeof(buf), "%ldh%02ldm", t / 3600, t / 60 % 60);
  else if (t >= 60) std::snprintf(buf, sizeof(buf), "%ldm%02lds", t / 60, t % 60);
  else std::snprintf(buf, sizeof(buf), "%lds", t);
  return buf;
}

nlohmann::json train_config_json(const TrainConfig& c) {
  return {{"steps", c.steps}, {"batch_size", c.batch_size}, {"seq_len", c.seq_len},
          {"grad_accum", c.grad_accum}, {"lr", c.lr}, {"min_lr_frac", c.min_lr_frac},
          {"warmup_steps", c.warmup_steps}, {"weight_decay", c.weight_decay},
          {"beta1", c.beta1}, {"beta2", c.beta2}, {"eps", c.eps}, {"grad_clip", c.grad_clip},
          {"eval_every", c.eval_every}, {"eval_windows", c.eval_windows}, {"seed", c.seed}};
}

// Mean loss over the first `windows` validation windows (the same ones at every evaluation).
double evaluate(Transformer<float>& model, const EvalWindows& val, int B, int T_, int windows) {
  const int64_t n = std::min<int64_t>(windows, val.count());
  std::vector<int32_t> x(static_cast<size_t>(B) * T_), y(static_cast<size_t>(B) * T_);
  double sum = 0;
  int64_t done = 0;
  while (done < n) {
    const int b = static_cast<int>(std::min<int64_t>(B, n - done));
    for (int i = 0; i < b; ++i) val.window(done + i, x.data() + static_cast<size_t>(i) * T_, y.data() + static_cast<size_t>(i) * T_);
    sum += model.forward(x.data(), y.data(), b, T_) * b;
    done += b;
  }
  return sum / static_cast<double>(n);
}

}  // namespace

bool TrainConfig::apply_override(const std::string& k, const std::string& v) {
  if (k == "steps") steps = parse_int(k, v);
  else if (k == "batch_size") batch_size = parse_int(k, v);
  else if (k == "seq_len") seq_len = parse_int(k, v);
  else if (k == "grad_accum") grad_accum = parse_int(k, v);
  else if (k == "lr") lr = parse_double(k, v);
  else if (k == "min_lr_frac") min_lr_frac = parse_double(k, v);
  else if (k == "warmup_steps") warmup_steps = parse_int(k, v);
  else if (k == "weight_decay") weight_decay = parse_double(k, v);
  else if (k == "beta1") beta1 = parse_double(k, v);
  else if (k == "beta2") beta2 = parse_double(k, v);
  else if (k == "eps") eps = parse_double(k, v);
  else if (k == "grad_clip") grad_clip = parse_double(k, v);
  else if (k == "eval_every") eval_every = parse_int(k, v);
  else if (k == "eval_windows") eval_windows = parse_int(k, v);
  else if (k == "seed") seed = static_cast<uint64_t>(parse_double(k, v));
  else return false;
  return true;
}

TrainResult train(const ModelConfig& mcfg, const TrainConfig& cfg, const std::string& data,
                  const std::string& out) {
  mcfg.validate();
  if (cfg.steps <= 0) throw Error(str("steps must be positive, got ", cfg.steps));
  if (cfg.batch_size <= 0) throw Error(str("batch_size must be positive, got ", cfg.batch_size));
  if (cfg.grad_accum <= 0) throw Error(str("grad_accum must be positive, got ", cfg.grad_accum));
  if (cfg.eval_every <= 0) throw Error(str("eval_every must be positive, got ", cfg.eval_every));
  const int T_ = cfg.seq_len > 0 ? cfg.seq_len : mcfg.max_seq_len;
  if (T_ > mcfg.max_seq_len)
    throw Error(str("seq_len ", T_, " exceeds the model's max_seq_len ", mcfg.max_seq_len));
  const int B = cfg.batch_size;
  if (fs::exists(out + "/metrics.jsonl"))
    throw Error(str(out, ": already holds a run (metrics.jsonl); choose another --out"));

  Dataset ds = Dataset::open(data, mcfg.vocab_size);
  TrainLoader loader(&ds.shards, ds.train, T_, cfg.seed);
  EvalWindows val(&ds.shards, ds.val, T_);

  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec) throw Error(str(out, ": cannot create run directory: ", ec.message()));
  {
    nlohmann::json j = {{"model", to_hf_config(mcfg)}, {"train", train_config_json(cfg)}, {"data", data}};
    std::ofstream(out + "/config.json") << j.dump(2) << "\n";
  }
  std::ofstream metrics(out + "/metrics.jsonl");
  if (!metrics) throw Error(str(out, "/metrics.jsonl: cannot write"));

  Transformer<float> model(mcfg);
  model.init_weights(cfg.seed);
  const int64_t P = model.num_params();
  std::vector<float> m(P, 0.0f), v(P, 0.0f);
  LrSchedule sched{cfg.lr, cfg.warmup_steps >= 0 ? cfg.warmup_steps : std::max(1, cfg.steps / 20), cfg.steps, cfg.min_lr_frac};
  std::printf("model %s: %.2fM parameters (L=%d C=%d NH=%d V=%d) | data %.2fM train / %.2fM val tokens\n",
              mcfg.family_name().c_str(), P / 1e6, mcfg.n_layer, mcfg.n_embd, mcfg.n_head,
              mcfg.vocab_size, ds.train_tokens() / 1e6, ds.val_tokens() / 1e6);
  std::printf("batch %d x %d tokens x %d accum = %d tokens/step, %d steps, lr %.2e, run dir %s\n",
              B, T_, cfg.grad_accum, B * T_ * cfg.grad_accum, cfg.steps, cfg.lr, out.c_str());
  std::fflush(stdout);

  std::vector<int32_t> x(static_cast<size_t>(B) * T_), y(static_cast<size_t>(B) * T_);
  Curve train_curve, val_curve;
  TrainResult result;
  Timer total;
  double step_time_avg = 0;
  auto run_eval = [&](int step) -> double {
    if (val.count() == 0) return NAN;
    const double l = evaluate(model, val, B, T_, cfg.eval_windows);
    val_curve.push_back({static_cast<double>(step), l});
    write_loss_svg(out + "/loss.svg", train_curve, val_curve, "forge: " + mcfg.family_name() + " loss");
    return l;
  };

  for (int step = 0; step < cfg.steps; ++step) {
    double val_loss = NAN;
    if (step % cfg.eval_every == 0) {
      val_loss = run_eval(step);
      if (step == 0) result.first_val_loss = val_loss;
    }
    Timer t;
    model.zero_grad();
    double loss = 0;
    for (int micro = 0; micro < cfg.grad_accum; ++micro) {
      loader.next_batch(B, x.data(), y.data());
      loss += model.forward(x.data(), y.data(), B, T_) / cfg.grad_accum;
      model.backward(1.0 / cfg.grad_accum);
    }
    if (!std::isfinite(loss)) throw Error(str("loss became ", loss, " at step ", step, "; try a lower lr"));
    const double norm = cpu::global_norm(model.grads().data(), P);
    const double lr = sched.at(step);
    cpu::AdamWParams ap;
    ap.lr = static_cast<float>(lr);
    ap.beta1 = static_cast<float>(cfg.beta1);
    ap.beta2 = static_cast<float>(cfg.beta2);
    ap.eps = static_cast<float>(cfg.eps);
    ap.step = step + 1;
    ap.grad_scale = static_cast<float>(cpu::clip_scale(norm, cfg.grad_clip));
    for (const auto& p : model.table().params()) {
      ap.weight_decay = p.decay ? static_cast<float>(cfg.weight_decay) : 0.0f;
      cpu::adamw_update(model.weights().data() + p.offset, m.data() + p.offset, v.data() + p.offset,
                        model.grads().data() + p.offset, p.numel(), ap);
    }
    const double dt = t.seconds();
    step_time_avg = step == 0 ? dt : 0.9 * step_time_avg + 0.1 * dt;
    const double tps = static_cast<double>(B) * T_ * cfg.grad_accum / dt;
    train_curve.push_back({static_cast<double>(step), loss});
    result.last_train_loss = loss;

    nlohmann::json rec = {{"step", step}, {"loss", loss}, {"lr", lr}, {"grad_norm", norm}, {"tokens_per_s", tps}};
    if (std::isfinite(val_loss)) rec["val_loss"] = val_loss;
    metrics << rec.dump() << "\n" << std::flush;
    if (!cfg.quiet) {
      std::printf("step %*d/%d | loss %.4f | lr %.2e | norm %.3f | %.0f tok/s | ETA %s%s\n",
                  static_cast<int>(std::to_string(cfg.steps).size()), step + 1, cfg.steps, loss, lr,
                  norm, tps, format_duration(step_time_avg * (cfg.steps - step - 1)).c_str(),
                  std::isfinite(val_loss) ? str(" | val ", val_loss).c_str() : "");
      std::fflush(stdout);
    }
  }
  // Final evaluation, after the last update.
  const double final_val = run_eval(cfg.steps);
  result.last_val_loss = final_val;
  if (std::isfinite(final_val)) {
    metrics << nlohmann::json{{"step", cfg.steps}, {"val_loss", final_val}}.dump() << "\n" << std::flush;
  } else {
    write_loss_svg(out + "/loss.svg", train_curve, val_curve, "forge: " + mcfg.family_name() + " loss");
  }
  save_model_dir(out + "/model", model);
  result.seconds = total.seconds();
  std::printf("done in %s: train loss %.4f", format_duration(result.seconds).c_str(), result.last_train_loss);
  if (std::isfinite(final_val)) std::printf(", val loss %.4f (from %.4f at step 0)", final_val, result.first_val_loss);
  std::printf("\nmodel saved to %s/model, metrics in %s/metrics.jsonl, plot %s/loss.svg\n", out.c_str(), out.c_str(), out.c_str());
  std::fflush(stdout);
  return result;
}

}  // namespace forge
