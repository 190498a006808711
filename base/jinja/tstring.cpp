#include "base/jinja/tstring.h"

#include <algorithm>
#include <cstdint>

#include "base/utf8.h"

namespace fathom::jinja {

TString::TString(std::string s, bool tainted) : text(std::move(s)) {
  if (tainted && !text.empty()) taint.push_back({0, text.size()});
}

void TString::add_range(size_t b, size_t e) {
  if (b >= e) return;
  if (!taint.empty() && taint.back().second >= b) {
    taint.back().second = std::max(taint.back().second, e);
    return;
  }
  taint.push_back({b, e});
}

void TString::append(const TString& o) {
  const size_t base = text.size();
  text.append(o.text);
  for (const auto& [b, e] : o.taint) add_range(base + b, base + e);
}

TString TString::substr(size_t pos, size_t n) const {
  TString out;
  if (pos >= text.size()) return out;
  n = std::min(n, text.size() - pos);
  out.text = text.substr(pos, n);
  const size_t end = pos + n;
  for (const auto& [b, e] : taint) {
    if (e <= pos) continue;
    if (b >= end) break;
    out.add_range(std::max(b, pos) - pos, std::min(e, end) - pos);
  }
  return out;
}

TString TString::derived(std::string new_text) const { return TString(std::move(new_text), tainted()); }

uint32_t utf8_next(std::string_view s, size_t& i) {
  const auto c = static_cast<unsigned char>(s[i]);
  const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (n <= 1 || i + n > s.size()) {
    ++i;
    return c;
  }
  uint32_t cp = n == 2 ? (c & 0x1fu) : n == 3 ? (c & 0x0fu) : (c & 0x07u);
  for (size_t k = 1; k < n; ++k) {
    const auto d = static_cast<unsigned char>(s[i + k]);
    if ((d >> 6) != 2) {
      ++i;
      return c;
    }
    cp = (cp << 6) | (d & 0x3fu);
  }
  i += n;
  return cp;
}

size_t utf8_len(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size(); ++n) utf8_next(s, i);
  return n;
}

size_t utf8_offset(std::string_view s, size_t cp) {
  size_t i = 0;
  for (size_t k = 0; k < cp && i < s.size(); ++k) utf8_next(s, i);
  return i;
}

void utf8_append(std::string& out, uint32_t cp) { append_utf8(cp, out); }

bool py_isspace(uint32_t cp) {
  switch (cp) {
    case 0x09: case 0x0a: case 0x0b: case 0x0c: case 0x0d: case 0x1c: case 0x1d: case 0x1e:
    case 0x1f: case 0x20: case 0x85: case 0xa0: case 0x1680: case 0x2028: case 0x2029:
    case 0x202f: case 0x205f: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200a;
  }
}

}  // namespace fathom::jinja
