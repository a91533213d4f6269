// forge bench <what>: benchmarks that print a table and, with --json-out, write the numbers.
// `tokenizer` is here: BPE training time and encode throughput (one thread, then all threads
// over ~1 MB blocks of the input), beside the reference figures of shared/ANCHORS.md, which were
// measured on another machine (bench/tokenizer_compare.py measures tiktoken and Hugging Face
// tokenizers on this one). gemm, attention and train (GPU) are in cmd_bench_gpu.cpp; prepare
// (forge data prepare by thread count) in cmd_bench_prepare.cpp.
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "args.h"
#include "commands.h"
#include "forge/core/error.h"
#include "forge/core/timer.h"
#include "forge/tokenizer/tokenizer.h"
#include "forge/tokenizer/trainer.h"

namespace forge::cli {

namespace {

const Command kBenchTokenizer = {
    "bench tokenizer",
    "BPE training time and encode throughput",
    {{"input", "FILE", "text files (default: the files of /usr/share/games/fortunes)", true},
     {"tokenizer", "PATH", "tokenizer to encode with (default: the one trained here)"},
     {"vocab-size", "N", "vocabulary to train (default 8192, one special token)"},
     {"pattern", "NAME", "pre-tokenizer for training: gpt2 (default), gpt4 or none"},
     {"threads", "N", "threads for training and parallel encoding (default: all cores)"},
     {"no-train", "", "skip the training measurement (needs --tokenizer)"},
     {"json-out", "FILE", "also write the numbers as JSON"}},
    false,
    "",
    "The corpus of the reference figures: scripts/make_corpus.sh OUT (fortunes + gcide, 42.5 MB).\n"
    "Reference (shared/ANCHORS.md, the GPU machine's CPU): GPT-2 encoding, one thread: tiktoken\n"
    "0.14 6.6 MB/s, HF tokenizers 0.23 1.0 MB/s; BPE training of 8,192 tokens on fortunes + "
    "gcide:\n"
    "HF tokenizers 13.5 s with 2 threads, 4.7 s with 16."};

std::vector<std::string> default_inputs() {
  const std::filesystem::path dir = "/usr/share/games/fortunes";
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file() && !name.ends_with(".dat") && !name.ends_with(".u8"))
      files.push_back(e.path().string());
  }
  if (files.empty())
    throw Error("--input is required (no default: /usr/share/games/fortunes is missing)");
  std::sort(files.begin(), files.end());
  return files;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(str(path, ": no such file or not readable"));
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Blocks of about 1 MB ending at a newline: the unit of parallel encoding.
std::vector<std::string_view> blocks_of(const std::vector<std::string>& texts) {
  std::vector<std::string_view> blocks;
  for (const std::string_view t : texts) {
    size_t start = 0;
    while (start < t.size()) {
      size_t end = t.find('\n', std::min(t.size(), start + (size_t{1} << 20)));
      end = end == std::string_view::npos ? t.size() : end + 1;
      blocks.push_back(t.substr(start, end - start));
      start = end;
    }
  }
  return blocks;
}

// Seconds to encode every block with `threads` threads; *tokens gets the token count.
double time_encode(const tok::Tokenizer& t, const std::vector<std::string_view>& blocks,
                   int threads, int64_t* tokens) {
  int64_t total = 0;
  const Timer timer;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) reduction(+ : total)
  for (size_t b = 0; b < blocks.size(); ++b)
    total += static_cast<int64_t>(t.encode_ordinary(blocks[b]).size());
  *tokens = total;
  return timer.seconds();
}

