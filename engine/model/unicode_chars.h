#pragma once
// UTF-8 text as Unicode characters with the general-category classes the pre-tokenizer regexes of
// byte-level BPE vocabularies need (\s, \p{L}, \p{N}, \p{P}, \p{S}, \p{M}), from a generated table
// (engine/model/unicode_categories.inc).
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace fathom {

// A character's class: White_Space first (what \s means in Oniguruma and Rust regex), otherwise
// its major general category; kOther for the rest (C*, non-space Z*, invalid UTF-8 bytes).
enum class CharClass : uint8_t { kLetter, kNumber, kSpace, kPunctuation, kSymbol, kMark, kOther };
CharClass char_class(uint32_t cp);

inline constexpr uint32_t kInvalidChar = 0xFFFFFFFF;  // a byte that does not start valid UTF-8

// The text as characters: code point, class and byte offset of each (offset has one extra entry,
// the text's size). Every byte of invalid UTF-8 is one kInvalidChar character of class kOther.
struct Chars {
  std::vector<uint32_t> cp;
  std::vector<CharClass> cls;
  std::vector<size_t> offset;
  size_t size() const { return cp.size(); }
};
Chars decode_chars(std::string_view s);

}  // namespace fathom
