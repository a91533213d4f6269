// BPE: building the tables, encoding and decoding. Files (tokenizer.json, GPT-2's encoder.json +
// vocab.bpe) are read and written in tokenizer_io.cpp; the character-level parts (normalizer,
// Metaspace, byte fallback, decoder chain) live in normalizer.cpp, char_symbols.cpp, decoder.cpp.
//
// Design decisions:
//  - Merge order is "lowest rank first, leftmost among equals", one merge at a time, as tiktoken
//    and Hugging Face `tokenizers` do. (openai/gpt-2's encoder.py merges every occurrence of the
//    best pair in one sweep; the result differs only for merge lists where a merged pair ranks
//    below the merge that made its parts, which no trained vocabulary has.)
//  - Ranks live in an open-addressing table keyed by (left << 32 | right), load factor <= 1/2,
//    16-byte slots: one multiply and usually one cache line per lookup. GPT-2's 50k merges take
//    2 MiB. std::unordered_map was the first version; it costs a pointer chase per probe.
//  - Pieces are short (English averages ~4.5 bytes), so the merge loop rescans the pair ranks
//    of a small array (O(n^2), no allocation). A piece of more than kLongPiece symbols (runs of
//    spaces, digits, one letter repeated; SplitPattern::kNone makes the whole text one piece, and
//    so do Llama 2's files, which have no pre-tokenizer) goes to a linked list + min-heap version
//    instead: O(n log n), so no input is quadratic.
//  - Both kinds share the merge loop: only the first symbols differ (bytes, or characters with
//    byte fallback), and the ranks come from the same table of (left id, right id) pairs.
//  - A per-thread, direct-mapped cache maps recent pieces to their ids: 2^16 slots of one cache
//    line each (piece up to 26 bytes, up to 7 ids, tagged with the tokenizer's unique id), so a
//    frequent word costs one hash and one line, and a collision just replaces the older entry
//    (word frequencies are Zipfian: the hot ones stay). It is thread_local, so threads never lock
//    or share lines, and the owner tag lets tokenizers share it without clearing. Measured on
//    5 MB of fortunes (GPT-2, one thread, CPU time on a busy 2-core machine): ~20-35 MB/s, vs
//    ~13 MB/s with a std::unordered_map<string, ids> cache and 6-7 MB/s for tiktoken.
//  - All scratch buffers are thread_local and reused: steady-state encoding does not allocate
//    except to grow the output.
#include "forge/tokenizer/tokenizer.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>
#include <functional>

#include "forge/core/error.h"
#include "forge/tokenizer/char_symbols.h"

namespace forge::tok {

namespace {

constexpr int32_t kNoRank = INT32_MAX;
constexpr size_t kLongPiece = 256;  // symbols; beyond this the heap version merges
constexpr int kCacheBits = 16;      // 2^16 slots x 64 bytes = 4 MiB per thread

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <typename V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

// (left id, right id) → (rank, merged id), open addressing with linear probing.
class MergeTable {
 public:
  struct Hit {
    int32_t rank = kNoRank;
    int32_t merged = -1;
  };

  void build(const std::vector<std::pair<int32_t, int32_t>>& pairs,
             const std::vector<int32_t>& merged) {
    size_t cap = 16;
    while (cap < 2 * pairs.size()) cap *= 2;
    slots_.assign(cap, Slot{kEmpty, kNoRank, -1});
    mask_ = cap - 1;
    shift_ = 64 - __builtin_ctzll(cap);
    for (size_t r = 0; r < pairs.size(); ++r) {
      const uint64_t key = make_key(pairs[r].first, pairs[r].second);
      size_t h = slot_of(key);
      while (slots_[h].key != kEmpty && slots_[h].key != key) h = (h + 1) & mask_;
      // A repeated merge takes its last rank: `tokenizers` collects the list into a map, and so
      // does openai/gpt-2's encoder.py, later entries overwriting earlier ones.
      slots_[h] = Slot{key, static_cast<int32_t>(r), merged[r]};
    }
  }

