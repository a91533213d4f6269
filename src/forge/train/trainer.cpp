#include "forge/train/trainer.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <system_error>

#include "forge/core/dtype.h"
#include "forge/core/error.h"
#include "forge/core/timer.h"
#include "forge/generate/generation_config.h"
#include "forge/io/atomic_file.h"
#include "forge/io/model_files.h"
#include "forge/model/lora_dir.h"
#include "forge/model/model_dir.h"
#include "forge/model/transformer.h"
#include "forge/ops/adamw.h"
#include "forge/ops/grad_norm.h"
#include "forge/train/batch_source.h"
#include "forge/train/checkpoint.h"
#include "forge/train/loss_outliers.h"
#include "forge/train/plot.h"
#include "forge/train/runner.h"
#include "forge/train/schedule.h"

namespace forge {

namespace fs = std::filesystem;

namespace {

std::string format_duration(double s) {
  char buf[32];
  const long t = static_cast<long>(std::max(0.0, s) + 0.5);
  if (t >= 3600)
    std::snprintf(buf, sizeof(buf), "%ldh%02ldm", t / 3600, t / 60 % 60);
  else if (t >= 60)
    std::snprintf(buf, sizeof(buf), "%ldm%02lds", t / 60, t % 60);
  else
    std::snprintf(buf, sizeof(buf), "%lds", t);
  return buf;
}

// Mean loss over the trained targets of the first `items` validation items (windows or SFT
// examples: the same ones at every evaluation), in batches of up to B.
double evaluate(StepRunner& model, const BatchSource& data, int B, int T_, int items) {
  const int64_t n = std::min<int64_t>(items, data.val_count());
  std::vector<int32_t> x(static_cast<size_t>(B) * T_), y(static_cast<size_t>(B) * T_);
  double sum = 0;
  int64_t done = 0, targets = 0;
  while (done < n) {
    const int b = static_cast<int>(std::min<int64_t>(B, n - done));
    int64_t count = 0;
    for (int i = 0; i < b; ++i)
      count += data.val_item(done + i, x.data() + static_cast<size_t>(i) * T_,
                             y.data() + static_cast<size_t>(i) * T_);
    // eval_loss is the batch's mean over its trained targets: weighted by their number.
    if (count > 0) sum += model.eval_loss(x.data(), y.data(), b, T_) * static_cast<double>(count);
    targets += count;
    done += b;
  }
  return targets > 0 ? sum / static_cast<double>(targets) : NAN;
}

}  // namespace

namespace {

// Where the loop starts: fresh, from a model directory, or from a checkpoint.
struct RunStart {
  int step = 0;                  // first step to run
  uint64_t loader_offset = 0;    // TrainLoader position
  std::vector<float> m, v;       // Adam moments; empty: zeros
  bool resumed = false;          // continue metrics.jsonl instead of starting it
  std::string init_from;         // recorded in the run configuration
  Curve train_curve, val_curve;  // what metrics.jsonl already holds
  double first_val_loss = NAN;
  std::optional<LossScaleState> loss_scale;  // f16: the checkpoint's loss-scale state
  int skipped_steps = 0;                     // updates the numerical guard skipped before `step`
  std::string device_hint;  // appended to a failure to make the runner (resume: whose device)
  // resume(): the tokenizer files the run carries, as its configuration records them (unset:
  // a run from before the record, which carries those of io::kTokenizerFiles in RUNDIR).
  std::optional<std::vector<std::string>> tokenizer_files;
};

std::string default_precision(const std::string& device) {
  return device == "cuda" ? "bf16" : "fp32";
}

// Every way in checks here, resume() included (its device may come from a run configuration).
void check_device(const std::string& device, const std::string& precision) {
  parse_device(device);        // throws for an unknown device
  parse_precision(precision);  // and for an unknown precision
  if (device == "cpu" && precision != "fp32")
    throw Error(str("--precision ", precision, " needs --device cuda; the CPU trains in fp32"));
}

void cut_metrics(const std::string& path, int step, RunStart& start);

// Where a new run's tokenizer files come from (trainer.h): an --init-from model with a
// tokenizer.json, else the run directory when something put one there before the run (forge
// quickstart does), else the --data directory (forge data prepare writes them), else the init
// model's companions without a tokenizer.json, if any. "" when there is no source.
std::string tokenizer_source(const std::string& out, const std::string& data,
                             const std::string& init_from) {
  auto has_tokenizer = [](const std::string& dir) {
    std::error_code ec;
    return !dir.empty() && fs::is_regular_file(dir + "/tokenizer.json", ec);
  };
  std::error_code ec;
  const std::string data_dir = fs::is_directory(data, ec) ? data : "";
  if (has_tokenizer(init_from)) return init_from;
  if (has_tokenizer(out)) return out;
  if (has_tokenizer(data_dir)) return data_dir;
  return init_from;
}

// The generation_config.json (its text) of every model the run saves: an --init-from model's
// own file as it is, or else one made from what it says elsewhere (config.json's token ids, its
// tokenizer); for other runs the one in the run directory (written when the run began, so a
// resumed run saves the same), or else one naming the end-of-text token of the run's tokenizer
// (`source`, tokenizer_source's directory; tokenizer_config.json's eos_token when it has one).
// "" when nothing names one (no tokenizer): then no file is written. A file that is there is
// checked, so a broken one stops the run before it starts.
std::string run_generation_config(const std::string& out, const RunStart& start,
                                  const std::string& source) {
  auto checked = [](const std::string& path) {
    read_generation_config(path);
    return io::read_file(path);
  };
  auto text_of = [](const GenerationConfig& g) {
    return g == GenerationConfig{} ? std::string() : generation_config_json(g);
  };
  if (!start.resumed && !start.init_from.empty()) {
    const std::string src = start.init_from + "/generation_config.json";
    if (fs::exists(src)) return checked(src);
    const std::string g = text_of(load_generation_config(start.init_from));
    if (!g.empty() || source == start.init_from) return g;
  }
  if (fs::exists(out + "/generation_config.json")) return checked(out + "/generation_config.json");
  if (source.empty() || !fs::exists(source + "/tokenizer.json")) return "";
  const std::string tc = source + "/tokenizer_config.json";
  return text_of(
      generation_config_for_tokenizer(source + "/tokenizer.json", fs::exists(tc) ? tc : ""));
}

// The files every model the run saves carries beside its weights (io/model_files.h): the
// tokenizer's files from one source and generation_config.json. Read before the run directory
// changes, so a missing or broken one stops the run before it starts.
io::FileSet run_model_files(const std::string& out, const std::string& data,
                            const RunStart& start) {
  io::FileSet files;
  std::string source = out;
  if (start.resumed) {
    std::vector<const char*> names;  // only known names: the record is not trusted with paths
    for (const char* name : io::kTokenizerFiles)
      if (!start.tokenizer_files ||
          std::find(start.tokenizer_files->begin(), start.tokenizer_files->end(), name) !=
              start.tokenizer_files->end())
        names.push_back(name);
    files = io::read_files(out, names);
  } else {
    source = tokenizer_source(out, data, start.init_from);
    if (!source.empty()) files = io::read_files(source, io::kTokenizerFiles);
    std::error_code ec;
    const std::string data_tokenizer = data + "/tokenizer.json";
    if (source != data && fs::is_directory(data, ec) && files.count("tokenizer.json") &&
        fs::is_regular_file(data_tokenizer, ec) &&
        io::read_file(data_tokenizer) != files["tokenizer.json"])
      std::printf(
          "note: the run's tokenizer is %s/tokenizer.json; %s differs (were the shards "
          "made with another tokenizer?)\n",
          source.c_str(), data_tokenizer.c_str());
  }
  const std::string generation_config = run_generation_config(out, start, source);
  if (!generation_config.empty()) files[io::kGenerationConfigFile] = generation_config;
  return files;
}

TrainResult run(Transformer<float>& model, TrainConfig cfg, const std::string& data,
                const std::string& out, RunStart start, const RunOptions& opt) {
  const ModelConfig& mcfg = model.config();
  if (cfg.epochs > 0 && !opt.sft)
    throw Error("epochs counts passes over SFT examples; a pretraining run (--data) sets steps");
  // epochs > 0 sets steps once the data is read (below).
  if (cfg.steps <= 0 && cfg.epochs <= 0)
    throw Error(str("steps must be positive, got ", cfg.steps));
  if (cfg.batch_size <= 0) throw Error(str("batch_size must be positive, got ", cfg.batch_size));
  if (cfg.grad_accum <= 0) throw Error(str("grad_accum must be positive, got ", cfg.grad_accum));
  if (cfg.eval_every <= 0) throw Error(str("eval_every must be positive, got ", cfg.eval_every));
  if (cfg.save_every < 0) throw Error(str("save_every must be >= 0, got ", cfg.save_every));
  const int T_ = cfg.seq_len > 0 ? cfg.seq_len : mcfg.max_seq_len;
  if (T_ > mcfg.max_seq_len)
    throw Error(str("seq_len ", T_, " exceeds the model's max_seq_len ", mcfg.max_seq_len));
  const int B = cfg.batch_size;
  const std::string device = opt.device.empty() ? "cpu" : opt.device;
  const std::string precision = opt.precision.empty() ? default_precision(device) : opt.precision;
  const bool pack = cfg.sft_layout == "pack";
  if (pack && !opt.sft) throw Error("--pack (sft_layout=pack) packs SFT examples: it needs --sft");
  check_device(device, precision);
  // Data parallel (trainer.h): this rank trains rows [rank·rows, (rank+1)·rows) of every
  // micro-batch; rank 0 alone writes the run directory and prints.
  Communicator* comm = opt.comm != nullptr && opt.comm->size() > 1 ? opt.comm : nullptr;
  const int world = comm ? comm->size() : 1, rank = comm ? comm->rank() : 0;
  const bool primary = rank == 0;
  if (B % world != 0)
    throw Error(str("batch_size ", B, " does not split over ", world,
                    " ranks: each rank trains batch_size / ranks rows of every micro-batch; "
                    "choose a multiple of ",
                    world));
  if (comm && device == "cuda" && !opt.device_comm)
    throw Error(str("--device cuda with ", world,
                    " ranks needs an NCCL communicator (RunOptions::device_comm)"));
  const int rows = B / world;
  if (!start.resumed && fs::exists(out + "/metrics.jsonl"))
    throw Error(
        str(out, ": already holds a run (metrics.jsonl); choose another --out or --resume it"));

  // SFT examples are encoded with the tokenizer the run carries (trainer.h): a resumed run's
  // copies in its directory, else the --init-from model's (or the run directory's).
  std::unique_ptr<BatchSource> source;
  if (opt.sft) {
    const std::string tokenizer_dir = start.resumed ? out : tokenizer_source(out, "", start.init_from);
    source = open_sft_source(data, tokenizer_dir, mcfg.vocab_size,
                             {T_, cfg.sft_val_frac, cfg.sft_overlong == "truncate", cfg.seed,
                              pack});
  } else {
    source = open_shard_source(data, mcfg.vocab_size, T_, cfg.seed);
  }
  if (cfg.epochs > 0 && !start.resumed) {
    const int64_t per_step = static_cast<int64_t>(B) * cfg.grad_accum;
    const int64_t steps = source->steps_for_epochs(cfg.epochs, per_step);
    if (steps > std::numeric_limits<int>::max())
      throw Error(str("epochs=", cfg.epochs, " makes ", steps, " steps, more than a run can take"));
    cfg.steps = static_cast<int>(steps);
    std::printf("epochs %d: %d steps of %lld %s over %lld train examples\n", cfg.epochs,
                cfg.steps, static_cast<long long>(per_step), source->packed() ? "packed rows" : "examples",
                static_cast<long long>(source->epoch_size()));
  }
  // LoRA: adapters on the frozen base (a resumed run's checkpoint has them already).
  if (opt.lora && !model.adapter_table()) {
    if (start.init_from.empty()) throw Error("--lora needs --init-from MODEL_DIR (the base model the adapters train on)");
    model.attach_lora(*opt.lora, cfg.seed);
  }
  const AdapterTable* lora = model.adapter_table();
  // The steps run on a StepRunner (CPU or GPU); `model` stays the host copy that checkpoints
  // and the final export read, refreshed from the runner when they need it. Made before anything
  // in the run directory changes, so an unavailable device leaves the run as it was.
  std::unique_ptr<StepRunner> runner;
  try {
    Communicator* device_comm = comm && device == "cuda" ? opt.device_comm() : nullptr;
    CudaSettings cuda = opt.cuda;
    cuda.bucket_elems = bucket_elems_of_bytes(cfg.dp_bucket);
    if (lora)
      runner = device == "cuda" ? make_lora_cuda_runner(model, precision, cuda, device_comm)
                                : make_lora_cpu_runner(model, comm, cuda.bucket_elems);
    else
      runner = device == "cuda" ? make_cuda_runner(mcfg, precision, cuda, device_comm)
                                : make_cpu_runner(mcfg, comm, cuda.bucket_elems);
  } catch (const Error& e) {
    if (start.device_hint.empty()) throw;
    throw Error(str(e.what(), "; ", start.device_hint));
  }
  runner->set_recompute(parse_recompute(cfg.recompute));
  if (cfg.save_shard_size < 1)
    throw Error(str("save_shard_size must be >= 1 byte, got ", cfg.save_shard_size));
  const ModelSaveOptions final_save{save_dtype_from_name(cfg.save_dtype), cfg.save_shard_size,
                                    run_model_files(out, data, start)};
  const io::FileSet& model_files = final_save.files;
  // Every rank has read what it needs from the run directory (and checked that a new run's is
  // free) before rank 0 changes anything in it.
  if (comm) comm->barrier();
  if (start.resumed && primary) cut_metrics(out + "/metrics.jsonl", start.step, start);
  source->set_position(start.loader_offset);

  std::error_code ec;
  if (primary) fs::create_directories(out, ec);
  if (ec) throw Error(str(out, ": cannot create run directory: ", ec.message()));
  nlohmann::json run_config = {{"model", to_hf_config(mcfg)},
                               {"train", train_config_json(cfg)},
                               {"data", data},
                               {"sft", opt.sft},
                               {"device", device},
                               {"precision", precision}};
  if (!start.init_from.empty()) run_config["init_from"] = start.init_from;
  if (lora) {
    nlohmann::json targets = nlohmann::json::array();
    for (LoraTarget t : lora->lora().targets) targets.push_back(lora_target_short_name(t));
    run_config["lora"] = {{"r", lora->lora().r},
                          {"alpha", lora->lora().alpha},
                          {"targets", targets},
                          {"base_sha256", weights_sha256(model.weights())}};
  }
  nlohmann::json tokenizer_files = nlohmann::json::array();
  for (const auto& [name, bytes] : model_files)
    if (name != io::kGenerationConfigFile) tokenizer_files.push_back(name);
  run_config["tokenizer_files"] = tokenizer_files;
  std::ofstream metrics;
  if (primary) {
    io::write_file_atomic(out + "/config.json", run_config.dump(2) + "\n");
    // The run directory's copies: what a resumed run reads, whatever became of the sources.
    io::write_files(out, model_files);
    metrics.open(out + "/metrics.jsonl", start.resumed ? std::ios::app : std::ios::trunc);
    if (!metrics) throw Error(str(out, "/metrics.jsonl: cannot write"));
  }

  const int64_t P = lora ? lora->total() : model.num_params();  // what the optimizer updates
  // Empty moments (a fresh run) are zeros: the runner zeroes its own (runner.h) rather than
  // being handed P zeros twice (at 135M parameters that was 1.1 GB, the run's peak).
  std::vector<float> m = std::move(start.m), v = std::move(start.v);
  FORGE_CHECK((m.empty() && v.empty()) ||
                  (static_cast<int64_t>(m.size()) == P && static_cast<int64_t>(v.size()) == P),
              "optimizer state size mismatch");
  runner->set_weights(lora ? model.adapter_weights() : model.weights());
  runner->set_adam_state(m, v);
  // From here the runner holds the moments; they are read back only to write a checkpoint.
  std::vector<float>().swap(m);
  std::vector<float>().swap(v);
  runner->set_skipped_updates(start.skipped_steps);
  if (start.loss_scale) {
    if (runner->loss_scale_state())
      runner->set_loss_scale_state(*start.loss_scale);
    else
      std::printf("the checkpoint's f16 loss scale is not used: %s needs none\n",
                  precision.c_str());
  }
  auto sync_host = [&] { (lora ? model.adapter_weights() : model.weights()) = runner->weights(); };
  LrSchedule sched{cfg.lr, cfg.warmup_steps >= 0 ? cfg.warmup_steps : std::max(1, cfg.steps / 20),
                   cfg.steps, cfg.min_lr_frac};
  const bool quiet = cfg.quiet || opt.quiet || !primary;
  if (primary) {
    std::printf("model %s: %.2fM parameters (L=%d C=%d NH=%d V=%d) | %s\n",
                mcfg.family_name().c_str(), model.num_params() / 1e6, mcfg.n_layer, mcfg.n_embd,
                mcfg.n_head, mcfg.vocab_size, source->describe().c_str());
    std::printf("batch %d x %d tokens x %d accum = %d tokens/step, %d steps, lr %.2e, run dir %s\n",
                B, T_, cfg.grad_accum, B * T_ * cfg.grad_accum, cfg.steps, cfg.lr, out.c_str());
    std::printf("device %s\n", runner->describe().c_str());
    if (comm)
      std::printf(
          "data parallel over %d ranks: each trains %d of the %d rows of every micro-batch\n",
          world, rows, B);
    std::fflush(stdout);
  }

  // A step's micro-batches are read before any runs: each one's share of the step's loss is
  // its trained targets over the step's, so that the loss is the mean over every trained token
  // of the step, whatever the micro-batch it fell in (SFT rows have different numbers; token
  // windows all have T, and the shares are then exactly 1 / grad_accum).
  const size_t batch_elems = static_cast<size_t>(B) * T_;
  std::vector<int32_t> x(batch_elems * cfg.grad_accum), y(batch_elems * cfg.grad_accum);
  // Packed rows: each token's position and segment id (data/sft_data.h).
  const bool packed = source->packed();
  std::vector<int32_t> pos(packed ? x.size() : 0), seg(packed ? x.size() : 0);
  const uint64_t first_position = source->position();  // for the SFT throughput line
  double step_seconds = 0;                               // the steps' time, evaluations excluded
  std::vector<int64_t> micro_targets(cfg.grad_accum);
  Curve train_curve = std::move(start.train_curve), val_curve = std::move(start.val_curve);
  TrainResult result;
  result.first_val_loss = start.first_val_loss;
  result.steps_done = start.step;
  Timer total;
  double step_time_avg = 0;
  auto run_eval = [&](int step) -> double {
    if (source->val_count() == 0 || !primary) return NAN;  // rank 0 validates (trainer.h)
    const double l = evaluate(*runner, *source, B, T_, cfg.eval_windows);
    val_curve.push_back({static_cast<double>(step), l});
    write_loss_svg(out + "/loss.svg", train_curve, val_curve,
                   "forge: " + mcfg.family_name() + " loss");
    return l;
  };
  // Numerical guards (trainer.h): counts kept by report().
  int guard_skips = start.skipped_steps;  // updates the guard skipped (Adam's t lags by these)
  int skipped_total =                     // every skipped update, f16 overflows included
      start.skipped_steps + (start.loss_scale ? start.loss_scale->skipped_total : 0);
  int bad_run = 0;  // bad steps in a row, the latest reported last
  LossOutlierDetector outliers;
  for (const auto& point : train_curve) outliers.score(point.second);  // a resumed run's window

  // What a failed save says: the error (which names the file and the OS's reason) and what is
  // left to continue from.
  auto last_checkpoint = [&] {
    const auto all = list_checkpoints(out);
    return all.empty() ? std::string("no checkpoint was written before")
                       : str("the last checkpoint, ", all.back().second, ", is intact");
  };
  int last_saved = -1;
  auto checkpoint = [&](int done) {
    TrainerState st{done, cfg.seed, source->position(), run_config};
    st.loss_scale = runner->loss_scale_state();  // after flush(): the state after step `done`
    st.skipped_steps = guard_skips;
    sync_host();
    const std::vector<float> m_now = runner->adam_m(), v_now = runner->adam_v();  // collective: every rank's shard
    if (!primary) {
      last_saved = done;  // as on rank 0: a stop after this step saves nothing more
      return;
    }
    std::string path;
    try {
      path = save_checkpoint(out, model, m_now, v_now, st, cfg.keep_checkpoints, model_files,
                             cfg.save_shard_size);
    } catch (const Error& e) {
      throw Error(
          str("checkpoint of step ", done, " not saved (", last_checkpoint(), "): ", e.what()));
    }
    last_saved = done;
    if (!quiet) std::printf("checkpoint %s\n", path.c_str());
  };
  // Every metrics line is flushed as written (a killed run keeps its lines); a line that cannot
  // be written (a full disk) stops the run, naming the file and the OS's reason.
  const std::string metrics_path = out + "/metrics.jsonl";
  auto write_metrics = [&](const nlohmann::json& rec) {
    if (!primary) return;
    errno = 0;
    metrics << rec.dump() << "\n" << std::flush;
    if (!metrics)
      throw Error(str(metrics_path, ": cannot write: ",
                      errno != 0 ? std::generic_category().message(errno) : "I/O error"));
  };

  // A step's metrics line is written when the runner reports it: at once on the CPU, one step
  // late on the GPU (the line for step s after step s + 1 is queued), and always before an
  // evaluation, a checkpoint or the end of the loop (flush), which must see every line.
  struct Pending {
    int step;
    double lr, val_loss;
    double begin;                 // total.seconds() when the step started
    std::vector<double> weights;  // each micro-batch's share of the step's loss
    int64_t targets;              // trained targets of the step
  };
  std::deque<Pending> pending;
  double last_reported = 0;  // total.seconds() when the previous step's report arrived
  auto report = [&] {
    const Pending ps = pending.front();
    pending.pop_front();
    const StepReport r = runner->take_report();
    const double now = total.seconds();
    double loss = 0;
    if (comm) {  // this rank's slices, weighted by their share of the global step; summed
      double mine = 0;
      for (size_t i = 0; i < r.rank_micro_losses.size(); ++i)
        mine += r.rank_micro_losses[i] * ps.weights[i];
      loss = allgather_sum_in_rank_order(*comm, {mine})[0];
    } else {
      for (size_t i = 0; i < r.micro_losses.size(); ++i) loss += r.micro_losses[i] * ps.weights[i];
    }
    const double norm = r.grad_norm;
    // The guards (trainer.h). The runner already left the step's update out.
    const bool bad = r.skipped && !(r.overflow && r.loss_scale > 1);
    skipped_total += r.skipped;
    guard_skips += r.skipped && !r.overflow;
    if (bad)
      ++bad_run;
    else if (!r.skipped)
      bad_run = 0;
    const double z = outliers.score(loss);
    const bool spike = cfg.loss_spike_z > 0 && z > cfg.loss_spike_z;
    // The step's time: from its start, or from the previous step's end when the GPU was still
    // busy with that one (steps queued back to back).
    const double dt = now - std::max(ps.begin, last_reported);
    last_reported = now;
    step_time_avg = ps.step == start.step ? dt : 0.9 * step_time_avg + 0.1 * dt;
    step_seconds += dt;
    const double tps = static_cast<double>(B) * T_ * cfg.grad_accum / dt;
    if (std::isfinite(loss)) {
      train_curve.push_back({static_cast<double>(ps.step), loss});
      result.last_train_loss = loss;
    }
    result.steps_done = ps.step + 1;

    nlohmann::json rec = {{"step", ps.step},
                          {"loss", loss},
                          {"lr", ps.lr},
                          {"grad_norm", norm},
                          {"tokens_per_s", tps}};
    if (std::isfinite(ps.val_loss)) rec["val_loss"] = ps.val_loss;
    if (opt.sft) rec["trained_tokens"] = ps.targets;  // of tokens_per_s's B · T · grad_accum
    if (r.loss_scale > 0) rec["loss_scale"] = r.loss_scale;  // f16 only
    // Only when there is something to say, so a clean run's lines keep the fields above.
    if (r.skipped) rec["skipped"] = true;  // loss or grad_norm is then null (inf/NaN)
    if (skipped_total > 0) rec["skipped_steps"] = skipped_total;
    if (std::isfinite(z)) rec["loss_z"] = z;
    if (spike) rec["loss_spike"] = true;
    write_metrics(rec);
    if (r.skipped && !r.overflow && primary)
      std::fprintf(stderr,
                   "warning: step %d skipped: %s not finite (loss %g, grad norm %g); %d bad "
                   "step(s) in a row, max_bad_steps=%d\n",
                   ps.step + 1, std::isfinite(loss) ? "the gradient norm is" : "the loss is", loss,
                   norm, bad_run, cfg.max_bad_steps);
    if (spike && primary)
      std::fprintf(stderr,
                   "warning: step %d: loss spike, %.4f is %.1f standard deviations above "
                   "the last %zu steps' mean\n",
                   ps.step + 1, loss, z, LossOutlierDetector::kWindow);
    if (!quiet) {
      std::printf("step %*d/%d | loss %.4f | lr %.2e | norm %.3f | %.0f tok/s | ETA %s%s\n",
                  static_cast<int>(std::to_string(cfg.steps).size()), ps.step + 1, cfg.steps, loss,
                  ps.lr, norm, tps,
                  format_duration(step_time_avg * (cfg.steps - ps.step - 1)).c_str(),
                  std::isfinite(ps.val_loss) ? str(" | val ", ps.val_loss).c_str() : "");
      if (r.overflow)
        std::printf("  step %d skipped: f16 gradients overflowed at loss scale %g (now %g)\n",
                    ps.step + 1, r.loss_scale, r.loss_scale / 2);
      std::fflush(stdout);
    }
    if (bad_run >= cfg.max_bad_steps)
      throw Error(str(bad_run, " steps in a row (", ps.step + 2 - bad_run, " to ", ps.step + 1,
                      ") had a non-finite loss or gradient norm and were skipped; stopped at "
                      "max_bad_steps=",
                      cfg.max_bad_steps, " without saving (", last_checkpoint(),
                      "); try a lower lr or grad_clip"));
  };
  auto flush = [&] {
    while (!pending.empty()) report();
  };

  for (int step = start.step; step < cfg.steps; ++step) {
    if (step == opt.faults.kill_at) std::raise(SIGKILL);  // testing hook (fault_inject.h)
    double val_loss = NAN;
    if (step % cfg.eval_every == 0) {
      flush();
      val_loss = run_eval(step);
      if (step == 0) result.first_val_loss = val_loss;
    }
    const double begin = total.seconds();
    runner->zero_grad();
    int64_t step_targets = 0;
    for (int micro = 0; micro < cfg.grad_accum; ++micro) {
      const size_t at = micro * batch_elems;
      micro_targets[micro] = source->next_batch(B, x.data() + at, y.data() + at,
                                                packed ? pos.data() + at : nullptr,
                                                packed ? seg.data() + at : nullptr);
      step_targets += micro_targets[micro];
    }
    // weights: this rank's slice's share of the step's trained targets (the whole micro-batch
    // on one process). The runner averages gradients over ranks, so the slice's gradient
    // carries world · share.
    std::vector<double> weights(cfg.grad_accum, 0.0);
    const size_t slice = static_cast<size_t>(rows) * T_, slice_at = rank * slice;
    for (int micro = 0; micro < cfg.grad_accum; ++micro) {
      const int32_t* xs = x.data() + micro * batch_elems + slice_at;
      const int32_t* ys = y.data() + micro * batch_elems + slice_at;
      const int64_t mine = comm ? std::count_if(ys, ys + slice, [](int32_t t) { return t != -1; })
                                : micro_targets[micro];
      double scale = 0;
      if (step_targets > 0) {
        weights[micro] = static_cast<double>(mine) / static_cast<double>(step_targets);
        scale = static_cast<double>(mine * world) / static_cast<double>(step_targets);
      }
      if (packed)
        runner->set_token_layout(pos.data() + micro * batch_elems + slice_at,
                                 seg.data() + micro * batch_elems + slice_at);
      runner->micro_step(xs, ys, rows, T_, scale);
    }
    if (const auto fault = opt.faults.at(step)) runner->inject_fault(*fault);
    const double lr = sched.at(step);
    AdamWParams ap;
    ap.lr = static_cast<float>(lr);
    ap.beta1 = static_cast<float>(cfg.beta1);
    ap.beta2 = static_cast<float>(cfg.beta2);
    ap.eps = static_cast<float>(cfg.eps);
    ap.weight_decay = static_cast<float>(cfg.weight_decay);  // >= 2-D tensors only
    ap.step = step + 1;
    runner->optimizer_step(ap, cfg.grad_clip);
    pending.push_back({step, lr, val_loss, begin, std::move(weights), step_targets});
    while (static_cast<int>(pending.size()) > runner->report_lag()) report();

    const int done = step + 1;
    if (cfg.save_every > 0 && (done % cfg.save_every == 0 || done == cfg.steps)) {
      flush();
      checkpoint(done);
    }
    bool stop = opt.stop && *opt.stop;
    if (comm) {  // a request on any rank stops every rank after this step
      double any = stop ? 1 : 0;
      comm->allreduce_sum(&any, 1);
      stop = any > 0;
    }
    if (stop && done < cfg.steps) {
      flush();
      if (last_saved != done) checkpoint(done);
      if (comm) comm->barrier();  // no rank ends before rank 0 has saved
      result.interrupted = true;
      result.seconds = total.seconds();
      if (primary)
        std::printf(
            "stopped after step %d of %d; checkpoint written. Continue with: forge train "
            "--resume %s\n",
            done, cfg.steps, out.c_str());
      std::fflush(stdout);
      return result;
    }
  }
  flush();
  // Final evaluation, after the last update.
  const double final_val = run_eval(cfg.steps);
  result.last_val_loss = final_val;
  if (std::isfinite(final_val)) {
    write_metrics(nlohmann::json{{"step", cfg.steps}, {"val_loss", final_val}});
  } else if (primary) {
    write_loss_svg(out + "/loss.svg", train_curve, val_curve,
                   "forge: " + mcfg.family_name() + " loss");
  }
  sync_host();
  try {
    if (primary) {
      if (lora)
        save_adapter_dir(out + "/model", *lora, model.adapter_weights(), start.init_from, model_files);
      else
        save_model_dir(out + "/model", model, final_save);
    }
  } catch (const Error& e) {
    throw Error(str("the final model was not saved (", last_checkpoint(), "): ", e.what()));
  }
  if (comm) comm->barrier();  // no rank ends before rank 0 has saved
  result.seconds = total.seconds();
  if (!primary) return result;
  std::printf("done in %s: train loss %.4f", format_duration(result.seconds).c_str(),
              result.last_train_loss);
  if (std::isfinite(final_val))
    std::printf(", val loss %.4f (from %.4f at step 0)", final_val, result.first_val_loss);
  if (opt.sft) {
    // The examples' own tokens (padding excluded) per second of training steps: what packing
    // speeds up (tok/s above counts every slot of the B x T rows).
    const uint64_t last = source->position();
    const int64_t tokens = source->example_tokens(first_position, last);
    std::printf("\nSFT: %llu examples, %lld example tokens in %.1f s of steps: %.1f examples/s, "
                "%.0f example tokens/s (%s rows)",
                static_cast<unsigned long long>(last - first_position), static_cast<long long>(tokens),
                step_seconds, step_seconds > 0 ? (last - first_position) / step_seconds : 0.0,
                step_seconds > 0 ? tokens / step_seconds : 0.0, packed ? "packed" : "padded");
    // The rows this run trained, filled by the examples' tokens.
    const double slots = static_cast<double>(cfg.steps - start.step) * B * cfg.grad_accum * T_;
    if (slots > 0) std::printf(", rows %.1f%% filled", 100.0 * static_cast<double>(tokens) / slots);
  }
  std::printf("\nmodel saved to %s/model, metrics in %s/metrics.jsonl, plot %s/loss.svg\n",
              out.c_str(), out.c_str(), out.c_str());
  std::fflush(stdout);
  return result;
}

// Keeps the lines of metrics.jsonl with step < `step` (a torn last line of a killed run is
// dropped too) and returns the curves they hold.
void cut_metrics(const std::string& path, int step, RunStart& start) {
  std::ifstream f(path);
  std::string line, kept;
  while (std::getline(f, line)) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception&) {
      continue;
    }
    if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) continue;
    const int s = j["step"].get<int>();
    if (s >= step) continue;
    kept += line + "\n";
    if (j.contains("loss") && j["loss"].is_number())
      start.train_curve.push_back({double(s), j["loss"].get<double>()});
    if (j.contains("val_loss") && j["val_loss"].is_number()) {
      start.val_curve.push_back({double(s), j["val_loss"].get<double>()});
      if (s == 0) start.first_val_loss = j["val_loss"].get<double>();
    }
  }
  io::write_file_atomic(path, kept);
}

}  // namespace

