// A string that remembers where each of its bytes came from: the chat template's own literal text
// (and the model's configured tokens such as bos_token), or a value of the data the template
// renders (a message's role or content). The template interpreter carries it through every string
// operation (concatenation, slicing, strip, replace, split, join, tojson, ...), so that the
// rendered conversation can be encoded with the rule of issue 14: special tokens come only from
// the template. A literal "<|im_end|>" typed by a user is data and is encoded as plain text.
//
// Representation: the text plus runs of one origin (run k covers [end of run k-1, end of run k)),
// so that a conversation of a few kilobytes costs a handful of runs, not an origin per byte.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace forge::chat {

// Where text came from. kTemplate: the template (trusted; special tokens are recognised in it).
// 0, 1, 2, ...: the message of that index. kOtherData: data that is not a message.
inline constexpr int32_t kTemplate = -1;
inline constexpr int32_t kOtherData = -2;

// A stretch of text of one origin.
struct Span {
  std::string text;
  int32_t origin;
};

class TaintedString {
 public:
  TaintedString() = default;
  TaintedString(std::string_view text, int32_t origin) { append(text, origin); }

  const std::string& text() const { return text_; }
  size_t size() const { return text_.size(); }
  bool empty() const { return text_.empty(); }

  void append(std::string_view text, int32_t origin);
  void append(const TaintedString& s);
  // Bytes [pos, pos + n) (clamped to the end), with their origins.
  TaintedString substr(size_t pos, size_t n = std::string::npos) const;

  int32_t origin_at(size_t i) const;
  // True when every byte of [begin, end) is template text.
  bool is_template(size_t begin, size_t end) const;
  // The runs of one origin, in order (adjacent runs of one origin are merged).
  std::vector<Span> spans() const;

  bool operator==(const TaintedString& o) const = default;

 private:
  struct Run {
    size_t end;
    int32_t origin;
    bool operator==(const Run&) const = default;
  };
  // Index of the run holding byte i (i < size()).
  size_t run_of(size_t i) const;

  std::string text_;
  std::vector<Run> runs_;  // ends strictly ascending; the last end is text_.size()
};

}  // namespace forge::chat