  Hit find(int32_t left, int32_t right) const {
    const uint64_t key = make_key(left, right);
    for (size_t h = slot_of(key);; h = (h + 1) & mask_) {
      const Slot& s = slots_[h];
      if (s.key == key) return Hit{s.rank, s.merged};
      if (s.key == kEmpty) return Hit{};
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~0ull;
  struct Slot {
    uint64_t key;
    int32_t rank;
    int32_t merged;
  };
  static uint64_t make_key(int32_t l, int32_t r) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(l)) << 32) | static_cast<uint32_t>(r);
  }
  // Fibonacci hashing: the top bits of key * 2^64/phi.
  size_t slot_of(uint64_t key) const { return (key * 0x9E3779B97F4A7C15ull) >> shift_; }

  std::vector<Slot> slots_;
  size_t mask_ = 0;
  int shift_ = 64;
};

// Thread-local scratch for splitting and merging.
struct EncodeScratch {
  std::vector<std::string_view> pieces, pieces_next;
  std::vector<int32_t> ids, rank, merged;  // first symbols, then the short-piece merge loop
  std::vector<int32_t> prev, next;         // long-piece linked list
  std::string normalized;                  // character-level: the text the pieces view
  struct HeapEntry {
    int32_t rank, pos, right, left_id, right_id, merged;
    // std::push_heap builds a max-heap; invert so the top is the lowest (rank, pos).
    bool operator<(const HeapEntry& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::vector<HeapEntry> heap;
};

EncodeScratch& scratch() {
  thread_local EncodeScratch s;
  return s;
}

// One cache entry, one cache line. owner == 0: empty.
struct alignas(64) CacheSlot {
  uint32_t owner;  // State::uid
  uint32_t tag;    // low 32 bits of the piece's hash
  uint8_t len, n_ids;
  char piece[26];
  int32_t ids[7];
};
static_assert(sizeof(CacheSlot) == 64);

// A 64-bit hash of a short string, 8 bytes at a time (splitmix64's mixer per word).
inline uint64_t hash_piece(std::string_view s) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ s.size();
  auto mix = [&h](uint64_t w) {
    h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
  };
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    mix(w);
  }
  if (i < s.size()) {
    uint64_t w = 0;
    std::memcpy(&w, s.data() + i, s.size() - i);
    mix(w);
  }
  return h * 0x94D049BB133111EBull;
}

CacheSlot* piece_cache() {
  thread_local std::unique_ptr<CacheSlot[]> slots = [] {
    std::unique_ptr<CacheSlot[]> p(new CacheSlot[size_t{1} << kCacheBits]);
    std::memset(static_cast<void*>(p.get()), 0, sizeof(CacheSlot) << kCacheBits);
    return p;
  }();
  return slots.get();
}

// Applies the merges to the symbols in s.ids (lowest rank first, leftmost among equals) and
// appends the result to `out`. s.ids is overwritten.
void merge_symbols(const MergeTable& table, EncodeScratch& s, std::vector<int32_t>& out) {
  const size_t n = s.ids.size();
  if (n <= 1) {
    out.insert(out.end(), s.ids.begin(), s.ids.end());
    return;
  }
  if (n <= kLongPiece) {
    // ids[i] and the rank of the pair (ids[i], ids[i + 1]); merge the lowest, leftmost first.
    auto& ids = s.ids;
    auto& rank = s.rank;
    auto& merged = s.merged;
    rank.resize(n - 1);
    merged.resize(n - 1);
    for (size_t i = 0; i + 1 < n; ++i) {
      const MergeTable::Hit h = table.find(ids[i], ids[i + 1]);
      rank[i] = h.rank;
      merged[i] = h.merged;
    }
    size_t m = n;  // live tokens
    while (m > 1) {
      size_t best = 0;
      for (size_t i = 1; i + 1 < m; ++i)
        if (rank[i] < rank[best]) best = i;
      if (rank[best] == kNoRank) break;
      ids[best] = merged[best];
      // Drop token best + 1 and pair best; the pairs either side of the new token change.
      std::copy(ids.begin() + best + 2, ids.begin() + m, ids.begin() + best + 1);
      std::copy(rank.begin() + best + 1, rank.begin() + m - 1, rank.begin() + best);
      std::copy(merged.begin() + best + 1, merged.begin() + m - 1, merged.begin() + best);
      --m;
      if (best > 0) {
        const MergeTable::Hit h = table.find(ids[best - 1], ids[best]);
        rank[best - 1] = h.rank;
        merged[best - 1] = h.merged;
      }
      if (best + 1 < m) {
        const MergeTable::Hit h = table.find(ids[best], ids[best + 1]);
        rank[best] = h.rank;
        merged[best] = h.merged;
      }
    }
    out.insert(out.end(), ids.begin(), ids.begin() + m);
  } else {
    // Doubly linked list over symbol positions + lazy min-heap of candidate pairs. A heap entry is
    // stale when either end has changed since it was pushed: a node's token only ever grows to
    // the right, so equal ids at equal positions mean an unchanged pair.
    auto& ids = s.ids;
    auto& prev = s.prev;
    auto& next = s.next;
    auto& heap = s.heap;
    prev.resize(n);
    next.resize(n);
    heap.clear();
    for (size_t i = 0; i < n; ++i) {
      prev[i] = static_cast<int32_t>(i) - 1;
      next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
    }
    auto push = [&](int32_t l, int32_t r) {
      if (l < 0 || r < 0) return;
      const MergeTable::Hit h = table.find(ids[l], ids[r]);
      if (h.rank == kNoRank) return;
      heap.push_back({h.rank, l, r, ids[l], ids[r], h.merged});
      std::push_heap(heap.begin(), heap.end());
    };
    // The first pairs all at once: make_heap is O(n), n push_heaps O(n log n).
    for (size_t i = 0; i + 1 < n; ++i) {
      const MergeTable::Hit h = table.find(ids[i], ids[i + 1]);
      if (h.rank != kNoRank)
        heap.push_back({h.rank, static_cast<int32_t>(i), static_cast<int32_t>(i + 1), ids[i],
                        ids[i + 1], h.merged});
    }
    std::make_heap(heap.begin(), heap.end());
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end());
      const EncodeScratch::HeapEntry e = heap.back();
      heap.pop_back();
      if (ids[e.pos] != e.left_id || next[e.pos] != e.right || ids[e.right] != e.right_id) continue;
      ids[e.pos] = e.merged;
      ids[e.right] = -1;
      next[e.pos] = next[e.right];
      if (next[e.pos] >= 0) prev[next[e.pos]] = e.pos;
      push(prev[e.pos], e.pos);
      push(e.pos, next[e.pos]);
    }
    for (int32_t i = 0; i >= 0; i = next[i]) out.push_back(ids[i]);
  }
}

