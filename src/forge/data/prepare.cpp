// Documents → tokens → shards. Decisions:
//  - Layout as llm.c's data scripts (fineweb.py): the EOT token comes before every document, so
//    every document in a shard is delimited and a shard may start with one. Documents are
//    encoded with encode_ordinary: a literal "<|endoftext|>" inside a text stays text, so a
//    corpus cannot forge document boundaries. Empty documents are skipped.
//  - Split: with k = round(1 / val_fraction), document number g (0-based, over all inputs in
//    order) goes to val when g % k == 1 — so any corpus of two or more documents has a val
//    document, the choice depends on nothing but the order, and a rerun gives the same split.
//  - Invalid UTF-8 is an error naming the file and byte offset (a corpus holding it is usually
//    a mistake: a Latin-1 file, a truncated download); allow_invalid_utf8 tokenizes the bytes
//    as they are, which byte-level BPE can do. JSONL is checked on the raw line, before parsing.
//  - An --out that already holds train_*.bin or val_*.bin is refused: nothing saved is lost and
//    no directory ends up mixing shards of two runs.
//  - The tokenizer travels with the shards: out_dir gets the tokenizer's files as they are
//    (tokenizer.json, or GPT-2's encoder.json + vocab.bpe, and tokenizer_config.json,
//    special_tokens_map.json, chat_template.jinja when they sit beside it), so `forge train
//    --data DIR` can put them into every model it saves. Given encoder.json + vocab.bpe, a
//    tokenizer.json converted from them is written too: that is the file transformers and
//    forge generate read. A file of that name already in out_dir must be identical (a rerun,
//    or the tokenizer living in out_dir itself), else nothing is written: shards beside
//    another tokenizer's files would be decoded wrongly.
//  - Nothing half-done is left behind: shards are written into OUT/.tmp-prepare/ and renamed
//    into OUT only once every one of them is written (the tokenizer's files first, so that an
//    identical rerun finds them as it expects). Any failure — a bad document midway, a full
//    disk, an exception from the progress callback — removes the staging directory, the
//    shards and tokenizer files this run put in OUT, and OUT itself when this run created it
//    and it is empty again, so a rerun starts clean. A run killed outright (SIGKILL, SIGINT)
//    leaves only OUT/.tmp-prepare/, which the next run removes; only a kill in the final
//    milliseconds of renames can leave some of the shards in OUT.
//  - Streaming: documents are read in batches of about batch_bytes (16 MB), encoded in parallel
//    (OpenMP over documents, dynamic schedule since sizes vary), then appended in document order,
//    so the shards are the same for any thread count. With read_ahead (the default) the next
//    batch is read on one more thread meanwhile: reading is serial work, 0.13 s of a 1.42 s
//    one-thread run (42.5 MB of lines, GPT-2's tokenizer; appending 0.06 s), which would cap the
//    speed-up on many cores. Whether hiding it pays on 16 cores is for `forge bench prepare`
//    with and without --no-read-ahead to say; the 2-core machine could not tell.
//    Shards are written as they fill (ShardFileWriter), not held in memory, so memory stays
//    about one batch (two with read_ahead) whatever the corpus or shard size. Measured peak RSS
//    (GPT-2's tokenizer, --format lines, 2 threads): without read-ahead 147 MB for 42.5 MB of
//    input, 172 MB for 425 MB, 185 MB for 850 MB (a slow rise, not investigated further); with
//    it 203, 240 and 242 MB. Holding each shard until it was full, as before,
//    took 959 MB for 425 MB. With --format file a document is a whole file, so the largest
//    input file is held too.
#include "forge/data/prepare.h"

#include <omp.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <nlohmann/json.hpp>

#include "forge/core/error.h"
#include "forge/core/timer.h"
#include "forge/data/shard.h"
#include "forge/io/atomic_file.h"
#include "forge/io/model_files.h"

