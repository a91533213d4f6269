// Data preparation: text documents → token ids → train_NNNNNN.bin / val_NNNNNN.bin shards in
// llm.c's format (what `forge data prepare` does). See prepare.cpp for the decisions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "forge/tokenizer/tokenizer.h"

namespace forge {

enum class DocFormat {
  kFile,   // each input file is one document
  kLines,  // each non-empty line is one document (the newline, and a \r before it, dropped)
  kJsonl,  // each non-empty line is a JSON object; its "text" string is the document
};
// "file" | "lines" | "jsonl"; throws forge::Error naming a bad value.
DocFormat parse_doc_format(const std::string& name);

struct PrepareProgress {
  int64_t bytes_done;   // input bytes read and tokenized so far
  int64_t bytes_total;  // sum of the input file sizes
  int64_t documents;
  int64_t tokens;
  double seconds;
};

struct PrepareOptions {
  std::vector<std::string> inputs;  // files, read in this order
  std::string out_dir;              // created if missing; must hold no shards yet
  DocFormat format = DocFormat::kFile;
  double val_fraction = 0.005;         // in [0, 0.5]; see prepare.cpp for the rule
  int64_t shard_tokens = 100'000'000;  // tokens per shard, at most
  std::string eot = "<|endoftext|>";   // special token written before every document
  bool allow_invalid_utf8 = false;     // else invalid UTF-8 is an error naming file and offset
  int threads = 0;                     // 0: all cores
  // Documents are read, encoded and appended in batches of about this many input bytes (the
  // next batch is read while one is encoded): memory is about two batches.
  size_t batch_bytes = size_t{16} << 20;
  bool read_ahead = true;  // false: read each batch only after the one before is appended
  // The tokenizer's file or directory, as Tokenizer::load takes it: its files are copied into
  // out_dir beside the shards (prepare.cpp says which). "": none.
  std::string tokenizer_path;
  std::function<void(const PrepareProgress&)> progress;  // called after each batch
};

struct PrepareStats {
  int64_t documents = 0, train_documents = 0, val_documents = 0;
  int64_t train_tokens = 0, val_tokens = 0;
  int train_shards = 0, val_shards = 0;
  int64_t bytes = 0;                         // input bytes
  std::vector<std::string> tokenizer_files;  // names of the tokenizer files out_dir now holds
  double seconds = 0;
};

// Tokenizes every document and writes the shards. Throws forge::Error (naming the file, and the
// line or byte offset where it applies) for a missing input, invalid UTF-8, a bad JSONL line, a
// tokenizer without the EOT token, or an --out that already holds shards or a tokenizer file
// that differs from the one it would write. On any failure (those, a write error, any other
// exception) nothing this call wrote is left in out_dir, so the same call can be run again.
PrepareStats prepare_data(const tok::Tokenizer& tokenizer, const PrepareOptions& options);

// Byte offset of the first invalid UTF-8 sequence in s (overlong forms, surrogates and code
// points above U+10FFFF are invalid), or -1 when s is valid.
int64_t find_invalid_utf8(std::string_view s);

}  // namespace forge