std::atomic<uint32_t> g_next_uid{1};

constexpr std::string_view kMetaSpace = "\xE2\x96\x81";  // U+2581 ▁

// Llama 2's and Mistral's files merge within the whole text (no pre-tokenizer, or Metaspace with
// split false), so a document is one piece: no piece cache, and the heap merge over megabytes.
// Cutting the text before every run of ▁ gives the same ids when no token spans such a cut:
// when no token holds ▁ right after another character ("▁the" and "▁▁▁" may be tokens, "e▁"
// not, as sentencepiece trains at whitespace), ▁ is itself a token (never spelled in bytes or
// fused into an unk), and ignore_merges is off (it looks the whole piece up). Then no merge can
// cross a cut and merges on either side never interact, so BPE on the parts is BPE on the whole.
// `forge tokenizer encode` of 1.9 MB of fortunes with tests/data/.../mistral.json: 0.85 s of CPU
// as one piece, 0.10 s cut (most pieces then hit the cache).
bool cuts_before_spaces_are_exact(const std::vector<std::string>& vocab, bool ignore_merges,
                                  const StringMap<int32_t>& token_id) {
  if (ignore_merges || !token_id.contains(kMetaSpace)) return false;
  for (const std::string& t : vocab)
    for (size_t p = t.find(kMetaSpace, 1); p != std::string::npos; p = t.find(kMetaSpace, p + 1))
      if (p < kMetaSpace.size() ||
          t.compare(p - kMetaSpace.size(), kMetaSpace.size(), kMetaSpace) != 0)
        return false;
  return true;
}

