#include "forge/data/sft_data.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <numeric>

#include "forge/chat/sft_example.h"
#include "forge/core/error.h"
#include "forge/core/rng.h"

namespace forge {

namespace {

// Words of the stream each shuffle may use: the split takes block 0, epoch e block e + 1. A
// Fisher-Yates shuffle of n items draws 2 words per item (Rng::below), so 2^40 words cover
// any file that fits in memory.
constexpr uint64_t kShuffleBlock = uint64_t{1} << 40;

// A uniformly random permutation of [0, n) from the stream's block `block`.
std::vector<int64_t> permutation(int64_t n, uint64_t seed, uint64_t block,
                                 uint32_t stream = SftData::kSftStream) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), int64_t{0});
  Rng rng(seed, stream);
  rng.set_offset(block * kShuffleBlock);
  for (int64_t i = n - 1; i > 0; --i)
    std::swap(p[static_cast<size_t>(i)],
              p[static_cast<size_t>(rng.below(static_cast<uint64_t>(i) + 1))]);
  return p;
}

int64_t count_trained(const SftRow& r) {
  return std::count(r.trained.begin(), r.trained.end(), uint8_t{1});
}

// Trained tokens that are targets: all but a trained first token, which nothing predicts.
int64_t count_targets(const SftRow& r) {
  return r.trained.empty() ? 0 : count_trained(r) - r.trained[0];
}

}  // namespace

std::string SftSummary::describe() const {
  std::string s = str(examples, " examples: ", train, " train, ", val, " validation");
  if (truncated) s += str(", ", truncated, " truncated to the sequence length");
  if (skipped_long) s += str(", ", skipped_long, " skipped as too long");
  if (skipped_untrained) s += str(", ", skipped_untrained, " skipped with no assistant tokens");
  char share[32];
  std::snprintf(share, sizeof(share), "%.1f%%", tokens ? 100.0 * trained / tokens : 0.0);
  s += str(" | ", tokens, " tokens, ", trained, " trained (", share, ")");
  if (pack_rows > 0) {
    // Input tokens per row slot: packed, and padded (one row per train example).
    char eff[96];
    std::snprintf(eff, sizeof(eff), "packing efficiency %.1f%% (padded %.1f%%)",
                  100.0 * pack_tokens / (static_cast<double>(pack_rows) * seq_len),
                  100.0 * pack_tokens / (static_cast<double>(train) * seq_len));
    s += str(" | packed: an epoch fills ", pack_rows, " rows of ", seq_len, " for ", train,
             " examples, ", eff);
  }
  return s;
}

SftData::SftData(std::vector<SftRow> rows, const SftSettings& s, SftSummary summary)
    : summary_(summary), T_(s.seq_len), seed_(s.seed), pack_(s.pack) {
  if (s.seq_len < 1) throw Error(str("SFT sequence length must be >= 1, got ", s.seq_len));
  if (!(s.val_frac >= 0 && s.val_frac <= 0.5))
    throw Error(str("sft_val_frac must be in [0, 0.5], got ", s.val_frac));
  const size_t cap = static_cast<size_t>(T_) + 1;
  std::vector<SftRow> kept;
  for (SftRow& r : rows) {
    FORGE_CHECK(r.ids.size() == r.trained.size(), "SftRow: ids and trained differ in length");
    if (count_targets(r) == 0) {
      ++summary_.skipped_untrained;
      continue;
    }
    if (r.ids.size() > cap) {
      if (!s.truncate) {
        ++summary_.skipped_long;
        continue;
      }
      r.ids.resize(cap);
      r.trained.resize(cap);
      if (count_targets(r) == 0) {
        ++summary_.skipped_long;
        continue;
      }
      ++summary_.truncated;
    }
    kept.push_back(std::move(r));
  }
  if (kept.empty())
    throw Error("no SFT example left to train on (" + summary_.describe() + ")");
  const int64_t n = static_cast<int64_t>(kept.size());
  int64_t n_val = static_cast<int64_t>(std::llround(s.val_frac * static_cast<double>(n)));
  if (s.val_frac > 0 && n >= 2) n_val = std::max<int64_t>(n_val, 1);
  n_val = std::min(n_val, n - 1);
  const std::vector<int64_t> split = permutation(n, seed_, 0);
  for (int64_t i = 0; i < n; ++i)
    (i < n_val ? val_ : train_).push_back(std::move(kept[static_cast<size_t>(split[i])]));
  summary_.train = train_count();
  summary_.val = val_count();
  summary_.tokens = summary_.trained = 0;
  for (const auto* part : {&train_, &val_})
    for (const SftRow& r : *part) {
      summary_.tokens += static_cast<int64_t>(r.ids.size());
      summary_.trained += count_targets(r);
    }
  if (summary_.examples == 0)
    summary_.examples = static_cast<int64_t>(rows.size());
  if (pack_ && !train_.empty()) {  // epoch 0's packed rows
    summary_.seq_len = T_;
    for (uint64_t p = 0; p < train_.size(); ++summary_.pack_rows) pack_row(p, nullptr, nullptr, nullptr, nullptr);
    summary_.pack_tokens = input_tokens(0, train_.size());
  }
}

