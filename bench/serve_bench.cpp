// forge bench serve: `forge serve` (in-process, on a loopback port) under the load client
// (serve/load_client.h) at several numbers of concurrent streams. Greedy requests of
// --max-tokens tokens each, half of them streamed, completions and chat mixed; every answer
// must be HTTP 200 and well-formed (the run fails otherwise) and is compared with the answer
// the server gave the same prompt alone before the rows (the table counts differences: with
// reduced precision, batched arithmetic may legitimately round differently).
//
// With --preset the model is that shape with random weights, saved as bf16 into a temporary
// model directory with a synthetic byte-level tokenizer of the preset's vocabulary (256 byte
// tokens, the rest filler words " w<id>", no merges, no end-of-text: every request yields
// --max-tokens tokens).
//
// Per row: total completion tokens / wall time of the row, per-request latency p50 / p99
// (send → last byte), time to the first text chunk (streams) p50, and where the scheduler
// thread's time went (from /metrics before and after the row): its decode steps' mean time and
// their share of the row's wall time, and the share spent admitting requests (prefill).
#include <httplib.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "bench.h"
#include "forge/core/error.h"
#include "forge/model/config.h"
#include "forge/model/model_dir.h"
#include "forge/serve/load_client.h"
#include "forge/serve/server.h"

namespace forge::bench {

namespace {

using nlohmann::json;

// The scheduler's time counters from GET /metrics (serve/metrics.h).
struct SchedulerTime {
  double prefill_s = 0, step_s = 0, steps = 0;
};
SchedulerTime scheduler_time(int port) {
  httplib::Client cli("127.0.0.1", port);
  auto r = cli.Get("/metrics");
  if (!r || r->status != 200) throw Error("bench serve: GET /metrics failed");
  SchedulerTime t;
  std::istringstream in(r->body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t sp = line.rfind(' ');
    if (sp == std::string::npos) continue;
    const std::string name = line.substr(0, sp);
    const double v = std::strtod(line.c_str() + sp + 1, nullptr);
    if (name == "forge_prefill_seconds_total") t.prefill_s = v;
    if (name == "forge_decode_step_seconds_total") t.step_s = v;
    if (name == "forge_decode_steps_total") t.steps = v;
  }
  return t;
}

// GPT-2's byte → printable character map (the ByteLevel pre-tokenizer's alphabet), UTF-8.
std::string byte_char(int b) {
  int cp = b;
  if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))) {
    int n = 0;
    for (int x = 0; x < b; ++x)
      if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) ++n;
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// A byte-level BPE tokenizer.json of exactly `vocab` tokens (>= 256): the 256 bytes, then
// filler tokens " w<id>" that decoding can produce but encoding never does (no merges).
std::string synthetic_tokenizer(int vocab) {
  json v = json::object();
  for (int b = 0; b < 256; ++b) v[byte_char(b)] = b;
  for (int id = 256; id < vocab; ++id) v[byte_char(' ') + "w" + std::to_string(id)] = id;
  const json byte_level = {{"type", "ByteLevel"},
                           {"add_prefix_space", false},
                           {"trim_offsets", true},
                           {"use_regex", true}};
  const json t = {{"version", "1.0"},
                  {"truncation", nullptr},
                  {"padding", nullptr},
                  {"added_tokens", json::array()},
                  {"normalizer", nullptr},
                  {"pre_tokenizer", byte_level},
                  {"post_processor", nullptr},
                  {"decoder", byte_level},
                  {"model",
                   {{"type", "BPE"},
                    {"dropout", nullptr},
                    {"unk_token", nullptr},
                    {"continuing_subword_prefix", nullptr},
                    {"end_of_word_suffix", nullptr},
                    {"fuse_unk", false},
                    {"byte_fallback", false},
                    {"ignore_merges", false},
                    {"vocab", v},
                    {"merges", json::array()}}}};
  return t.dump();
}

// Removes a directory when the benchmark ends, however it ends.
struct TempDir {
  std::string path;
  ~TempDir() {
    std::error_code ec;
    if (!path.empty()) std::filesystem::remove_all(path, ec);
  }
};

}  // namespace

