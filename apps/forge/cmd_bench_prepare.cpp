// forge bench prepare: `forge data prepare` (prepare_data) timed at several thread counts into a
// scratch directory, removed after. A table of seconds, input MB/s, tokens/s, speed-up and peak
// RSS per thread count, and a check that every run wrote byte-identical shards (SHA-256 over the
// shard files in name order), which fails the command when they differ.
//
// Peak RSS: the process's VmHWM from /proc/self/status after the run, reset before it by writing
// "5" to /proc/self/clear_refs (Linux 4.0+). Where the reset is refused, the column is the peak
// since the process started, and the table says so.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "args.h"
#include "commands.h"
#include "forge/core/error.h"
#include "forge/core/sha256.h"
#include "forge/data/prepare.h"
#include "forge/tokenizer/tokenizer.h"

namespace forge::cli {

namespace {

namespace fs = std::filesystem;

const Command kBenchPrepare = {
    "bench prepare",
    "forge data prepare's throughput (MB/s) by thread count; shards checked identical",
    {{"tokenizer", "PATH",
      "tokenizer.json, or a directory with tokenizer.json or encoder.json + vocab.bpe"},
     {"input", "FILE", "text files, as forge data prepare reads them (required)", true},
     {"format", "FMT", "file (default), lines or jsonl, as forge data prepare --format"},
     {"threads", "N,N,...", "thread counts to time (default 1,2,4,8,16)"},
     {"repeats", "N", "runs per thread count; the fastest is reported (default 1)"},
     {"shard-tokens", "N", "tokens per shard at most (default 100000000, as forge data prepare)"},
     {"scratch", "DIR",
      "where the shards are written, then removed (default: a new directory in $TMPDIR or /tmp)"},
     {"no-read-ahead", "",
      "read each batch only after the one before is written (prepare reads the next batch on "
      "another thread by default): an A/B of the read-ahead"},
     {"json-out", "FILE", "also write the numbers as JSON"}},
    false,
    "",
    "Each run is prepare_data as `forge data prepare` calls it, shard writing and fsync included;\n"
    "the inputs are read once before timing, so the first run does not pay for a cold page\n"
    "cache. Thread counts above the machine's cores run, flagged in the table. Every run must\n"
    "write the same shard bytes (the command fails naming the first run that differs).\n"
    "A real corpus (42.5 MB; apt-get install fortunes dict-gcide python3), one document a line,\n"
    "GPT-2's tokenizer:\n"
    "  scripts/make_corpus.sh /tmp/corpus.txt\n"
    "  forge bench prepare --tokenizer ../shared/data/gpt2 --input /tmp/corpus.txt \\\n"
    "    --format lines --threads 1,2,4,8,16"};

// "1,2,4" -> {1, 2, 4}; each a positive integer.
std::vector<int> parse_thread_list(const std::string& s) {
  std::vector<int> out;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t comma = std::min(s.find(',', start), s.size());
    const std::string item = s.substr(start, comma - start);
    out.push_back(static_cast<int>(
        parse_int64("--threads", item, 1, std::numeric_limits<int>::max())));
    start = comma + 1;
  }
  return out;
}

// The shards (train_*.bin, val_*.bin, in name order) of `dir`, hashed as one stream of
// name, size and bytes.
std::string hash_shards(const std::string& dir, int* count) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if ((name.starts_with("train_") || name.starts_with("val_")) && name.ends_with(".bin"))
      names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  Sha256 h;
  std::vector<char> buf(size_t{1} << 20);
  for (const std::string& name : names) {
    const std::string path = (fs::path(dir) / name).string();
    const uint64_t size = fs::file_size(path);
    h.update(name.data(), name.size() + 1);  // with the terminating NUL: names stay delimited
    h.update(&size, sizeof(size));
    std::ifstream f(path, std::ios::binary);
    if (!f) throw Error(str(path, ": cannot read the shard back"));
    while (f.read(buf.data(), static_cast<std::streamsize>(buf.size())) || f.gcount() > 0)
      h.update(buf.data(), static_cast<size_t>(f.gcount()));
  }
  *count = static_cast<int>(names.size());
  return h.hex_digest();
}