// Appends the parts of `piece` cut before every ▁ that follows another character.
void cut_before_spaces(std::string_view piece, std::vector<std::string_view>& out) {
  size_t begin = 0;
  for (size_t p = piece.find(kMetaSpace, 1); p != std::string_view::npos;
       p = piece.find(kMetaSpace, p + kMetaSpace.size())) {
    if (p >= kMetaSpace.size() &&
        piece.substr(p - kMetaSpace.size(), kMetaSpace.size()) == kMetaSpace)
      continue;
    out.push_back(piece.substr(begin, p - begin));
    begin = p;
  }
  out.push_back(piece.substr(begin));
}

}  // namespace

struct Tokenizer::State {
  uint32_t uid = 0;  // tags this tokenizer's entries in the per-thread piece caches
  std::vector<std::string> split_regexes;
  std::vector<PreTokenizer> splitters;
  bool ignore_merges = false;
  MergeTable merge_table;
  StringMap<int32_t> token_id;  // bytes → id of the regular tokens (first id wins)
  int32_t vocab_size = 0;
  // Decoding: bytes of id i are decode_bytes[decode_begin[i], decode_begin[i + 1]) if known[i].
  std::string decode_bytes;
  std::vector<uint32_t> decode_begin;
  std::vector<uint8_t> known;
  // Special tokens, longest first; special_first[b]: some special token starts with byte b.
  std::vector<SpecialToken> specials_longest_first;
  std::array<bool, 256> special_first{};
  std::vector<uint8_t> special;  // special[id]: id is a special token
  PostProcessor post_processor;
  std::optional<CharLevel> char_level;  // set: a character-level tokenizer
  CharSymbols symbols;                  // character-level: a piece's first symbols
  bool cut_before_spaces = false;       // character-level: see cuts_before_spaces_are_exact
};

const std::array<std::string, 256>& byte_to_unicode() {
  static const std::array<std::string, 256> table = [] {
    // Printable Latin-1 bytes stand for themselves; the other 68 map to U+0100.. in byte order.
    std::array<std::string, 256> t;
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const uint32_t cp = printable ? static_cast<uint32_t>(b) : 256u + n++;
      std::string s;
      if (cp < 0x80) {
        s.push_back(static_cast<char>(cp));
      } else {  // cp < 0x800: two bytes
        s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      }
      t[b] = s;
    }
    return t;
  }();
  return table;
}

Tokenizer Tokenizer::from_bpe(std::vector<std::string> vocab,
                              const std::vector<std::pair<int32_t, int32_t>>& merges,
                              std::vector<SpecialToken> specials, SplitPattern pattern) {
  std::vector<std::string> regexes;
  if (pattern != SplitPattern::kNone) regexes.emplace_back(split_regex(pattern));
  return build(std::move(vocab), merges, std::move(specials), std::move(regexes), false);
}

void check_ids_dense(int64_t id_end, size_t tokens) {
  if (id_end > 2 * static_cast<int64_t>(tokens) + kIdSlack)
    throw Error(str("[tokenizer] token ids reach ", id_end - 1, " but there are only ", tokens,
                    " tokens (a vocabulary's ids are dense)"));
}

