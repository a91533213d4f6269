// TextStream (see text_stream.h). Two buffers: raw bytes waiting to become characters, then
// characters waiting to be ruled out as the start of a stop string. Both stay short — an
// incomplete character is at most 3 bytes, and the held text is shorter than the longest stop
// string (plus what one token added) — so rescanning them on every token costs nothing next
// to a decode step.
#include "forge/generate/text_stream.h"

#include <algorithm>

#include "forge/core/error.h"
#include "forge/data/corpus.h"

namespace forge {

namespace {

constexpr const char* kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// The length a UTF-8 lead byte announces; 0 for a byte that cannot start a character.
int sequence_length(unsigned char c) {
  return c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
}

bool is_continuation(unsigned char c) {
  return (c >> 6) == 0x2;
}

// Whether the complete sequence s[0, len) is a valid character: sanitize_utf8's rule (no
// overlong forms, no surrogates, nothing above U+10FFFF).
bool valid_sequence(const unsigned char* s, int len) {
  for (int k = 1; k < len; ++k)
    if (!is_continuation(s[k])) return false;
  if (len == 1) return true;
  uint32_t cp = s[0] & (0x7F >> len);
  for (int k = 1; k < len; ++k) cp = (cp << 6) | (s[k] & 0x3F);
  constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  return cp >= kMin[len] && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
}

}  // namespace

TextStream::TextStream(TokenBytes bytes_of, std::vector<std::string> stop)
    : bytes_of_(std::move(bytes_of)), stop_(std::move(stop)) {
  for (size_t i = 0; i < stop_.size(); ++i) {
    if (stop_[i].empty()) throw Error(str("stop string ", i, " is empty"));
    if (sanitize_utf8(stop_[i]) != stop_[i])
      throw Error(str("stop string ", i, " is not valid UTF-8"));
    longest_stop_ = std::max(longest_stop_, stop_[i].size());
  }
}

TextStream::TextStream(const tok::Tokenizer& tokenizer, std::vector<std::string> stop,
                       bool skip_special)
    : TextStream(
          [&tokenizer, skip_special](int32_t id) {
            if (skip_special && tokenizer.is_special(id)) return std::string();
            return std::string(tokenizer.token_bytes(id));
          },
          std::move(stop)) {}

// Moves the leading bytes whose fate is known into held_: whole valid characters as they are,
// bytes that cannot become one as U+FFFD (one per byte, as sanitize_utf8 does). An incomplete
// character whose bytes so far could still be valid waits, unless `final`.
void TextStream::decode_bytes(bool final) {
  const auto* b = reinterpret_cast<const unsigned char*>(bytes_.data());
  const size_t n = bytes_.size();
  size_t i = 0;
  while (i < n) {
    const int len = sequence_length(b[i]);
    bool ok = len > 0;
    if (ok && i + len > n) {  // cut short: wait if what is here can still be completed
      bool could_complete = true;
      for (size_t k = i + 1; k < n; ++k) could_complete = could_complete && is_continuation(b[k]);
      if (could_complete && !final) break;
      ok = false;
    }
    if (ok) ok = valid_sequence(b + i, len);
    if (ok) {
      held_.append(bytes_, i, len);
      i += len;
    } else {
      held_ += kReplacement;
      i += 1;
    }
  }
  bytes_.erase(0, i);
}

// Returns the part of held_ that is safe to print, or, when a stop string has completed, the
// text before it (and stops).
std::string TextStream::release(bool final) {
  size_t best_end = std::string::npos, best_begin = 0;
  for (const std::string& s : stop_) {
    const size_t p = held_.find(s);  // the first occurrence of s is also the first to end
    if (p == std::string::npos) continue;
    const size_t end = p + s.size();
    if (end < best_end || (end == best_end && p < best_begin)) {
      best_end = end;
      best_begin = p;
      stop_string_ = s;
    }
  }
  std::string out;
  if (best_end != std::string::npos) {
    out = held_.substr(0, best_begin);
    stopped_ = true;
    held_.clear();
    bytes_.clear();
  } else {
    // Hold back the longest tail that is a proper prefix of some stop string.
    size_t keep = 0;
    if (!final && !stop_.empty())
      for (size_t k = std::min(held_.size(), longest_stop_ - 1); k > 0 && keep == 0; --k) {
        const std::string_view tail = std::string_view(held_).substr(held_.size() - k);
        for (const std::string& s : stop_)
          if (s.size() > k && std::string_view(s).starts_with(tail)) keep = k;
      }
    out = held_.substr(0, held_.size() - keep);
    held_.erase(0, held_.size() - keep);
  }
  text_ += out;
  return out;
}

std::string TextStream::push(int32_t id) {
  if (stopped_ || finished_) return "";
  bytes_ += bytes_of_(id);
  decode_bytes(false);
  return release(false);
}

std::string TextStream::finish() {
  if (stopped_ || finished_) return "";
  finished_ = true;
  decode_bytes(true);
  return release(true);
}

}  // namespace forge
