// Byte-level BPE training: the minbpe algorithm (repeatedly merge the most frequent adjacent pair
// of tokens) run on pre-tokenized chunk counts with incremental pair-count updates, as Hugging
// Face tokenizers does it, instead of minbpe's full recount per merge.
//
// Ids: 0..255 are the bytes (id b = byte b); merge k creates id 256 + k; special tokens come
// after the merges. vocab_size counts all three.
//
// Which pair wins: the highest count (summed over chunks, weighted by each chunk's count; a run
// "aaa" holds the pair (a, a) twice), then the lexicographically smallest (left id, right id).
// Hugging Face tokenizers breaks ties the same way on its own ids; minbpe instead takes the pair
// it saw first. The result depends only on the chunk counts — never on the thread count or on
// the order in which chunks arrive.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "forge/tokenizer/pretokenizer.h"
#include "forge/tokenizer/tokenizer.h"

namespace forge::tok {

// What a long training run reports now and then (every ~1% of the work).
struct BpeProgress {
  const char* stage;  // "pre-tokenize" (done/total in bytes) or "merge" (done/total merges)
  int64_t done;
  int64_t total;
  double seconds;  // since the stage started
};
using BpeProgressFn = std::function<void(const BpeProgress&)>;

// Merges in order ((left, right) → 256 + k) and the bytes of every token id they define.
struct BpeResult {
  std::vector<std::pair<int32_t, int32_t>> merges;
  std::vector<std::string> vocab;  // 256 + merges.size() entries
};

// Learns up to num_merges merges from pre-token chunks and their counts (a chunk may appear more
// than once: the counts add up). Stops early when no chunk has two tokens left. Throws
// forge::Error on a negative count or num_merges.
BpeResult train_bpe_from_counts(const std::vector<std::pair<std::string, int64_t>>& chunk_counts,
                                int num_merges, const BpeProgressFn& progress = nullptr);

struct BpeTrainOptions {
  int vocab_size = 8192;                                  // bytes + merges + specials
  SplitPattern pattern = SplitPattern::kGpt2;             // pre-tokenizer regex
  std::vector<std::string> specials = {"<|endoftext|>"};  // get the last ids, in this order
  int threads = 0;                                        // pre-tokenization threads; 0: all cores
  BpeProgressFn progress;                                 // optional
};

// Every distinct pre-token chunk of the texts with its count, sorted by chunk bytes. Special
// tokens are cut out of the texts first (as encode() does) and not counted. Texts are cut into
// blocks where the pattern cuts anyway and the blocks are split in parallel, so the counts are
// those of splitting each text whole. kNone: each text (between specials) is one chunk.
std::vector<std::pair<std::string, int64_t>> count_chunks(
    const std::vector<std::string_view>& texts, SplitPattern pattern,
    const std::vector<std::string>& specials, int threads, const BpeProgressFn& progress = nullptr);

// Trains on in-memory texts (each one a document) or on files (each file read whole; throws
// forge::Error naming a file that cannot be read). Throws forge::Error when vocab_size leaves no
// room for the bytes and specials; logs a warning when the corpus allows fewer merges. The
// Tokenizer carries the merges, the specials and the pattern; save it with save_json().
Tokenizer train_bpe(const std::vector<std::string>& texts, const BpeTrainOptions& options);
Tokenizer train_bpe_files(const std::vector<std::string>& paths, const BpeTrainOptions& options);

}  // namespace forge::tok