void serve_bench(const ServeBenchOptions& o) {
  TempDir tmp;
  std::string dir = o.model;
  std::string what;
  if (dir.empty()) {
    const ModelConfig cfg = preset_config(o.preset);
    if (cfg.vocab_size < 256)
      throw Error(str("--preset ", o.preset, ": the vocabulary is under 256 tokens"));
    tmp.path = (std::filesystem::temp_directory_path() /
                str("forge-bench-serve-", std::random_device{}(), "-", o.preset))
                   .string();
    Transformer<float> model(cfg);
    model.init_weights(1337);
    ModelSaveOptions so;
    so.dtype = io::StDType::kBF16;
    so.files = {{"tokenizer.json", synthetic_tokenizer(cfg.vocab_size)}};
    save_model_dir(tmp.path, model, so);
    dir = tmp.path;
    what = str(o.preset, " (", cfg.family_name(), ", ", cfg.n_layer, " layers, width ", cfg.n_embd,
               ", ", cfg.n_head, "/", cfg.n_kv_head, " heads, vocab ", cfg.vocab_size,
               "), random bf16 weights");
  } else {
    what = str("model directory ", dir);
  }
  serve::ServeOptions so;
  so.port = 0;
  so.device = o.device;
  so.precision = o.precision;
  so.log = false;
  so.max_batch = o.max_batch;
  so.context = o.context;
  so.pipeline = o.pipeline;
  // Room to wait for every stream of the largest row: the benchmark measures, it must not get 503.
  so.max_queue = *std::max_element(o.streams.begin(), o.streams.end());
  serve::Server server(dir, so);
  const int port = server.start();

  std::vector<serve::LoadCase> cases = {{false, "The quick brown fox", {}},
                                        {true, "Tell me a story about a robot.", {}},
                                        {false, "Once upon a time", {}},
                                        {true, "What is the capital of France?", {}}};
  // The reference answers: each prompt alone, before any load.
  {
    httplib::Client cli("127.0.0.1", port);
    cli.set_read_timeout(600, 0);
    for (serve::LoadCase& c : cases) {
      json b = {{"max_tokens", o.max_tokens},
                {"max_batch", server.max_batch()},
                {"context", server.context()},
                {"temperature", 0}};
      if (c.chat)
        b["messages"] = json::array({json{{"role", "user"}, {"content", c.prompt}}});
      else
        b["prompt"] = c.prompt;
      auto r = cli.Post(c.chat ? "/v1/chat/completions" : "/v1/completions", b.dump(),
                        "application/json");
      if (!r || r->status != 200)
        throw Error(str("bench serve: the reference request failed: ",
                        r ? r->body : httplib::to_string(r.error())));
      const json answer = json::parse(r->body);
      const json& ch = answer.at("choices").at(0);
      c.expected = c.chat ? ch.at("message").at("content").get<std::string>()
                          : ch.at("text").get<std::string>();
    }
  }

  std::printf("forge bench serve: %s\n", what.c_str());
  std::printf(
      "device %s, %d decode slots, context %d; %d new tokens per request (greedy), half "
      "streamed, completions and chat; pipelined steps %s\n\n",
      server.device_name().c_str(), server.max_batch(), server.context(), o.max_tokens,
      o.pipeline ? "on" : "off");
  std::printf(
      "| streams | requests | total tokens/s | latency p50 | latency p99 | TTFT p50 | equal to "
      "alone | step | steps' share | prefill share |\n");
  std::printf("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  json rows = json::array();
  double one = 0, at32 = 0;
  for (int s : o.streams) {
    serve::LoadOptions lo;
    lo.port = port;
    lo.clients = s;
    lo.requests = o.requests > 0 ? o.requests : std::max(8, 2 * s);
    lo.max_tokens = o.max_tokens;
    lo.timeout_s = 3600;
    const SchedulerTime t0 = scheduler_time(port);
    const serve::LoadResult r = serve::run_load(lo, cases);
    const SchedulerTime t1 = scheduler_time(port);
    const double steps = t1.steps - t0.steps;
    const double step_ms = steps > 0 ? (t1.step_s - t0.step_s) / steps * 1e3 : 0;
    const double step_share = r.wall_s > 0 ? (t1.step_s - t0.step_s) / r.wall_s : 0;
    const double prefill_share = r.wall_s > 0 ? (t1.prefill_s - t0.prefill_s) / r.wall_s : 0;
    if (r.failed > r.mismatched) {
      std::string first = "see the server";
      for (const std::string& f : r.failures)
        if (f.find("is not the expected") == std::string::npos) {
          first = f;
          break;
        }
      throw Error(str("bench serve: ", s, " streams: ", r.failed - r.mismatched,
                      " requests failed (", first, ")"));
    }
    std::printf("| %d | %lld | %.1f | %.1f ms | %.1f ms | %.1f ms | %lld/%lld | %.3f ms | %.0f%% | %.0f%% |\n", s,
                static_cast<long long>(r.ok + r.failed), r.tokens_per_s, r.latency_p50_ms,
                r.latency_p99_ms, r.ttft_p50_ms, static_cast<long long>(r.ok),
                static_cast<long long>(r.ok + r.failed), step_ms, 100 * step_share, 100 * prefill_share);
    if (s == 1) one = r.tokens_per_s;
    if (s == 32) at32 = r.tokens_per_s;
    rows.push_back({{"streams", s},
                    {"requests", r.ok + r.failed},
                    {"tokens_per_s", r.tokens_per_s},
                    {"latency_p50_ms", r.latency_p50_ms},
                    {"latency_p99_ms", r.latency_p99_ms},
                    {"ttft_p50_ms", r.ttft_p50_ms},
                    {"equal_to_alone", r.ok},
                    {"wall_s", r.wall_s},
                    {"step_ms", step_ms},
                    {"step_share", step_share},
                    {"prefill_share", prefill_share}});
  }
  if (one > 0 && at32 > 0)
    std::printf(
        "\n32 streams / 1 stream (the batch-1 decode rate through the server): %.2fx (issue 18's "
        "goal: >= 10x)\n",
        at32 / one);
  server.stop();
  if (!o.json_out.empty()) {
    std::ofstream f(o.json_out);
    if (!f) throw Error(str(o.json_out, ": cannot write"));
    f << json{{"bench", "serve"},
              {"model", what},
              {"device", server.device_name()},
              {"max_tokens", o.max_tokens},
              {"max_batch", server.max_batch()},
              {"context", server.context()},
              {"rows", rows}}
             .dump(2)
      << "\n";
  }
}

}  // namespace forge::bench