SftData SftData::load(const std::string& jsonl, const chat::ChatTemplate& tmpl,
                      const tok::Tokenizer& tok, int64_t vocab_size, const SftSettings& s) {
  std::ifstream f(jsonl, std::ios::binary);
  if (!f) throw Error(str(jsonl, ": no such file or not readable"));
  std::vector<SftRow> rows;
  SftSummary summary;
  std::string line;
  for (int64_t n = 1; std::getline(f, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    const std::string where = str(jsonl, ":", n);
    // Without an assistant turn an example trains nothing: counted and skipped, not an error.
    const chat::SftExample ex = chat::parse_sft_line(line, where, /*require_assistant=*/false);
    chat::EncodedChat enc = chat::encode_sft_example(tmpl, tok, ex);
    for (int32_t id : enc.ids)
      if (id < 0 || id >= vocab_size)
        throw Error(str(where, ": token id ", id, " is outside the model's vocabulary of ",
                        vocab_size, " (is the tokenizer the model's?)"));
    rows.push_back({std::move(enc.ids), std::move(enc.trained)});
    ++summary.examples;
  }
  if (f.bad()) throw Error(str(jsonl, ": read failed"));
  if (summary.examples == 0) throw Error(str(jsonl, ": no examples (the file is empty)"));
  return SftData(std::move(rows), s, summary);
}

int64_t SftData::write_row(const SftRow& r, int len, int32_t* x, int32_t* y) {
  const int n = static_cast<int>(r.ids.size());  // <= T + 1
  int64_t count = 0;
  for (int i = 0; i < len; ++i) {
    x[i] = i < n ? r.ids[static_cast<size_t>(i)] : 0;  // pad: any valid id
    const bool trained = i + 1 < n && r.trained[static_cast<size_t>(i) + 1];
    y[i] = trained ? r.ids[static_cast<size_t>(i) + 1] : -1;
    count += trained;
  }
  return count;
}

int64_t SftData::train_index_at(uint64_t p) {
  const uint64_t n = train_.size();
  const int64_t epoch = static_cast<int64_t>(p / n);
  if (epoch != cached_epoch_) {
    order_ = permutation(static_cast<int64_t>(n), seed_, static_cast<uint64_t>(epoch) + 1);
    cached_epoch_ = epoch;
  }
  return order_[static_cast<size_t>(p % n)];
}

const SftData::PackWindow& SftData::pack_window(uint64_t position) {
  const uint64_t n = train_.size(), K = kPackWindow;
  const uint64_t epoch = position / n, w = position % n / K;
  const uint64_t start = epoch * n + w * K;
  if (window_.start == start) return window_;
  const size_t len = static_cast<size_t>(std::min(K, n - w * K));
  std::vector<int> m(len);
  for (size_t i = 0; i < len; ++i)
    m[i] = std::min(static_cast<int>(train_[static_cast<size_t>(train_index_at(start + i))].ids.size()), T_);
  std::vector<uint32_t> by_length(len);
  std::iota(by_length.begin(), by_length.end(), 0u);
  std::stable_sort(by_length.begin(), by_length.end(), [&](uint32_t a, uint32_t b) { return m[a] > m[b]; });
  std::vector<std::vector<uint32_t>> rows;
  std::vector<int> room;
  for (uint32_t i : by_length) {  // first fit
    size_t r = 0;
    while (r < rows.size() && room[r] < m[i]) ++r;
    if (r == rows.size()) rows.emplace_back(), room.push_back(T_);
    rows[r].push_back(i);
    room[r] -= m[i];
  }
  const uint64_t windows_per_epoch = (n + K - 1) / K;
  const std::vector<int64_t> order =
      permutation(static_cast<int64_t>(rows.size()), seed_, epoch * windows_per_epoch + w, kPackStream);
  window_.start = start;
  window_.rows.clear();
  window_.begins.clear();
  uint64_t begin = 0;
  for (int64_t r : order) {
    std::vector<uint32_t>& row = rows[static_cast<size_t>(r)];
    std::sort(row.begin(), row.end());
    window_.begins.push_back(begin);
    begin += row.size();
    window_.rows.push_back(std::move(row));
  }
  return window_;
}

int64_t SftData::pack_row(uint64_t& position, int32_t* x, int32_t* y, int32_t* pos, int32_t* seg) {
  const PackWindow& w = pack_window(position);
  const auto it = std::lower_bound(w.begins.begin(), w.begins.end(), position - w.start);
  if (it == w.begins.end() || *it != position - w.start)
    throw Error(str("SFT data position ", position,
                    " is not where a packed row starts (a checkpoint of another packing or data file?)"));
  const std::vector<uint32_t>& row = w.rows[static_cast<size_t>(it - w.begins.begin())];
  int used = 0, s = 0;
  int64_t count = 0;
  for (uint32_t off : row) {
    const SftRow& r = train_[static_cast<size_t>(train_index_at(w.start + off))];
    const int m = std::min(static_cast<int>(r.ids.size()), T_);
    if (x != nullptr) {
      count += write_row(r, m, x + used, y + used);
      for (int i = 0; i < m; ++i) {
        pos[used + i] = i;
        seg[used + i] = s;
      }
    }
    used += m;
    ++s;
  }
  position += row.size();
  if (x != nullptr)
    for (int i = used; i < T_; ++i) {  // padding: a segment of its own
      x[i] = 0;
      y[i] = -1;
      pos[i] = i - used;
      seg[i] = s;
    }
  return count;
}

int64_t SftData::steps_for_epochs(int64_t epochs, int64_t rows) {
  FORGE_CHECK(epochs >= 0 && rows > 0, "steps_for_epochs(", epochs, ", ", rows, ")");
  const uint64_t end = static_cast<uint64_t>(epochs) * train_.size();
  if (!pack_) return static_cast<int64_t>((end + rows - 1) / rows);
  int64_t steps = 0;
  for (uint64_t p = 0; p < end; ++steps)
    for (int64_t r = 0; r < rows; ++r) pack_row(p, nullptr, nullptr, nullptr, nullptr);
  return steps;
}

int64_t SftData::input_tokens(uint64_t from, uint64_t to) {
  int64_t n = 0;
  for (uint64_t p = from; p < to; ++p)
    n += std::min(static_cast<int64_t>(train_[static_cast<size_t>(train_index_at(p))].ids.size()),
                  static_cast<int64_t>(T_));
  return n;
}

int64_t SftData::next_batch(uint64_t& position, int B, int32_t* inputs, int32_t* targets,
                            int32_t* pos, int32_t* seg) {
  int64_t count = 0;
  if (pack_) {
    FORGE_CHECK(pos != nullptr && seg != nullptr, "SftData::next_batch: packed rows need pos and seg");
    for (int b = 0; b < B; ++b) {
      const size_t at = static_cast<size_t>(b) * T_;
      count += pack_row(position, inputs + at, targets + at, pos + at, seg + at);
    }
    return count;
  }
  for (int b = 0; b < B; ++b) {
    const SftRow& r = train_[static_cast<size_t>(train_index_at(position++))];
    count += write_row(r, T_, inputs + static_cast<size_t>(b) * T_,
                       targets + static_cast<size_t>(b) * T_);
  }
  return count;
}

int64_t SftData::val_row(int64_t i, int32_t* inputs, int32_t* targets) const {
  FORGE_CHECK(i >= 0 && i < val_count(), "val_row ", i, " of ", val_count());
  return write_row(val_[static_cast<size_t>(i)], T_, inputs, targets);
}

}  // namespace forge
