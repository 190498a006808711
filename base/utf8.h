#pragma once
// UTF-8 checks on raw bytes (tokens, client text), and encoding a code point.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace fathom {

// Strict UTF-8: no overlong forms, surrogates, values past U+10FFFF or truncated sequences.
inline bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1fu) : n == 3 ? (c & 0x0fu) : (c & 0x07u);
    for (size_t k = 1; k < n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d >> 6) != 2) return false;
      cp = (cp << 6) | (d & 0x3fu);
    }
    if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
        (cp >= 0xd800 && cp <= 0xdfff))
      return false;
    i += n;
  }
  return true;
}

// Appends code point `cp` (<= U+10FFFF) to `out` in UTF-8.
inline void append_utf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | ((cp >> 18) & 0x07));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Character offsets in a text that arrives as byte pieces (tokens) which may end inside a
// character: chars() is the number of characters completed so far, so text[:chars()] in
// characters is everything before the next piece's first byte that forms whole characters.
class Utf8Offset {
 public:
  int64_t chars() const { return chars_; }
  void feed(std::string_view piece) {
    for (const char ch : piece) {
      const auto c = static_cast<unsigned char>(ch);
      if ((c & 0xC0) == 0x80 && pending_ > 0) {  // a continuation byte the lead byte announced
        if (--pending_ == 0) ++chars_;
        continue;
      }
      if (pending_ > 0) ++chars_;  // the previous character was cut short: it counts as one (U+FFFD)
      pending_ = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : 0;
      if (pending_ == 0) ++chars_;  // ASCII, or a byte that starts nothing (one U+FFFD)
    }
  }

 private:
  int64_t chars_ = 0;
  int pending_ = 0;  // continuation bytes still expected by the current character
};

}  // namespace fathom
