#include "forge/core/parse.h"

#include <charconv>
#include <cmath>

#include "forge/core/error.h"

namespace forge {

namespace {

// The whole of `text` as a T, or false. from_chars takes no leading spaces and no '+', and
// reports overflow instead of wrapping.
template <typename T>
bool parse_whole(std::string_view text, T& out) {
  if (text.empty()) return false;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, out);
  return ec == std::errc() && ptr == end;
}

template <typename T>
T parse_integer(const std::string& what, std::string_view text, T lo, T hi) {
  T x{};
  if (!parse_whole(text, x) || x < lo || x > hi)
    throw Error(str(what, ": expected an integer in [", lo, ", ", hi, "], got ", quote(text)));
  return x;
}

std::string shortest(double x) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof(buf), x);
  return std::string(buf, r.ptr);
}

}  // namespace

bool Interval::contains(double x) const {
  if (!std::isfinite(x)) return false;
  return (lo_open ? x > lo : x >= lo) && (hi_open ? x < hi : x <= hi);
}

std::string Interval::bounds() const {
  const bool has_lo = std::isfinite(lo), has_hi = std::isfinite(hi);
  if (has_lo && has_hi)
    return str(lo_open ? "(" : "[", shortest(lo), ", ", shortest(hi), hi_open ? ")" : "]");
  if (has_lo) return str(lo_open ? "> " : ">= ", shortest(lo));
  if (has_hi) return str(hi_open ? "< " : "<= ", shortest(hi));
  return "any";
}

std::string Interval::describe() const {
  if (!std::isfinite(lo) && !std::isfinite(hi)) return "a finite number";
  return str("a number ", std::isfinite(lo) && std::isfinite(hi) ? "in " : "", bounds());
}

int parse_int(const std::string& what, std::string_view text, int lo, int hi) {
  return parse_integer<int>(what, text, lo, hi);
}

int64_t parse_int64(const std::string& what, std::string_view text, int64_t lo, int64_t hi) {
  return parse_integer<int64_t>(what, text, lo, hi);
}

uint64_t parse_uint64(const std::string& what, std::string_view text, uint64_t lo, uint64_t hi) {
  return parse_integer<uint64_t>(what, text, lo, hi);
}

double parse_double(const std::string& what, std::string_view text, const Interval& range) {
  double x = 0;
  if (!parse_whole(text, x) || !range.contains(x))
    throw Error(str(what, ": expected ", range.describe(), ", got ", quote(text)));
  return x;
}

bool parse_bool(const std::string& what, std::string_view text) {
  if (text == "true" || text == "1") return true;
  if (text == "false" || text == "0") return false;
  throw Error(str(what, ": expected true or false, got ", quote(text)));
}

}  // namespace forge