Tokenizer Tokenizer::build(std::vector<std::string> vocab,
                           const std::vector<std::pair<int32_t, int32_t>>& merges,
                           std::vector<SpecialToken> specials,
                           std::vector<std::string> split_regexes, bool ignore_merges,
                           PostProcessor post_processor, std::optional<CharLevel> char_level) {
  Tokenizer t;
  auto st = std::make_shared<State>();
  st->uid = g_next_uid.fetch_add(1);
  st->ignore_merges = ignore_merges;

  // Regular tokens. An empty string marks an unused id (a gap in a tokenizer.json vocab).
  t.byte_id_.fill(-1);
  for (size_t id = 0; id < vocab.size(); ++id) {
    const std::string& s = vocab[id];
    if (s.empty()) continue;
    if (s.size() == 1 && t.byte_id_[static_cast<unsigned char>(s[0])] < 0)
      t.byte_id_[static_cast<unsigned char>(s[0])] = static_cast<int32_t>(id);
    st->token_id.emplace(s, static_cast<int32_t>(id));
  }
  for (int b = 0; b < 256 && !char_level; ++b)
    if (t.byte_id_[b] < 0)
      throw Error(str("[tokenizer] byte 0x", "0123456789abcdef"[b >> 4], "0123456789abcdef"[b & 15],
                      " has no single-byte token: a byte-level BPE vocabulary needs all 256"));

  int32_t vocab_size = static_cast<int32_t>(vocab.size());
  for (const SpecialToken& sp : specials) {
    if (sp.id < 0)
      throw Error(str("[tokenizer] special token ", quote(sp.text), " has id ", sp.id));
    if (sp.text.empty()) throw Error(str("[tokenizer] special token ", sp.id, " is empty"));
    vocab_size = std::max(vocab_size, sp.id + 1);
  }
  size_t tokens = specials.size();
  for (const std::string& s : vocab) tokens += !s.empty();
  check_ids_dense(vocab_size, tokens);  // before the tables indexed by id below
  st->vocab_size = vocab_size;

  // Decode table: specials win over a regular token with the same id (GPT-2's encoder.json
  // lists <|endoftext|> as a regular token too; the text is the same). A character-level token
  // is stored as the decoder makes it inside a text (" the" for "▁the").
  std::vector<std::string> decoded;
  if (char_level) {
    decoded.resize(vocab.size());
    for (size_t id = 0; id < vocab.size(); ++id)
      if (!vocab[id].empty()) decoded[id] = char_level->decoder.token_bytes(vocab[id]);
  }
  std::vector<const std::string*> text_of(vocab_size, nullptr);
  for (size_t id = 0; id < vocab.size(); ++id)
    if (!vocab[id].empty()) text_of[id] = char_level ? &decoded[id] : &vocab[id];
  for (const SpecialToken& sp : specials) text_of[sp.id] = &sp.text;
  st->decode_begin.resize(vocab_size + 1);
  st->known.assign(vocab_size, 0);
  for (int32_t id = 0; id < vocab_size; ++id) {
    st->decode_begin[id] = static_cast<uint32_t>(st->decode_bytes.size());
    if (text_of[id] != nullptr) {
      st->decode_bytes += *text_of[id];
      st->known[id] = 1;
    }
  }
  st->decode_begin[vocab_size] = static_cast<uint32_t>(st->decode_bytes.size());

  // Merges: (left, right) must be regular tokens whose concatenation is a regular token.
  std::vector<int32_t> merged(merges.size());
  std::string cat;
  for (size_t r = 0; r < merges.size(); ++r) {
    const auto [a, b] = merges[r];
    for (int32_t id : {a, b})
      if (id < 0 || id >= static_cast<int32_t>(vocab.size()) || vocab[id].empty())
        throw Error(str("[tokenizer] merge ", r, " names token id ", id,
                        ", which is not in the vocabulary (size ", vocab.size(), ")"));
    cat.assign(vocab[a]).append(vocab[b]);
    const auto it = st->token_id.find(cat);
    if (it == st->token_id.end())
      throw Error(str("[tokenizer] merge ", r, " (", a, ", ", b,
                      ") makes a string that is not a token of the vocabulary"));
    merged[r] = it->second;
  }
  st->merge_table.build(merges, merged);

  // Specials: longest first, so that a special that is a prefix of another never shadows it.
  st->specials_longest_first = specials;
  std::stable_sort(
      st->specials_longest_first.begin(), st->specials_longest_first.end(),
      [](const SpecialToken& x, const SpecialToken& y) { return x.text.size() > y.text.size(); });
  st->special.assign(vocab_size, 0);
  for (const SpecialToken& sp : specials) {
    st->special_first[static_cast<unsigned char>(sp.text[0])] = true;
    st->special[sp.id] = 1;
  }
  st->post_processor = std::move(post_processor);

  for (const std::string& re : split_regexes)
    if (!re.empty()) st->splitters.emplace_back(re);
  st->split_regexes = std::move(split_regexes);

  if (char_level) {
    if (!st->splitters.empty())
      throw Error("[tokenizer] a character-level tokenizer takes no split regexes");
    CharSymbols::Options o{char_level->byte_fallback, -1, char_level->fuse_unk};
    if (!char_level->unk_token.empty()) {
      const auto it = st->token_id.find(char_level->unk_token);
      if (it == st->token_id.end())
        throw Error(str("[tokenizer] unk_token ", quote(char_level->unk_token),
                        " is not in the vocabulary"));
      o.unk_id = it->second;
    }
    st->symbols = CharSymbols(vocab, o);
    st->char_level = std::move(char_level);
    st->cut_before_spaces = cuts_before_spaces_are_exact(vocab, ignore_merges, st->token_id);
  }

  t.vocab_ = std::move(vocab);
  t.merges_ = merges;
  t.specials_ = std::move(specials);
  t.state_ = std::move(st);
  return t;
}

