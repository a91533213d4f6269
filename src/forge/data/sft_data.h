// Supervised fine-tuning data: the conversations of a JSONL file (chat/sft_example.h) rendered
// with a model's chat template, encoded with its tokenizer, and cut into training rows.
//
// Padded layout (the default): a row is one example: its first T tokens are the inputs, and
// target i is token i + 1 where that token is trained (an assistant turn's, chat/sft_example.h)
// and -1 (ignored by the loss) elsewhere. Positions after the example hold the pad id with
// target -1; attention is causal, so they change nothing before them.
//
// Packed layout (SftSettings::pack, forge train --pack): a row holds several examples; example
// k occupies m = min(n_k, T) slots with its inputs and targets as in its padded row (so its last
// slot's target is -1 unless it was cut to T + 1 tokens — a target never crosses into the next
// example), and is never split. Placement: the epoch's order (below) is cut into windows of
// kPackWindow consecutive examples (an epoch's last window may be shorter; none crosses an
// epoch's end), and each window is packed first-fit decreasing: its examples, longest first
// (ties in order), each go to the first row with room, or open a new one. A row lists its
// examples in the window's order; the window's rows come out in a seeded shuffled order
// (stream kPackStream, one block per window: no run of long-example rows). Placing whole
// examples in order, one row after the other, filled 84.6% of the rows of 2,048 tokens with
// examples of 64 to 1,024 (forge bench train --sft); the window's first-fit decreasing fills
// them almost whole (SftPackTest.WindowedFirstFitFillsRowsFarBetterThanInOrderPlacement).
// Each slot also gets a position (restarting at 0 per example) and a segment id (0, 1, ... per
// example in the row), which the model uses for RoPE / learned positions and to keep attention
// inside each example (model/transformer.h's TokenLayout). Padding only at the row's end: pad
// id, target -1, a segment of its own. A row consumes its examples, and its window's rows are
// emitted in a fixed order, so the data state is still the number of examples consumed: a
// position always falls where a row of its window starts. Validation rows stay padded (one
// example each: the same loss either way). The summary reports the packing efficiency: input
// tokens / (rows · T) of epoch 0, beside the padded layout's.
//
// What happens to every example is counted (SftSummary) and printed by the trainer, never
// silent: longer than T + 1 tokens, it is cut to its first T + 1 (overlong = truncate; skipped
// when no trained token is left in them) or skipped (overlong = skip); with no trained token
// (no assistant turn) it is skipped. A line that is not a valid example stops the load with
// "FILE:LINE: problem".
//
// Train / validation split: a seeded shuffle of the kept examples, the first
// round(val_frac · kept) of it held out (at least one when val_frac > 0 and two or more are kept).
// Training order: epoch e visits the train examples in a permutation drawn from (seed, stream
// kSftStream, e), so a run's whole data state is the number of examples consumed (position()),
// which a checkpoint records and a resumed run restores.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "forge/chat/chat_template.h"
#include "forge/tokenizer/tokenizer.h"

namespace forge {

struct SftSettings {
  int seq_len = 0;          // T (> 0): a row holds up to T + 1 tokens
  double val_frac = 0.05;   // held-out fraction of the kept examples, in [0, 0.5]
  bool truncate = true;     // overlong examples: cut (true) or skip
  uint64_t seed = 0;        // split and epoch order
  bool pack = false;        // several examples per row (the packed layout above)
};

struct SftSummary {
  int64_t examples = 0;       // non-blank lines of the file
  int64_t train = 0, val = 0;
  int64_t truncated = 0;      // cut to T + 1 tokens (and kept)
  int64_t skipped_long = 0;   // overlong and skipped (overlong = skip, or nothing trained left)
  int64_t skipped_untrained = 0;  // no assistant tokens at all
  int64_t tokens = 0;         // tokens of the kept examples (after cutting)
  int64_t trained = 0;        // of which trained
  // Packed layout: epoch 0's train examples fill pack_rows rows of T holding pack_tokens input
  // tokens (padded: one row per train example, the same tokens). 0 when not packing.
  int seq_len = 0;
  int64_t pack_rows = 0, pack_tokens = 0;
  std::string describe() const;  // one line for the run's log
};

// One example's tokens and which of them are trained (both the same length, <= T + 1).
struct SftRow {
  std::vector<int32_t> ids;
  std::vector<uint8_t> trained;
};

class SftData {
 public:
  static constexpr uint32_t kSftStream = 2;   // Philox stream of the split and epoch orders
  static constexpr uint32_t kPackStream = 3;  // of the packed windows' row orders
  static constexpr int kPackWindow = 512;     // examples a packed placement looks at together

