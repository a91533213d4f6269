// The files of a Hugging Face model directory that sit beside the weights and config.json and
// that Forge carries from one directory to another unchanged: the tokenizer's files and
// generation_config.json. They are held in memory as name -> bytes (a FileSet): read once when a
// run starts, written into every model it saves, so a source that disappears mid-run (or a
// broken one, which is read before anything is written) cannot cost a save.
//
//   tokenizer.json           the tokenizer (`tokenizers`' format; Forge's reader, forge generate)
//   tokenizer_config.json    transformers' tokenizer settings, chat_template among them
//   special_tokens_map.json  bos/eos/pad/unk names (transformers 4 writes it)
//   chat_template.jinja      the chat template, where transformers 5 writes it
//   generation_config.json   generation defaults (generate/generation_config.h)
#pragma once

#include <map>
#include <span>
#include <string>

namespace forge::io {

// The tokenizer's files, in the order above. They travel together: a run takes all of them
// from one source, never some from one directory and some from another.
inline constexpr const char* kTokenizerFiles[] = {"tokenizer.json", "tokenizer_config.json",
                                                  "special_tokens_map.json", "chat_template.jinja"};
inline constexpr const char* kGenerationConfigFile = "generation_config.json";

// File name inside a directory -> the file's bytes.
using FileSet = std::map<std::string, std::string>;

// The whole file; throws forge::Error "PATH: cannot open" / "PATH: read failed".
std::string read_file(const std::string& path);

// Those of `names` that are regular files in `dir`, read whole.
FileSet read_files(const std::string& dir, std::span<const char* const> names);

// Writes each file into `dir` (which must exist) atomically (atomic_file.h).
void write_files(const std::string& dir, const FileSet& files);

}  // namespace forge::io