const std::vector<std::string>& Tokenizer::split_regexes() const {
  return state_->split_regexes;
}
bool Tokenizer::ignore_merges() const {
  return state_->ignore_merges;
}
const CharLevel* Tokenizer::char_level() const {
  return state_->char_level ? &*state_->char_level : nullptr;
}
int32_t Tokenizer::vocab_size() const {
  return state_->vocab_size;
}

std::optional<int32_t> Tokenizer::special_id(const std::string& text) const {
  for (const SpecialToken& sp : specials_)
    if (sp.text == text) return sp.id;
  return std::nullopt;
}

void Tokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  const State& st = *state_;
  if (piece.size() == 1 && !st.char_level) {
    out.push_back(byte_id_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  if (st.ignore_merges) {
    const auto it = st.token_id.find(piece);
    if (it != st.token_id.end()) {
      out.push_back(it->second);
      return;
    }
  }
  EncodeScratch& s = scratch();
  s.ids.clear();
  if (st.char_level) {
    st.symbols.append(piece, s.ids);
  } else {
    for (const char c : piece) s.ids.push_back(byte_id_[static_cast<unsigned char>(c)]);
  }
  merge_symbols(st.merge_table, s, out);
}

void Tokenizer::encode_ordinary_into(std::string_view text, bool starts_input,
                                     std::vector<int32_t>& out) const {
  if (text.empty()) return;
  const State& st = *state_;
  EncodeScratch& s = scratch();
  // Pieces of the first splitter are re-split by each next one (a Hugging Face Sequence).
  auto& pieces = s.pieces;
  pieces.clear();
  if (st.char_level) {
    // Normalized text in the scratch string, which the pieces view until the next call.
    const CharLevel& cl = *st.char_level;
    if (cl.normalizer.empty()) {
      s.normalized.assign(text);
    } else {
      s.normalized = cl.normalizer.apply(text);
    }
    if (cl.metaspace) {
      cl.metaspace->pre_tokenize(s.normalized, starts_input, pieces);
    } else if (!s.normalized.empty()) {
      pieces.push_back(s.normalized);
    }
    if (st.cut_before_spaces) {
      auto& next = s.pieces_next;
      next.clear();
      for (std::string_view p : pieces) cut_before_spaces(p, next);
      pieces.swap(next);
    }
  } else if (st.splitters.empty()) {
    pieces.push_back(text);
  } else {
    st.splitters[0].split(text, pieces);
    for (size_t k = 1; k < st.splitters.size(); ++k) {
      auto& next = s.pieces_next;
      next.clear();
      for (std::string_view p : pieces) st.splitters[k].split(p, next);
      pieces.swap(next);
    }
  }
  // encode_piece reuses other scratch vectors only, so iterating `pieces` here is safe.
  CacheSlot* const cache = piece_cache();
  for (std::string_view p : pieces) {
    if (p.size() == 1 && !st.char_level) {
      out.push_back(byte_id_[static_cast<unsigned char>(p[0])]);
      continue;
    }
    const bool cacheable = p.size() <= sizeof(CacheSlot::piece);
    CacheSlot* slot = nullptr;
    uint32_t tag = 0;
    if (cacheable) {
      const uint64_t h = hash_piece(p);
      slot = &cache[h >> (64 - kCacheBits)];
      tag = static_cast<uint32_t>(h);
      if (slot->owner == st.uid && slot->tag == tag && slot->len == p.size() &&
          std::memcmp(slot->piece, p.data(), p.size()) == 0) {
        out.insert(out.end(), slot->ids, slot->ids + slot->n_ids);
        continue;
      }
    }
    const size_t before = out.size();
    encode_piece(p, out);
    const size_t n_ids = out.size() - before;
    if (cacheable && n_ids <= std::size(slot->ids)) {
      slot->owner = st.uid;
      slot->tag = tag;
      slot->len = static_cast<uint8_t>(p.size());
      slot->n_ids = static_cast<uint8_t>(n_ids);
      std::memcpy(slot->piece, p.data(), p.size());
      std::copy(out.begin() + before, out.end(), slot->ids);
    }
  }
}

std::vector<int32_t> Tokenizer::encode_ordinary(std::string_view text) const {
  return encode_ordinary(text, true);
}

std::vector<int32_t> Tokenizer::encode_ordinary(std::string_view text, bool starts_input) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 1);
  encode_ordinary_into(text, starts_input, out);
  return out;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  const State& st = *state_;
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 1);
  size_t begin = 0;  // start of the ordinary text not yet encoded
  size_t i = 0;
  while (i < text.size()) {
    if (!st.special_first[static_cast<unsigned char>(text[i])]) {
      ++i;
      continue;
    }
    const SpecialToken* hit = nullptr;
    for (const SpecialToken& sp : st.specials_longest_first)
      if (text.substr(i).starts_with(sp.text)) {
        hit = &sp;
        break;
      }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    encode_ordinary_into(text.substr(begin, i - begin), begin == 0, out);
    out.push_back(hit->id);
    i += hit->text.size();
    begin = i;
  }
  encode_ordinary_into(text.substr(begin), begin == 0, out);
  return out;
}

