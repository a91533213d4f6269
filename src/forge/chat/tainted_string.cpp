#include "forge/chat/tainted_string.h"

#include <algorithm>

namespace forge::chat {

void TaintedString::append(std::string_view text, int32_t origin) {
  if (text.empty()) return;
  text_.append(text);
  if (!runs_.empty() && runs_.back().origin == origin) {
    runs_.back().end = text_.size();
  } else {
    runs_.push_back({text_.size(), origin});
  }
}

void TaintedString::append(const TaintedString& s) {
  size_t begin = 0;
  for (const Run& r : s.runs_) {
    append(std::string_view(s.text_).substr(begin, r.end - begin), r.origin);
    begin = r.end;
  }
}

size_t TaintedString::run_of(size_t i) const {
  const auto it = std::upper_bound(runs_.begin(), runs_.end(), i,
                                   [](size_t pos, const Run& r) { return pos < r.end; });
  return static_cast<size_t>(it - runs_.begin());
}

TaintedString TaintedString::substr(size_t pos, size_t n) const {
  TaintedString out;
  if (pos >= text_.size()) return out;
  const size_t end = n >= text_.size() - pos ? text_.size() : pos + n;
  for (size_t k = run_of(pos); k < runs_.size() && pos < end; ++k) {
    const size_t stop = std::min(end, runs_[k].end);
    out.append(std::string_view(text_).substr(pos, stop - pos), runs_[k].origin);
    pos = stop;
  }
  return out;
}

int32_t TaintedString::origin_at(size_t i) const {
  return runs_[run_of(i)].origin;
}

bool TaintedString::is_template(size_t begin, size_t end) const {
  if (begin >= end) return true;
  for (size_t k = run_of(begin); k < runs_.size(); ++k) {
    if (runs_[k].origin != kTemplate) return false;
    if (runs_[k].end >= end) return true;
  }
  return true;
}

std::vector<Span> TaintedString::spans() const {
  std::vector<Span> out;
  size_t begin = 0;
  for (const Run& r : runs_) {
    out.push_back({text_.substr(begin, r.end - begin), r.origin});
    begin = r.end;
  }
  return out;
}

}  // namespace forge::chat