namespace forge {

namespace fs = std::filesystem;

namespace {

// One document as read: its raw bytes and where they came from (for error messages).
struct RawDoc {
  std::string text;  // the file, the line, or the JSONL line before parsing
  int file;
  int64_t line;    // 1-based; 0 for whole-file documents
  int64_t offset;  // byte offset of `text` in its file
};

// Reads the inputs as documents, a batch at a time.
class DocReader {
 public:
  explicit DocReader(const PrepareOptions& o) : o_(o) {}

  // Fills `batch` with about batch_bytes of documents; false when the inputs are exhausted.
  bool next(std::vector<RawDoc>& batch, int64_t* bytes) {
    batch.clear();
    size_t size = 0;
    while (size < o_.batch_bytes && file_ < o_.inputs.size()) {
      const std::string& path = o_.inputs[file_];
      if (o_.format == DocFormat::kFile) {
        std::ifstream f(path, std::ios::binary);
        if (!f) throw Error(str(path, ": cannot open"));
        std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
        *bytes += static_cast<int64_t>(text.size());
        size += text.size();
        if (!text.empty()) batch.push_back({std::move(text), static_cast<int>(file_), 0, 0});
        ++file_;
        continue;
      }
      if (!in_.is_open()) {
        in_.open(path, std::ios::binary);
        if (!in_) throw Error(str(path, ": cannot open"));
        line_ = 0;
        offset_ = 0;
      }
      std::string line;
      while (size < o_.batch_bytes && std::getline(in_, line)) {
        ++line_;
        const int64_t at = offset_;
        offset_ += static_cast<int64_t>(line.size()) + 1;
        *bytes += static_cast<int64_t>(line.size()) + 1;
        size += line.size() + 1;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        const bool blank = o_.format == DocFormat::kJsonl
                               ? line.find_first_not_of(" \t") == std::string::npos
                               : line.empty();
        if (blank) continue;
        batch.push_back({std::move(line), static_cast<int>(file_), line_, at});
      }
      if (in_.bad()) throw Error(str(path, ": read failed"));
      if (in_.eof()) {
        in_.close();
        in_.clear();
        ++file_;
      }
    }
    return !batch.empty() || file_ < o_.inputs.size();
  }

 private:
  const PrepareOptions& o_;
  size_t file_ = 0;
  std::ifstream in_;
  int64_t line_ = 0, offset_ = 0;
};

// Appends documents to one split, streaming them into shard files of shard_tokens tokens (the
// last one fewer): a shard is open while it fills and is committed once full, so memory stays
// one ShardFileWriter chunk whatever the shard size.
class ShardWriter {
 public:
  ShardWriter(std::string dir, std::string split, int64_t limit, bool may_be_wide)
      : dir_(std::move(dir)), split_(std::move(split)), limit_(limit), may_be_wide_(may_be_wide) {}

  // ids are encode_ordinary's, never negative: read as uint32 (the same bits).
  void add(uint32_t eot, const std::vector<int32_t>& ids) {
    append(&eot, 1);
    append(reinterpret_cast<const uint32_t*>(ids.data()), ids.size());
    tokens_ += 1 + static_cast<int64_t>(ids.size());
    ++documents_;
  }
  void finish() {
    if (file_) close();
  }
  // The names of the shards written so far, in order.
  const std::vector<std::string>& written() const { return written_; }
  int shards() const { return static_cast<int>(written_.size()); }
  int64_t tokens() const { return tokens_; }
  int64_t documents() const { return documents_; }

 private:
  void append(const uint32_t* p, size_t n) {
    while (n > 0) {
      if (!file_) {
        std::snprintf(name_, sizeof(name_), "%s_%06d.bin", split_.c_str(), shards());
        file_ = std::make_unique<ShardFileWriter>((fs::path(dir_) / name_).string(), may_be_wide_);
      }
      const size_t k = static_cast<size_t>(std::min<int64_t>(
          static_cast<int64_t>(n), limit_ - file_->size()));
      file_->append(p, k);
      p += k;
      n -= k;
      if (file_->size() == limit_) close();
    }
  }
  void close() {
    file_->commit();
    file_.reset();
    written_.push_back(name_);
  }