std::string_view Tokenizer::token_bytes(int32_t id) const {
  const State& st = *state_;
  if (id < 0 || id >= st.vocab_size || !st.known[id])
    throw Error(str("token id ", id, " is out of range (vocabulary size ", st.vocab_size, ")"));
  return std::string_view(st.decode_bytes)
      .substr(st.decode_begin[id], st.decode_begin[id + 1] - st.decode_begin[id]);
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < state_->vocab_size && state_->special[id];
}

const PostProcessor& Tokenizer::post_processor() const {
  return state_->post_processor;
}

std::vector<int32_t> Tokenizer::with_special_tokens(std::vector<int32_t> ids) const {
  const PostProcessor& pp = state_->post_processor;
  if (!pp.problem.empty()) throw Error(pp.problem);
  if (pp.prefix.empty() && pp.suffix.empty()) return ids;
  std::vector<int32_t> out;
  out.reserve(pp.prefix.size() + ids.size() + pp.suffix.size());
  out.insert(out.end(), pp.prefix.begin(), pp.prefix.end());
  out.insert(out.end(), ids.begin(), ids.end());
  out.insert(out.end(), pp.suffix.begin(), pp.suffix.end());
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  const State& st = *state_;
  if (st.char_level) {
    // The decoder chain works on the tokens as the vocabulary spells them ("▁the", "<0x41>").
    std::vector<std::string> tokens;
    tokens.reserve(ids.size());
    for (const int32_t id : ids) {
      if (id < 0 || id >= st.vocab_size || !st.known[id])
        throw Error(str("token id ", id, " is out of range (vocabulary size ", st.vocab_size, ")"));
      tokens.push_back(st.special[id] ? std::string(token_bytes(id)) : vocab_[id]);
    }
    return st.char_level->decoder.decode(std::move(tokens));
  }
  std::string out;
  out.reserve(ids.size() * 4);
  for (const int32_t id : ids) {
    if (id < 0 || id >= st.vocab_size || !st.known[id])
      throw Error(str("token id ", id, " is out of range (vocabulary size ", st.vocab_size, ")"));
    out.append(st.decode_bytes, st.decode_begin[id], st.decode_begin[id + 1] - st.decode_begin[id]);
  }
  return out;
}

}  // namespace forge::tok
