#pragma once
// Shared by the pre-tokenizer matchers (bpe_pretokenizer*.cpp); not an API.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "engine/model/bpe_pretokenizer.h"
#include "engine/model/unicode_chars.h"

namespace fathom::pretok {

inline bool is_letter(const Chars& c, size_t i) { return c.cls[i] == CharClass::kLetter; }
inline bool is_number(const Chars& c, size_t i) { return c.cls[i] == CharClass::kNumber; }
inline bool is_space(const Chars& c, size_t i) { return c.cls[i] == CharClass::kSpace; }
// [^\s\p{L}\p{N}]
inline bool is_other(const Chars& c, size_t i) { return !is_letter(c, i) && !is_number(c, i) && !is_space(c, i); }
inline bool is_crlf(const Chars& c, size_t i) { return c.cp[i] == '\r' || c.cp[i] == '\n'; }

// The length of the run of characters from i (before end) that satisfy pred, up to max (a bound
// keeps X{1,3} linear over a long run of X).
template <typename Pred>
size_t run(const Chars& c, size_t i, size_t end, Pred pred, size_t max = SIZE_MAX) {
  if (i >= end) return 0;
  end = i + std::min(end - i, max);
  size_t j = i;
  while (j < end && pred(c, j)) ++j;
  return j - i;
}

// \s+(?!\S)|\s+ at i (c[i] is white space).
size_t match_space_run(const Chars& c, size_t i, size_t end);
// The GPT-2 regex at i; at least 1.
size_t match_gpt2(const Chars& c, size_t i, size_t end);

// The regex-sequence pre-tokenizers (DeepSeek LLM / Coder / V3, Falcon): appends the words of
// `text`, decoded as `c`.
void split_sequence(PreTokenizer kind, const Chars& c, std::string_view text, std::vector<std::string_view>& words);

}  // namespace fathom::pretok