  std::string dir_, split_;
  int64_t limit_;
  bool may_be_wide_;
  std::unique_ptr<ShardFileWriter> file_;  // the shard filling now, if any
  char name_[32] = {};
  std::vector<std::string> written_;
  int64_t tokens_ = 0, documents_ = 0;
};

// The document's text (the "text" field for JSONL), checked.
std::string document_text(const RawDoc& d, const PrepareOptions& o) {
  const std::string& path = o.inputs[d.file];
  if (!o.allow_invalid_utf8) {
    const int64_t bad = find_invalid_utf8(d.text);
    if (bad >= 0)
      throw Error(str(path, ": invalid UTF-8 at byte ", d.offset + bad,
                      d.line > 0 ? str(" (line ", d.line, ")") : std::string(),
                      "; fix the file or pass --allow-invalid-utf8"));
  }
  if (o.format != DocFormat::kJsonl) return d.text;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(d.text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(str(path, ":", d.line, ": malformed JSON: ", e.what()));
  }
  if (!j.is_object() || !j.contains("text") || !j["text"].is_string())
    throw Error(str(path, ":", d.line, ": expected a JSON object with a \"text\" string"));
  return j["text"].get<std::string>();
}

// Creates `dir` if needed (returns whether it did) and refuses one that holds shards.
bool check_out_dir(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(dir) && !fs::is_directory(dir)) throw Error(str(dir, ": not a directory"));
  const bool created = fs::create_directories(dir, ec);
  if (ec) throw Error(str(dir, ": cannot create (", ec.message(), ")"));
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if ((name.starts_with("train_") || name.starts_with("val_")) && name.ends_with(".bin"))
      throw Error(
          str(dir, " already holds shards (", name, "); remove them or choose another --out"));
  }
  return created;
}

// What a run has put into OUT so far, removed again when it fails (see the notes above).
class PrepareOutput {
 public:
  PrepareOutput(std::string dir, bool created_dir)
      : dir_(std::move(dir)),
        staging_((fs::path(dir_) / ".tmp-prepare").string()),
        created_dir_(created_dir) {
    std::error_code ec;
    fs::remove_all(staging_, ec);  // a killed run's
    fs::create_directory(staging_, ec);
    if (ec) throw Error(str(staging_, ": cannot create (", ec.message(), ")"));
  }
  PrepareOutput(const PrepareOutput&) = delete;
  PrepareOutput& operator=(const PrepareOutput&) = delete;
  ~PrepareOutput() {
    std::error_code ec;
    fs::remove_all(staging_, ec);
    if (done_) return;
    for (const std::string& p : placed_) fs::remove(p, ec);
    if (created_dir_ && fs::is_empty(dir_, ec)) fs::remove(dir_, ec);
  }

  const std::string& staging() const { return staging_; }
  // Writes the files into OUT, each recorded for removal should the run fail.
  void write_files(const io::FileSet& files) {
    for (const auto& [name, bytes] : files) {
      const std::string path = (fs::path(dir_) / name).string();
      placed_.push_back(path);  // before the write: a failed one leaves nothing, removal is moot
      io::write_file_atomic(path, bytes);
    }
  }
  // Moves the staged shards (names) into OUT.
  void place(const std::vector<std::string>& names) {
    for (const std::string& name : names) {
      const std::string to = (fs::path(dir_) / name).string();
      std::error_code ec;
      fs::rename(fs::path(staging_) / name, to, ec);
      if (ec) throw Error(str(to, ": cannot move the finished shard into place: ", ec.message()));
      placed_.push_back(to);
    }
  }
  // Everything is in place: keep it.
  void commit() {
    io::fsync_dir(dir_);
    done_ = true;
  }