TrainResult train(const ModelConfig& mcfg, const TrainConfig& cfg, const std::string& data,
                  const std::string& out, const RunOptions& opt) {
  mcfg.validate();
  Transformer<float> model(mcfg, GradBuffers::kNone);  // the host copy: the runner's model trains
  model.init_weights(cfg.seed);
  return run(model, cfg, data, out, RunStart{}, opt);
}

TrainResult train_from(const std::string& model_dir, const TrainConfig& cfg,
                       const std::string& data, const std::string& out, const RunOptions& opt) {
  Transformer<float> model = load_model_dir(model_dir, GradBuffers::kNone);
  RunStart start;
  start.init_from = model_dir;
  return run(model, cfg, data, out, std::move(start), opt);
}

TrainResult resume(const std::string& run_dir, int steps, const std::string& data,
                   const RunOptions& opt) {
  if (!fs::is_directory(run_dir)) throw Error(str(run_dir, ": no such run directory"));
  const auto all = list_checkpoints(run_dir);
  if (all.empty())
    throw Error(
        str(run_dir,
            ": no checkpoint to resume from (checkpoints/step_NNNNNN; train with --save-every K)"));
  Checkpoint ck = load_checkpoint(all.back().second);
  const nlohmann::json& rc = ck.state.config;
  TrainConfig cfg = train_config_from_json(rc.value("train", nlohmann::json::object()),
                                           all.back().second + "/trainer_state.json");
  if (steps > 0) cfg.steps = steps;
  if (cfg.steps < ck.state.step)
    throw Error(
        str("--steps ", cfg.steps, " is before the newest checkpoint (step ", ck.state.step, ")"));
  if (cfg.seed != ck.state.seed)
    throw Error(str(all.back().second, ": seed in config and state disagree"));
  std::string data_path = data;
  if (data_path.empty()) {
    if (!rc.contains("data") || !rc["data"].is_string())
      throw Error(str(all.back().second, "/trainer_state.json: no data path; pass --data"));
    data_path = rc["data"].get<std::string>();
  }
  RunStart start;
  start.step = ck.state.step;
  start.loader_offset = ck.state.loader_rng_offset;
  start.m = std::move(ck.m);
  start.v = std::move(ck.v);
  start.loss_scale = ck.state.loss_scale;
  start.skipped_steps = ck.state.skipped_steps;
  start.resumed = true;
  RunOptions o = opt;
  o.sft = rc.contains("sft") && rc["sft"].is_boolean() && rc["sft"].get<bool>();
  if (rc.contains("init_from") && rc["init_from"].is_string())
    start.init_from = rc["init_from"].get<std::string>();
  if (rc.contains("tokenizer_files") && rc["tokenizer_files"].is_array()) {
    start.tokenizer_files.emplace();
    for (const auto& name : rc["tokenizer_files"])
      if (name.is_string()) start.tokenizer_files->push_back(name.get<std::string>());
  }

  // Device and precision: the run's, unless opt chooses (then that wins, said in one line). A
  // run's device is never swapped silently: a GPU run on a machine without one is an error.
  auto recorded = [&](const char* key) {
    return rc.contains(key) && rc[key].is_string() ? rc[key].get<std::string>() : "";
  };
  const std::string run_device = recorded("device"), run_precision = recorded("precision");
  const std::string run_on =
      run_device + (run_precision.empty() || run_device.empty() ? "" : " " + run_precision);
  o.device = !opt.device.empty() ? opt.device : run_device;
  if (o.device.empty())
    throw Error(str(all.back().second,
                    "/trainer_state.json: the run configuration records no device (written by "
                    "an older forge); pass --device cpu or --device cuda"));
  if (opt.precision.empty())
    o.precision = o.device == run_device && !run_precision.empty() ? run_precision
                                                                   : default_precision(o.device);
  if (!opt.device.empty() || !opt.precision.empty())
    std::printf("device %s %s as given (the run trained on %s)\n", o.device.c_str(),
                o.precision.c_str(), run_on.empty() ? "an unrecorded device" : run_on.c_str());
  else if (o.device == "cuda")
    start.device_hint = str("the run trained on ", run_on,
                            " (its configuration); pass --device cpu to continue on the CPU");
  std::printf("resuming %s from %s (step %d of %d)\n", run_dir.c_str(), all.back().second.c_str(),
              start.step, cfg.steps);
  return run(ck.model, cfg, data_path, run_dir, std::move(start), o);
}

}  // namespace forge
