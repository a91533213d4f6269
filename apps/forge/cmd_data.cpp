// forge data prepare: text documents → llm.c-format token shards (train_NNNNNN.bin, val_NNNNNN.bin)
// for `forge train --data DIR`. The work is in forge/data/prepare.cpp; here: options, a progress
// bar on stderr (MB/s and ETA, redrawn with \r, ended with a newline) and a one-line summary on
// stdout.
#include <algorithm>
#include <cstdio>
#include <limits>
#include <string>

#include "args.h"
#include "commands.h"
#include "forge/core/error.h"
#include "forge/core/timer.h"
#include "forge/data/prepare.h"
#include "forge/tokenizer/tokenizer.h"

namespace forge::cli {

namespace {

const Command kPrepareCmd = {
    "data prepare",
    "tokenize text documents into train/val token shards",
    {{"tokenizer", "PATH",
      "tokenizer.json, or a directory with tokenizer.json or encoder.json + vocab.bpe"},
     {"input", "FILE", "text files, read in this order", true},
     {"out", "DIR",
      "where the shards and the tokenizer's files go (created; must not hold shards yet)"},
     {"format", "FMT", "file (default: a file is a document), lines, or jsonl (\"text\" field)"},
     {"val-fraction", "F", "share of documents for validation, in [0, 0.5] (default 0.005)"},
     {"shard-tokens", "N", "tokens per shard at most (default 100000000)"},
     {"eot", "TOKEN", "special token before every document (default <|endoftext|>)"},
     {"allow-invalid-utf8", "", "tokenize invalid UTF-8 bytes instead of stopping"},
     {"threads", "N", "encoding threads (default: all cores)"}},
    false,
    "",
    "Every document is preceded by the EOT token (as llm.c's data scripts do). Document g\n"
    "(counting from 0 in input order) goes to val when g % round(1/F) == 1, so two or more\n"
    "documents always give a val split. Shards are the same for any --threads.\n"
    "DIR also gets the tokenizer's files: tokenizer.json (converted too when given GPT-2's\n"
    "encoder.json + vocab.bpe, which are copied), and tokenizer_config.json,\n"
    "special_tokens_map.json, chat_template.jinja when they sit beside it. `forge train --data\n"
    "DIR` puts them into every model it saves."};

// " (with tokenizer.json, tokenizer_config.json)" for the summary line.
std::string tokenizer_note(const std::vector<std::string>& files) {
  std::string s;
  for (const std::string& f : files) s += (s.empty() ? " (with " : ", ") + f;
  return s.empty() ? s : s + ")";
}

void usage() {
  std::printf(
      "forge data — prepare training data\n\n"
      "usage: forge data prepare [options]\n\n"
      "  prepare  tokenize text documents into train/val token shards\n\n"
      "`forge data prepare --help` describes it.\n");
}

int prepare(const Argv& argv) {
  const Args a = parse_args(kPrepareCmd, argv);
  if (a.help()) {
    print_help(kPrepareCmd);
    return 0;
  }
  PrepareOptions o;
  o.inputs = a.all("input");
  if (o.inputs.empty()) throw Error("--input is required (one or more text files)");
  o.out_dir = a.require("out");
  o.format = parse_doc_format(a.get("format", "file"));
  o.val_fraction = a.get_double("val-fraction", o.val_fraction, {0, 0.5});
  o.shard_tokens =
      a.get_int64("shard-tokens", o.shard_tokens, 1, std::numeric_limits<int64_t>::max());
  o.eot = a.get("eot", o.eot);
  o.allow_invalid_utf8 = a.has("allow-invalid-utf8");
  o.threads = a.get_int("threads", 0, 0, std::numeric_limits<int>::max());  // 0: all cores
  o.tokenizer_path = a.require("tokenizer");
  const tok::Tokenizer tokenizer = tok::Tokenizer::load(o.tokenizer_path);

  bool drew = false;
  double last = -1;
  o.progress = [&](const PrepareProgress& p) {
    if (p.seconds - last < 0.2 && p.bytes_done < p.bytes_total) return;
    last = p.seconds;
    const double mb_s = p.bytes_done / 1e6 / std::max(p.seconds, 1e-9);
    const double eta =
        mb_s > 0 ? std::max<int64_t>(0, p.bytes_total - p.bytes_done) / 1e6 / mb_s : 0;
    const double frac = p.bytes_total > 0 ? static_cast<double>(p.bytes_done) / p.bytes_total : 1;
    const int filled = static_cast<int>(std::min(1.0, frac) * 30);
    std::fprintf(stderr, "\r[%-30s] %5.1f%%  %.1f/%.1f MB  %.1f MB/s  ETA %.0f s ",
                 std::string(filled, '#').c_str(), 100 * std::min(1.0, frac), p.bytes_done / 1e6,
                 p.bytes_total / 1e6, mb_s, eta);
    std::fflush(stderr);
    drew = true;
  };
  PrepareStats s;
  try {
    s = prepare_data(tokenizer, o);
  } catch (...) {
    if (drew) std::fputc('\n', stderr);  // the error message gets its own line
    throw;
  }
  if (drew) std::fputc('\n', stderr);
  std::printf(
      "prepared %lld documents (%lld train, %lld val): %lld train tokens in %d shards, %lld val "
      "tokens in %d shards, %.1f MB in %.2f s -> %s%s\n",
      static_cast<long long>(s.documents), static_cast<long long>(s.train_documents),
      static_cast<long long>(s.val_documents), static_cast<long long>(s.train_tokens),
      s.train_shards, static_cast<long long>(s.val_tokens), s.val_shards, s.bytes / 1e6, s.seconds,
      o.out_dir.c_str(), tokenizer_note(s.tokenizer_files).c_str());
  return 0;
}

}  // namespace

int cmd_data(const Argv& argv) {
  if (argv.empty() || argv[0] == "--help" || argv[0] == "-h") {
    usage();
    return argv.empty() ? 1 : 0;
  }
  if (argv[0] == "prepare") return prepare(Argv(argv.begin() + 1, argv.end()));
  throw Error(str("unknown action ", quote(argv[0]), " (expected prepare; see forge data --help)"));
}

}  // namespace forge::cli