 private:
  std::string dir_, staging_;
  bool created_dir_;
  std::vector<std::string> placed_;
  bool done_ = false;
};

// The tokenizer files out_dir should hold for the tokenizer at `path` (see the notes above),
// name -> bytes. `tokenizer` is what was loaded from `path`; the conversion of GPT-2's files
// goes through a scratch file in scratch_dir (Tokenizer::save_json writes only files).
io::FileSet tokenizer_files(const tok::Tokenizer& tokenizer, const std::string& path,
                            const std::string& scratch_dir) {
  io::FileSet files;
  std::error_code ec;
  fs::path dir = path;
  if (fs::is_regular_file(path, ec)) {
    files["tokenizer.json"] = io::read_file(path);
    dir = fs::path(path).parent_path();
    if (dir.empty()) dir = ".";
  } else if (fs::is_regular_file(dir / "tokenizer.json", ec)) {
    files["tokenizer.json"] = io::read_file((dir / "tokenizer.json").string());
  } else {  // encoder.json + vocab.bpe (Tokenizer::load accepted the directory)
    for (const char* name : {"encoder.json", "vocab.bpe"})
      files[name] = io::read_file((dir / name).string());
    const std::string scratch = (fs::path(scratch_dir) / ".tmp-tokenizer.json").string();
    tokenizer.save_json(scratch);
    files["tokenizer.json"] = io::read_file(scratch);
    fs::remove(scratch, ec);
  }
  // The companions: every io::kTokenizerFiles name after tokenizer.json.
  for (auto& [name, bytes] :
       io::read_files(dir.string(), std::span(io::kTokenizerFiles).subspan(1)))
    files[name] = std::move(bytes);
  return files;
}

// Refuses an out_dir file of the same name with other bytes; drops identical ones from `files`
// (already there: nothing to write).
void check_tokenizer_files(const std::string& out_dir, io::FileSet& files) {
  for (auto it = files.begin(); it != files.end();) {
    const std::string dest = (fs::path(out_dir) / it->first).string();
    std::error_code ec;
    if (!fs::exists(dest, ec)) {
      ++it;
      continue;
    }
    if (!fs::is_regular_file(dest, ec) || io::read_file(dest) != it->second)
      throw Error(str(dest, " exists and differs from the tokenizer's ", it->first,
                      "; remove it or choose another --out"));
    it = files.erase(it);
  }
}

}  // namespace

DocFormat parse_doc_format(const std::string& name) {
  if (name == "file") return DocFormat::kFile;
  if (name == "lines") return DocFormat::kLines;
  if (name == "jsonl") return DocFormat::kJsonl;
  throw Error(str("unknown document format '", name, "' (expected file, lines or jsonl)"));
}

int64_t find_invalid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    if (i + 8 <= n) {  // eight ASCII bytes at a time: most text is ASCII
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      if ((w & 0x8080808080808080ull) == 0) {
        i += 8;
        continue;
      }
    }
    const unsigned c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF)
      len = 2, cp = c & 0x1F;
    else if (c >= 0xE0 && c <= 0xEF)
      len = 3, cp = c & 0x0F;
    else if (c >= 0xF0 && c <= 0xF4)
      len = 4, cp = c & 0x07;
    else
      return static_cast<int64_t>(i);
    if (i + len > n) return static_cast<int64_t>(i);
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return static_cast<int64_t>(i);
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    if (len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) return static_cast<int64_t>(i);
    if (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) return static_cast<int64_t>(i);
    i += len;
  }
  return -1;
}