  // Reads and encodes `jsonl` with the tokenizer `tok` and chat template `tmpl`. Throws
  // forge::Error for an unreadable file, a bad line (FILE:LINE), a template error, an id the
  // model's vocabulary does not hold (vocab_size), or no example left to train on.
  static SftData load(const std::string& jsonl, const chat::ChatTemplate& tmpl,
                      const tok::Tokenizer& tok, int64_t vocab_size, const SftSettings& s);
  // From encoded examples (rows longer than T + 1 are cut or skipped as above).
  SftData(std::vector<SftRow> rows, const SftSettings& s, SftSummary summary = {});

  const SftSummary& summary() const { return summary_; }
  int seq_len() const { return T_; }
  int64_t train_count() const { return static_cast<int64_t>(train_.size()); }
  int64_t val_count() const { return static_cast<int64_t>(val_.size()); }

  bool packed() const { return pack_; }
  // The next B train rows in epoch order from `position` (examples consumed so far), written
  // to inputs and targets (B, T); advances position by the examples they hold (B when padded).
  // Packed, pos and seg (B, T) receive the positions and segment ids (required then; unused
  // otherwise). Returns the number of trained targets (not -1) in the batch.
  int64_t next_batch(uint64_t& position, int B, int32_t* inputs, int32_t* targets,
                     int32_t* pos = nullptr, int32_t* seg = nullptr);
  // Optimizer steps of `rows` rows each that `epochs` passes over the train examples take: the
  // batches next_batch() makes from position 0 until epochs · train_count() are consumed.
  int64_t steps_for_epochs(int64_t epochs, int64_t rows);
  // Input tokens (min(n, T) per example) of the examples at positions [from, to).
  int64_t input_tokens(uint64_t from, uint64_t to);
  // Validation row i (0 <= i < val_count()): inputs and targets (T); returns its trained count.
  int64_t val_row(int64_t i, int32_t* inputs, int32_t* targets) const;
  // Which train example position p visits (its index among the train rows).
  int64_t train_index_at(uint64_t p);

 private:
  // Writes `len` slots of example r (its inputs and targets, then padding); returns the trained
  // targets.
  static int64_t write_row(const SftRow& r, int len, int32_t* x, int32_t* y);
  // One packed row from `position` (x null: only advances position); returns the trained targets.
  int64_t pack_row(uint64_t& position, int32_t* x, int32_t* y, int32_t* pos, int32_t* seg);

  // The packed window from `start` (len examples): rows of offsets into it, and where each row's
  // examples begin (offset of its first example in consumption order: the sum of the earlier
  // rows' sizes).
  struct PackWindow {
    uint64_t start = UINT64_MAX;
    std::vector<std::vector<uint32_t>> rows;
    std::vector<uint64_t> begins;
  };
  const PackWindow& pack_window(uint64_t position);

  std::vector<SftRow> train_, val_;
  PackWindow window_;  // the last one pack_window() placed
  SftSummary summary_;
  int T_;
  uint64_t seed_;
  bool pack_;
  int64_t cached_epoch_ = -1;  // the permutation of epoch cached_epoch_
  std::vector<int64_t> order_;
};

}  // namespace forge
