#include "engine/model/unicode_chars.h"

#include <algorithm>
#include <iterator>

namespace fathom {
namespace {

// A row's category: a letter's own, otherwise the major class.
enum Cat : uint8_t { kLu, kLl, kLt, kLm, kLo, kN, kP, kS, kM };
struct Range {
  uint32_t first, last;
  Cat cat;
};
constexpr Range kRanges[] = {
#include "engine/model/unicode_categories.inc"
};

// The Unicode White_Space property, which is what \s means in Oniguruma and Rust regex.
bool is_white_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

struct Info {
  CharClass cls;
  LetterCategory letter;
};

constexpr Info info_of(Cat cat) {
  switch (cat) {
    case kLu: return {CharClass::kLetter, LetterCategory::kLu};
    case kLl: return {CharClass::kLetter, LetterCategory::kLl};
    case kLt: return {CharClass::kLetter, LetterCategory::kLt};
    case kLm: return {CharClass::kLetter, LetterCategory::kLm};
    case kLo: return {CharClass::kLetter, LetterCategory::kLo};
    case kN: return {CharClass::kNumber, LetterCategory::kNone};
    case kP: return {CharClass::kPunctuation, LetterCategory::kNone};
    case kS: return {CharClass::kSymbol, LetterCategory::kNone};
    case kM: return {CharClass::kMark, LetterCategory::kNone};
  }
  return {CharClass::kOther, LetterCategory::kNone};
}

Info char_info(uint32_t cp) {
  if (is_white_space(cp)) return {CharClass::kSpace, LetterCategory::kNone};
  if (cp < 0x80) {
    if (cp >= 'A' && cp <= 'Z') return {CharClass::kLetter, LetterCategory::kLu};
    if (cp >= 'a' && cp <= 'z') return {CharClass::kLetter, LetterCategory::kLl};
    if (cp >= '0' && cp <= '9') return {CharClass::kNumber, LetterCategory::kNone};
    if (cp < 0x20 || cp == 0x7F) return {CharClass::kOther, LetterCategory::kNone};  // controls
    // ASCII's symbols (Sc, Sm, Sk); the rest of its printable non-alphanumerics are punctuation.
    if (cp == '$' || cp == '+' || cp == '<' || cp == '=' || cp == '>' || cp == '^' || cp == '`' || cp == '|' ||
        cp == '~')
      return {CharClass::kSymbol, LetterCategory::kNone};
    return {CharClass::kPunctuation, LetterCategory::kNone};
  }
  auto it = std::upper_bound(std::begin(kRanges), std::end(kRanges), cp,
                             [](uint32_t v, const Range& r) { return v < r.first; });
  if (it == std::begin(kRanges)) return {CharClass::kOther, LetterCategory::kNone};
  --it;
  return cp <= it->last ? info_of(it->cat) : Info{CharClass::kOther, LetterCategory::kNone};
}

}  // namespace

CharClass char_class(uint32_t cp) { return char_info(cp).cls; }
LetterCategory letter_category(uint32_t cp) { return char_info(cp).letter; }

Chars decode_chars(std::string_view s) {
  Chars c;
  c.cp.reserve(s.size());
  c.cls.reserve(s.size());
  c.letter.reserve(s.size());
  c.offset.reserve(s.size() + 1);
  size_t i = 0;
  while (i < s.size()) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    uint32_t cp = kInvalidChar;
    size_t n = 1;
    if (b0 < 0x80) {
      cp = b0;
    } else {
      n = b0 >= 0xF0 ? 4 : b0 >= 0xE0 ? 3 : b0 >= 0xC0 ? 2 : 0;
      bool ok = n > 0 && i + n <= s.size() && b0 < 0xF5 && b0 != 0xC0 && b0 != 0xC1;
      uint32_t v = n == 2 ? (b0 & 0x1F) : n == 3 ? (b0 & 0x0F) : (b0 & 0x07);
      for (size_t k = 1; ok && k < n; ++k) {
        const auto b = static_cast<unsigned char>(s[i + k]);
        ok = (b & 0xC0) == 0x80;
        v = (v << 6) | (b & 0x3F);
      }
      // Reject overlong forms, surrogates and values past U+10FFFF.
      if (ok) ok = !((n == 3 && v < 0x800) || (n == 4 && (v < 0x10000 || v > 0x10FFFF)) || (v >= 0xD800 && v <= 0xDFFF));
      if (ok) {
        cp = v;
      } else {
        n = 1;
      }
    }
    c.cp.push_back(cp);
    const Info info = cp == kInvalidChar ? Info{CharClass::kOther, LetterCategory::kNone} : char_info(cp);
    c.cls.push_back(info.cls);
    c.letter.push_back(info.letter);
    c.offset.push_back(i);
    i += n;
  }
  c.offset.push_back(s.size());
  return c;
}

}  // namespace fathom