PrepareStats prepare_data(const tok::Tokenizer& tokenizer, const PrepareOptions& o) {
  const Timer timer;
  if (o.inputs.empty()) throw Error("no input files");
  if (!(o.val_fraction >= 0 && o.val_fraction <= 0.5))
    throw Error(str("val fraction ", o.val_fraction, " must be in [0, 0.5]"));
  if (o.shard_tokens < 1) throw Error(str("shard size ", o.shard_tokens, " must be positive"));
  if (o.batch_bytes < 1) throw Error("batch size must be positive");
  const auto eot = tokenizer.special_id(o.eot);
  if (!eot)
    throw Error(str("the tokenizer has no special token '", o.eot,
                    "' to put between documents (name one it has with --eot)"));
  PrepareStats stats;
  for (const auto& p : o.inputs) {
    std::error_code ec;
    if (!fs::is_regular_file(p, ec)) throw Error(str(p, ": no such file"));
    stats.bytes += static_cast<int64_t>(fs::file_size(p, ec));
  }
  PrepareOutput output(o.out_dir, check_out_dir(o.out_dir));
  io::FileSet tok_files;
  if (!o.tokenizer_path.empty()) {
    tok_files = tokenizer_files(tokenizer, o.tokenizer_path, output.staging());
    for (const auto& [name, bytes] : tok_files) stats.tokenizer_files.push_back(name);
    check_tokenizer_files(o.out_dir, tok_files);
  }

  const int64_t k = o.val_fraction > 0 ? std::max<int64_t>(2, std::llround(1 / o.val_fraction)) : 0;
  const int threads = o.threads > 0 ? o.threads : omp_get_max_threads();
  // Ids are below vocab_size: with at most 65,536 every shard is uint16 and streams as such.
  const bool may_be_wide = tokenizer.vocab_size() > 65536;
  ShardWriter train(output.staging(), "train", o.shard_tokens, may_be_wide),
      val(output.staging(), "val", o.shard_tokens, may_be_wide);
  DocReader reader(o);
  std::vector<RawDoc> batch, next;
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::string> errors;
  int64_t bytes_read = 0;
  bool more = reader.next(batch, &bytes_read);
  while (more) {
    const int64_t bytes_done = bytes_read;  // through this batch
    // The next batch is read on another thread while this one is encoded and appended. The
    // future's destructor waits for it, so an exception below leaves no reader running.
    std::future<bool> ahead;
    if (o.read_ahead)
      ahead = std::async(std::launch::async, [&] { return reader.next(next, &bytes_read); });
    const int64_t n = static_cast<int64_t>(batch.size());
    tokens.assign(n, {});
    errors.assign(n, {});
    // Exceptions must not leave an OpenMP region: keep each document's message, throw the first.
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (int64_t i = 0; i < n; ++i) {
      try {
        tokens[i] = tokenizer.encode_ordinary(document_text(batch[i], o));
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    }
    for (int64_t i = 0; i < n; ++i) {
      if (!errors[i].empty()) throw Error(errors[i]);
      if (tokens[i].empty()) continue;  // a JSONL record with "text": ""
      const int64_t g = stats.documents++;
      (k > 0 && g % k == 1 ? val : train).add(static_cast<uint32_t>(*eot), tokens[i]);
    }
    if (o.progress)
      o.progress({bytes_done, stats.bytes, stats.documents, train.tokens() + val.tokens(),
                  timer.seconds()});
    // A read error surfaces here, after this batch, either way.
    if (o.read_ahead) {
      more = ahead.get();
      batch.swap(next);
    } else {
      more = reader.next(batch, &bytes_read);  // one batch in memory at a time
    }
  }
  if (stats.documents == 0) throw Error("the inputs hold no documents");
  train.finish();
  val.finish();
  output.write_files(tok_files);
  output.place(train.written());
  output.place(val.written());
  output.commit();
  stats.train_documents = train.documents();
  stats.val_documents = val.documents();
  stats.train_tokens = train.tokens();
  stats.val_tokens = val.tokens();
  stats.train_shards = train.shards();
  stats.val_shards = val.shards();
  stats.seconds = timer.seconds();
  return stats;
}

}  // namespace forge
