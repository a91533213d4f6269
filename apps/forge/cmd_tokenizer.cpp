// forge tokenizer train|encode|decode: train a byte-level BPE tokenizer on text files, and turn
// text into ids and back with any tokenizer Forge loads.
//
// Decisions: `train` refuses to overwrite an existing --out unless --force (a tokenizer is what
// every shard made with it depends on); progress goes to stderr, results to stdout. `encode`
// prints ids separated by spaces (or {"ids": [...]} with --json); `decode` reads ids separated by
// spaces, commas or newlines, or that JSON object, and writes the bytes exactly, without adding a
// newline, so `encode | decode` gives back the input.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "args.h"
#include "commands.h"
#include "forge/core/error.h"
#include "forge/core/timer.h"
#include "forge/tokenizer/tokenizer.h"
#include "forge/tokenizer/trainer.h"

namespace forge::cli {

namespace {

const Command kTrainCmd = {
    "tokenizer train",
    "train a byte-level BPE tokenizer on text files",
    {{"input", "FILE", "training text (each file read whole)", true},
     {"vocab-size", "N", "tokens in all: 256 bytes + merges + specials"},
     {"out", "FILE", "tokenizer.json to write (Hugging Face format)"},
     {"pattern", "NAME", "pre-tokenizer: gpt2 (default), gpt4 or none"},
     {"special", "TOKEN", "special tokens, given the last ids (default <|endoftext|>)", true},
     {"no-specials", "", "no special tokens at all"},
     {"threads", "N", "pre-tokenization threads (default: all cores)"},
     {"force", "", "overwrite --out if it exists"}},
    false,
    "",
    "Merges: the most frequent adjacent pair, ties to the smallest (left id, right id). The\n"
    "result does not depend on --threads. Special tokens in the input are not learned from."};

const Command kEncodeCmd = {
    "tokenizer encode",
    "text to token ids",
    {{"tokenizer", "PATH",
      "tokenizer.json, or a directory with tokenizer.json or encoder.json + vocab.bpe"},
     {"input", "FILE", "text to encode (default: standard input)"},
     {"json", "", "print {\"ids\": [...]} instead of ids separated by spaces"}},
    false,
    "",
    "Special tokens written in the text (e.g. <|endoftext|>) become their ids."};

const Command kDecodeCmd = {
    "tokenizer decode",
    "token ids to text",
    {{"tokenizer", "PATH",
      "tokenizer.json, or a directory with tokenizer.json or encoder.json + vocab.bpe"},
     {"ids", "LIST", "ids separated by commas: 1,2,3"},
     {"input", "FILE", "ids separated by spaces, commas or newlines, or {\"ids\": [...]}"}},
    false,
    "",
    "Without --ids or --input the ids are read from standard input. The text is written as it\n"
    "decodes, with no newline added."};

std::string read_input(const Args& a) {
  if (!a.has("input")) {
    std::ostringstream s;
    s << std::cin.rdbuf();
    return s.str();
  }
  const std::string path = a.get("input");
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(str(path, ": no such file or not readable"));
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Ids from "1 2 3", "1,2,3\n" or {"ids": [1, 2, 3]}.
std::vector<int32_t> parse_ids(const std::string& text, const std::string& where) {
  std::vector<int32_t> ids;
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '{') {
    try {
      const nlohmann::json j = nlohmann::json::parse(text);
      for (const auto& v : j.at("ids")) ids.push_back(v.get<int32_t>());
    } catch (const nlohmann::json::exception& e) {
      throw Error(str(where, ": expected {\"ids\": [...]}: ", e.what()));
    }
    return ids;
  }
  std::string list = text;
  for (char& c : list)
    if (c == ' ' || c == '\t' || c == '\r' || c == '\n') c = ',';
  size_t start = 0;
  while (start < list.size()) {
    size_t end = list.find(',', start);
    if (end == std::string::npos) end = list.size();
    if (end > start) {
      const std::string tok = list.substr(start, end - start);
      for (const int id : parse_id_list(tok)) ids.push_back(id);
    }
    start = end + 1;
  }
  return ids;
}

void write_stdout(const std::string& s) {
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fflush(stdout);
}

int train(const Argv& argv) {
  const Args a = parse_args(kTrainCmd, argv);
  if (a.help()) {
    print_help(kTrainCmd);
    return 0;
  }
  const std::vector<std::string> inputs = a.all("input");
  if (inputs.empty()) throw Error("--input is required (one or more text files)");
  const std::string out = a.require("out");
  if (!a.has("vocab-size")) throw Error("--vocab-size is required");
  tok::BpeTrainOptions o;
  o.vocab_size = a.get_int("vocab-size", 0, 1, std::numeric_limits<int>::max());
  o.pattern = tok::parse_split_pattern(a.get("pattern", "gpt2"));
  o.threads = a.get_int("threads", 0, 0, std::numeric_limits<int>::max());  // 0: all cores
  if (a.has("special") && a.has("no-specials"))
    throw Error("--special and --no-specials contradict each other");
  if (a.has("special")) o.specials = a.all("special");
  if (a.has("no-specials")) o.specials.clear();
  if (std::filesystem::exists(out) && !a.has("force"))
    throw Error(str(out, " exists; pass --force to overwrite it"));
  for (const auto& p : inputs)
    if (!std::filesystem::is_regular_file(p)) throw Error(str(p, ": no such file"));

  // Progress: a line every 10% of each stage.
  int last_decile = -1;
  std::string last_stage;
  o.progress = [&](const tok::BpeProgress& p) {
    const int decile = static_cast<int>(10 * p.done / std::max<int64_t>(1, p.total));
    if (p.stage == last_stage && decile == last_decile) return;
    last_stage = p.stage;
    last_decile = decile;
    if (last_stage == "merge")
      std::fprintf(stderr, "  merges %lld/%lld  %.1f s\n", static_cast<long long>(p.done),
                   static_cast<long long>(p.total), p.seconds);
    else
      std::fprintf(stderr, "  pre-tokenize %3d%%  %.1f/%.1f MB  %.1f s\n", 10 * decile,
                   p.done / 1e6, p.total / 1e6, p.seconds);
  };
  const Timer timer;
  const tok::Tokenizer t = tok::train_bpe_files(inputs, o);
  t.save_json(out);
  std::printf("trained %d tokens: 256 bytes, %zu merges, %zu special token(s) in %.2f s -> %s\n",
              t.vocab_size(), t.merges().size(), t.specials().size(), timer.seconds(), out.c_str());
  return 0;
}

int encode(const Argv& argv) {
  const Args a = parse_args(kEncodeCmd, argv);
  if (a.help()) {
    print_help(kEncodeCmd);
    return 0;
  }
  const tok::Tokenizer t = tok::Tokenizer::load(a.require("tokenizer"));
  const std::vector<int32_t> ids = t.encode(read_input(a));
  std::string s;
  if (a.has("json")) {
    s = nlohmann::json{{"ids", ids}}.dump() + "\n";
  } else {
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i > 0) s += ' ';
      s += std::to_string(ids[i]);
    }
    s += "\n";
  }
  write_stdout(s);
  return 0;
}