int bench_tokenizer(const Argv& argv) {
  const Args a = parse_args(kBenchTokenizer, argv);
  if (a.help()) {
    print_help(kBenchTokenizer);
    return 0;
  }
  const std::vector<std::string> inputs = a.has("input") ? a.all("input") : default_inputs();
  // 0: all cores.
  const int asked_threads = a.get_int("threads", 0, 0, std::numeric_limits<int>::max());
  const int threads = asked_threads > 0 ? asked_threads : omp_get_max_threads();
  if (a.has("no-train") && !a.has("tokenizer")) throw Error("--no-train needs --tokenizer");
  std::vector<std::string> texts;
  int64_t bytes = 0;
  for (const auto& p : inputs) {
    texts.push_back(read_file(p));
    bytes += static_cast<int64_t>(texts.back().size());
  }
  const double mb = bytes / 1e6;
  nlohmann::json j = {{"input_files", inputs.size()},
                      {"input_bytes", bytes},
                      {"threads", threads},
                      {"hardware_threads", std::thread::hardware_concurrency()}};

  std::optional<tok::Tokenizer> trained;
  if (!a.has("no-train")) {
    tok::BpeTrainOptions o;
    o.vocab_size = a.get_int("vocab-size", 8192, 1, std::numeric_limits<int>::max());
    o.pattern = tok::parse_split_pattern(a.get("pattern", "gpt2"));
    o.threads = threads;
    std::fprintf(stderr, "training a %d-token vocabulary on %.1f MB with %d threads...\n",
                 o.vocab_size, mb, threads);
    const Timer timer;
    trained = tok::train_bpe(texts, o);
    j["train_seconds"] = timer.seconds();
    j["train_vocab_size"] = trained->vocab_size();
    j["train_pattern"] = a.get("pattern", "gpt2");
  }
  const tok::Tokenizer t = a.has("tokenizer") ? tok::Tokenizer::load(a.get("tokenizer")) : *trained;
  j["tokenizer"] = a.has("tokenizer") ? a.get("tokenizer") : "trained here";
  j["tokenizer_vocab_size"] = t.vocab_size();

  const std::vector<std::string_view> blocks = blocks_of(texts);
  std::fprintf(stderr, "encoding %.1f MB with 1 thread, then %d...\n", mb, threads);
  int64_t tokens = 0;
  const double s1 = time_encode(t, blocks, 1, &tokens);
  const double sn = time_encode(t, blocks, threads, &tokens);
  j["tokens"] = tokens;
  j["encode_mb_s_1_thread"] = mb / s1;
  j["encode_mb_s_all_threads"] = mb / sn;
  j["reference"] = {{"tiktoken_0.14_encode_mb_s_1_thread", 6.6},
                    {"hf_tokenizers_0.23_encode_mb_s_1_thread", 1.0},
                    {"hf_tokenizers_0.23_train_8192_seconds_2_threads", 13.5},
                    {"hf_tokenizers_0.23_train_8192_seconds_16_threads", 4.7},
                    {"where",
                     "shared/ANCHORS.md: the GPU machine's CPU; GPT-2 encoding of 5 MiB "
                     "English; training on fortunes + gcide (42.5 MB)"}};

  std::printf("forge bench tokenizer\n");
  std::printf(
      "input: %zu files, %.1f MB; tokenizer: %s (%d tokens); threads: %d of %u hardware\n\n",
      inputs.size(), mb, j["tokenizer"].get<std::string>().c_str(), t.vocab_size(), threads,
      std::thread::hardware_concurrency());
  std::printf("| %-40s | %-12s | %-52s |\n", "measurement", "forge",
              "reference, measured elsewhere");
  std::printf("|%s|%s|%s|\n", std::string(42, '-').c_str(), std::string(14, '-').c_str(),
              std::string(54, '-').c_str());
  if (j.contains("train_seconds")) {
    const std::string what =
        str("train BPE, vocab ", j["train_vocab_size"].get<int>(), ", ", threads, " threads");
    std::printf("| %-40s | %8.2f s   | %-52s |\n", what.c_str(), j["train_seconds"].get<double>(),
                "HF tokenizers: 13.5 s @2 threads, 4.7 s @16 (42.5 MB)");
  }
  std::printf("| %-40s | %7.2f MB/s | %-52s |\n", "encode, 1 thread", mb / s1,
              "tiktoken 6.6 MB/s, HF tokenizers 1.0 MB/s (GPT-2)");
  const std::string all = str("encode, ", threads, " threads");
  std::printf("| %-40s | %7.2f MB/s | %-52s |\n", all.c_str(), mb / sn, "");
  std::printf("\n%lld tokens, %.2f bytes per token\n", static_cast<long long>(tokens),
              tokens > 0 ? static_cast<double>(bytes) / tokens : 0.0);

  if (a.has("json-out")) {
    std::ofstream f(a.get("json-out"));
    if (!f) throw Error(str(a.get("json-out"), ": cannot write"));
    f << j.dump(2) << "\n";
  }
  return 0;
}

}  // namespace

int cmd_bench(const Argv& argv) {
  if (argv.empty() || argv[0] == "--help" || argv[0] == "-h") {
    std::printf(
        "forge bench — benchmarks (a table on stdout; --json-out FILE writes the numbers)\n\n"
        "usage: forge bench tokenizer|prepare|gemm|attention|train|generate|serve [options]\n\n"
        "  tokenizer  BPE training time and encode throughput\n"
        "  prepare    forge data prepare's MB/s by thread count, shards checked identical\n"
        "  gemm       cuBLASLt TFLOP/s on a preset's GEMM shapes (CUDA)\n"
        "  attention  flash attention fwd/bwd TFLOP/s beside PyTorch flash and cuDNN (CUDA)\n"
        "  train      training tokens/s, MFU, step time, memory (CUDA)\n"
        "  generate   KV-cache decoding: time to first token, tokens/s by batch size (CUDA or CPU)\n"
        "  serve      forge serve under 1..128 concurrent streams: tokens/s, latency (CUDA or CPU)\n\n"
        "`forge bench <what> --help` describes each one's options.\n");
    return argv.empty() ? 1 : 0;
  }
  const std::string& what = argv[0];
  if (what == "tokenizer") return bench_tokenizer(Argv(argv.begin() + 1, argv.end()));
  if (what == "prepare") return bench_prepare(Argv(argv.begin() + 1, argv.end()));
  if (what == "gemm" || what == "train" || what == "attention")
    return bench_gpu(what, Argv(argv.begin() + 1, argv.end()));
  if (what == "generate") return bench_generate(Argv(argv.begin() + 1, argv.end()));
  if (what == "serve") return bench_serve(Argv(argv.begin() + 1, argv.end()));
  throw Error(str("unknown benchmark '", what,
                  "' (expected tokenizer, prepare, gemm, attention, train, generate or serve)"));
}

}  // namespace forge::cli