// Resets the peak RSS counter; false when the kernel refuses.
bool reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.flush();
  return static_cast<bool>(f);
}

// VmHWM in bytes, or -1 when /proc/self/status does not say.
int64_t peak_rss_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.starts_with("VmHWM:")) return std::stoll(line.substr(6)) * 1024;  // "... kB"
  return -1;
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.starts_with("model name")) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  return "unknown CPU";
}

// The scratch directory: created here, removed (with whatever is in it) when this goes.
class Scratch {
 public:
  explicit Scratch(const std::string& parent) {
    const fs::path base = parent.empty() ? fs::temp_directory_path() : fs::path(parent);
    dir_ = (base / str("forge-bench-prepare-", ::getpid())).string();
    std::error_code ec;
    if (fs::exists(dir_, ec)) throw Error(str(dir_, " already exists; remove it"));
    fs::create_directories(dir_, ec);
    if (ec) throw Error(str(dir_, ": cannot create (", ec.message(), ")"));
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
};

struct Row {
  int threads;
  double seconds;  // fastest of the repeats
  int64_t peak_rss;
};

}  // namespace

int bench_prepare(const Argv& argv) {
  const Args a = parse_args(kBenchPrepare, argv);
  if (a.help()) {
    print_help(kBenchPrepare);
    return 0;
  }
  PrepareOptions o;
  o.inputs = a.all("input");
  if (o.inputs.empty())
    throw Error("--input is required (text files; see forge bench prepare --help for a corpus)");
  const std::string tokenizer_path = a.require("tokenizer");
  const std::string format = a.get("format", "file");
  o.format = parse_doc_format(format);
  o.shard_tokens =
      a.get_int64("shard-tokens", o.shard_tokens, 1, std::numeric_limits<int64_t>::max());
  const std::vector<int> thread_counts = parse_thread_list(a.get("threads", "1,2,4,8,16"));
  const int repeats = a.get_int("repeats", 1, 1, 1000);
  o.read_ahead = !a.has("no-read-ahead");
  const tok::Tokenizer tokenizer = tok::Tokenizer::load(tokenizer_path);

  // Read every input once (a missing one fails here, before any timing) to warm the page cache.
  int64_t bytes = 0;
  {
    std::vector<char> buf(size_t{1} << 20);
    for (const std::string& path : o.inputs) {
      std::error_code ec;
      if (!fs::is_regular_file(path, ec)) throw Error(str(path, ": no such file"));
      std::ifstream f(path, std::ios::binary);
      if (!f) throw Error(str(path, ": cannot open"));
      while (f.read(buf.data(), static_cast<std::streamsize>(buf.size())) || f.gcount() > 0)
        bytes += f.gcount();
    }
  }
  const unsigned cores = std::thread::hardware_concurrency();
  const Scratch scratch(a.get("scratch"));
  o.out_dir = (fs::path(scratch.dir()) / "out").string();

  const bool rss_reset = reset_peak_rss();
  std::vector<Row> rows;
  std::optional<PrepareStats> first;
  std::string first_hash;
  int shard_files = 0;
  for (const int threads : thread_counts) {
    Row row{threads, std::numeric_limits<double>::infinity(), 0};
    for (int r = 0; r < repeats; ++r) {
      std::fprintf(stderr, "prepare with %d thread(s), run %d of %d...\n", threads, r + 1,
                   repeats);
      fs::remove_all(o.out_dir);
      o.threads = threads;
      if (rss_reset) reset_peak_rss();
      const PrepareStats s = prepare_data(tokenizer, o);
      row.seconds = std::min(row.seconds, s.seconds);
      row.peak_rss = std::max(row.peak_rss, peak_rss_bytes());
      const std::string hash = hash_shards(o.out_dir, &shard_files);
      if (!first) {
        first = s;
        first_hash = hash;
      } else if (hash != first_hash) {
        throw Error(str("shards differ: ", threads, " threads (run ", r + 1, ") wrote ", hash,
                        ", ", thread_counts[0], " threads wrote ", first_hash));
      }
    }
    rows.push_back(row);
  }
  fs::remove_all(o.out_dir);

  const double mb = bytes / 1e6;
  const int64_t tokens = first->train_tokens + first->val_tokens;
  // The speed-up's base: the 1-thread row, else the first.
  const auto base_it =
      std::find_if(rows.begin(), rows.end(), [](const Row& r) { return r.threads == 1; });
  const Row& base = base_it != rows.end() ? *base_it : rows.front();

  std::printf("forge bench prepare\n");
  std::printf("input: %zu file(s), %lld bytes (%.1f MB), format %s: %lld documents, %lld tokens "
              "(EOT included), %d shard file(s)\n",
              o.inputs.size(), static_cast<long long>(bytes), mb, format.c_str(),
              static_cast<long long>(first->documents), static_cast<long long>(tokens),
              shard_files);
  std::printf("tokenizer: %s (%d tokens)\n", tokenizer_path.c_str(), tokenizer.vocab_size());
  std::printf("machine: %u hardware threads, %s\n", cores, cpu_model().c_str());
  std::printf("each row: the fastest of %d run(s) of prepare_data, shard writing included; "
              "read-ahead %s\n\n",
              repeats, o.read_ahead ? "on" : "off (--no-read-ahead)");
  std::printf("| threads | seconds | input MB/s | tokens/s   | speed-up vs %-2d | peak RSS MB |\n",
              base.threads);
  std::printf("|--------:|--------:|-----------:|-----------:|---------------:|------------:|\n");
  nlohmann::json jrows = nlohmann::json::array();
  bool oversubscribed = false;
  for (const Row& r : rows) {
    const bool over = cores > 0 && static_cast<unsigned>(r.threads) > cores;
    oversubscribed = oversubscribed || over;
    const std::string threads = str(r.threads, over ? " *" : "");
    std::printf("| %7s | %7.2f | %10.2f | %10.0f | %13.2fx | %11.1f |\n", threads.c_str(),
                r.seconds, mb / r.seconds, tokens / r.seconds, base.seconds / r.seconds,
                r.peak_rss / 1e6);
    jrows.push_back({{"threads", r.threads},
                     {"seconds", r.seconds},
                     {"input_mb_s", mb / r.seconds},
                     {"tokens_s", tokens / r.seconds},
                     {"speedup", base.seconds / r.seconds},
                     {"peak_rss_bytes", r.peak_rss},
                     {"above_cores", over}});
  }
  if (oversubscribed) std::printf("* more threads than this machine's %u hardware threads\n", cores);
  if (!rss_reset)
    std::printf("peak RSS: since the process started (the kernel refused the per-run reset)\n");
  std::printf("\nshards: identical for every thread count and run (%d file(s), SHA-256 %s)\n",
              shard_files, first_hash.c_str());

  if (a.has("json-out")) {
    const nlohmann::json j = {{"input_files", o.inputs},
                              {"input_bytes", bytes},
                              {"format", format},
                              {"documents", first->documents},
                              {"tokens", tokens},
                              {"shard_files", shard_files},
                              {"tokenizer", tokenizer_path},
                              {"tokenizer_vocab_size", tokenizer.vocab_size()},
                              {"hardware_threads", cores},
                              {"cpu", cpu_model()},
                              {"repeats", repeats},
                              {"read_ahead", o.read_ahead},
                              {"peak_rss_per_run", rss_reset},
                              {"shards_identical", true},
                              {"shards_sha256", first_hash},
                              {"rows", jrows}};
    std::ofstream f(a.get("json-out"));
    if (!f) throw Error(str(a.get("json-out"), ": cannot write"));
    f << j.dump(2) << "\n";
  }
  return 0;
}

}  // namespace forge::cli