int decode(const Argv& argv) {
  const Args a = parse_args(kDecodeCmd, argv);
  if (a.help()) {
    print_help(kDecodeCmd);
    return 0;
  }
  if (a.has("ids") && a.has("input")) throw Error("give --ids or --input, not both");
  const tok::Tokenizer t = tok::Tokenizer::load(a.require("tokenizer"));
  std::vector<int32_t> ids;
  if (a.has("ids")) {
    for (const int id : parse_id_list(a.get("ids"))) ids.push_back(id);
  } else {
    ids = parse_ids(read_input(a), a.has("input") ? a.get("input") : "standard input");
  }
  write_stdout(t.decode(ids));
  return 0;
}

void usage() {
  std::printf(
      "forge tokenizer — train a BPE tokenizer, encode and decode\n\n"
      "usage: forge tokenizer train|encode|decode [options]\n\n"
      "  train    train a byte-level BPE tokenizer on text files\n"
      "  encode   text to token ids\n"
      "  decode   token ids to text\n\n"
      "`forge tokenizer <action> --help` describes an action.\n");
}

}  // namespace

int cmd_tokenizer(const Argv& argv) {
  if (argv.empty() || argv[0] == "--help" || argv[0] == "-h") {
    usage();
    return argv.empty() ? 1 : 0;
  }
  const Argv rest(argv.begin() + 1, argv.end());
  if (argv[0] == "train") return train(rest);
  if (argv[0] == "encode") return encode(rest);
  if (argv[0] == "decode") return decode(rest);
  throw Error(str("unknown action '", argv[0],
                  "' (expected train, encode or decode; see forge tokenizer --help)"));
}

}  // namespace forge::cli
