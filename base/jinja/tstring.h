#pragma once
// Strings that remember which bytes came from the caller's data ("tainted": message content, tool
// definitions) as opposed to the template's own literals and caller-trusted values (bos_token).
// The ranges are what lets the tokenizer refuse special-token text written by a client.
//
// Invariant: `taint` is ascending, non-overlapping, non-empty and merged ([a,b) and [b,c) become
// [a,c)), all within text. Operations that keep bytes (concatenation, substrings) map the ranges
// exactly; a transformation that rewrites bytes taints its whole result when its input had any.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fathom::jinja {

using Ranges = std::vector<std::pair<size_t, size_t>>;

struct TString {
  std::string text;
  Ranges taint;

  TString() = default;
  explicit TString(std::string s, bool tainted = false);

  bool tainted() const { return !taint.empty(); }
  size_t size() const { return text.size(); }
  // Appends o, its ranges shifted (and merged with ours when adjacent).
  void append(const TString& o);
  void append(std::string_view trusted_text) { text.append(trusted_text); }
  // Bytes [pos, pos + n) with their ranges.
  TString substr(size_t pos, size_t n = std::string::npos) const;
  // A new text derived from this one: wholly tainted when any byte of this one was.
  TString derived(std::string new_text) const;
  // Marks [b, e) tainted (merging).
  void add_range(size_t b, size_t e);
};

// UTF-8 helpers: Python strings index by code point. Invalid bytes count as one code point each.
size_t utf8_len(std::string_view s);
// Byte offset of code point `cp` (clamped to s.size()).
size_t utf8_offset(std::string_view s, size_t cp);
// Decodes one code point at s[i], advancing i (an invalid byte decodes as itself, 1 byte).
uint32_t utf8_next(std::string_view s, size_t& i);
void utf8_append(std::string& out, uint32_t cp);
// Python's str.isspace() for one code point.
bool py_isspace(uint32_t cp);

}  // namespace fathom::jinja
