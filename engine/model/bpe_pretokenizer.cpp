// Hand-written matchers for the pre-tokenizer regexes of byte-level BPE vocabularies. Each
// matcher returns the length (in characters) of the regex's match at position i of a segment,
// trying the alternatives in order as a backtracking regex engine does; the end of the segment
// counts as end of text for the (?!\S) look-ahead, as in HF tokenizers and llama.cpp.
#include "engine/model/bpe_pretokenizer.h"

#include <algorithm>

#include "base/error.h"

namespace fathom {
namespace {

struct Range {
  uint32_t first, last;
  CharClass cls;
};
constexpr CharClass kL = CharClass::kLetter, kN = CharClass::kNumber;
constexpr Range kRanges[] = {
#include "engine/model/unicode_categories.inc"
};

// The Unicode White_Space property, which is what \s means in Oniguruma and Rust regex.
bool is_white_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

constexpr uint32_t kInvalid = 0xFFFFFFFF;  // a byte that does not start a valid UTF-8 character

// The text as characters: code point, class and byte offset of each (offsets has one extra entry).
struct Chars {
  std::vector<uint32_t> cp;
  std::vector<CharClass> cls;
  std::vector<size_t> offset;
  size_t size() const { return cp.size(); }
};

Chars decode_chars(std::string_view s) {
  Chars c;
  c.cp.reserve(s.size());
  c.cls.reserve(s.size());
  c.offset.reserve(s.size() + 1);
  size_t i = 0;
  while (i < s.size()) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    uint32_t cp = kInvalid;
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
    c.cls.push_back(cp == kInvalid ? CharClass::kOther : char_class(cp));
    c.offset.push_back(i);
    i += n;
  }
  c.offset.push_back(s.size());
  return c;
}

bool is_letter(const Chars& c, size_t i) { return c.cls[i] == CharClass::kLetter; }
bool is_number(const Chars& c, size_t i) { return c.cls[i] == CharClass::kNumber; }
bool is_space(const Chars& c, size_t i) { return c.cls[i] == CharClass::kSpace; }
bool is_other(const Chars& c, size_t i) { return c.cls[i] == CharClass::kOther; }
bool is_crlf(const Chars& c, size_t i) { return c.cp[i] == '\r' || c.cp[i] == '\n'; }

uint32_t lower_ascii(uint32_t cp) { return cp >= 'A' && cp <= 'Z' ? cp + 32 : cp; }

// 's|'t|'re|'ve|'m|'ll|'d at i (case-insensitive for Llama 3 / Qwen 2); 0 when none.
size_t match_contraction(const Chars& c, size_t i, size_t end, bool ignore_case) {
  if (c.cp[i] != '\'' || i + 1 >= end) return 0;
  auto at = [&](size_t k) { return ignore_case ? lower_ascii(c.cp[k]) : c.cp[k]; };
  const uint32_t a = at(i + 1);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (i + 2 >= end) return 0;
  const uint32_t b = at(i + 2);
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

size_t run(const Chars& c, size_t i, size_t end, bool (*pred)(const Chars&, size_t)) {
  size_t j = i;
  while (j < end && pred(c, j)) ++j;
  return j - i;
}

// \s+(?!\S)|\s+ at i (c[i] is white space): the whole run at the end of the segment, otherwise
// the run minus its last character (which then leads the next word), and at least one.
size_t match_space_run(const Chars& c, size_t i, size_t end) {
  const size_t k = run(c, i, end, is_space);
  if (i + k == end) return k;
  return k >= 2 ? k - 1 : 1;
}

size_t match_gpt2(const Chars& c, size_t i, size_t end) {
  if (size_t n = match_contraction(c, i, end, /*ignore_case=*/false)) return n;
  // ' ?X+' for X in {letters, numbers, other}: the optional space only when X follows it.
  const size_t j = (c.cp[i] == ' ' && i + 1 < end && !is_space(c, i + 1)) ? i + 1 : i;
  if (is_letter(c, j)) return j - i + run(c, j, end, is_letter);
  if (is_number(c, j)) return j - i + run(c, j, end, is_number);
  if (is_other(c, j)) return j - i + run(c, j, end, is_other);
  return match_space_run(c, i, end);
}

size_t match_llama3(const Chars& c, size_t i, size_t end, size_t max_digits) {
  if (size_t n = match_contraction(c, i, end, /*ignore_case=*/true)) return n;
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (!is_letter(c, i) && !is_number(c, i) && !is_crlf(c, i) && i + 1 < end && is_letter(c, i + 1))
    return 1 + run(c, i + 1, end, is_letter);
  if (is_letter(c, i)) return run(c, i, end, is_letter);
  // \p{N}{1,max}
  if (is_number(c, i)) return std::min(run(c, i, end, is_number), max_digits);
  // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
  const size_t j = (c.cp[i] == ' ' && i + 1 < end && is_other(c, i + 1)) ? i + 1 : i;
  if (is_other(c, j)) {
    size_t k = j + run(c, j, end, is_other);
    return k - i + run(c, k, end, is_crlf);
  }
  // \s*[\r\n]+ : up to and including the last CR/LF of the white-space run.
  const size_t k = run(c, i, end, is_space);
  for (size_t p = i + k; p > i; --p)
    if (is_crlf(c, p - 1)) return p - i;
  return match_space_run(c, i, end);
}

// Splits chars [begin, end) with `match` and appends the words.
template <typename Match>
void split_segment(const Chars& c, std::string_view text, size_t begin, size_t end, Match match,
                   std::vector<std::string_view>& words) {
  size_t i = begin;
  while (i < end) {
    size_t n = match(c, i, end);
    if (n == 0) n = 1;  // unreachable with the patterns above: every character starts a match
    words.push_back(text.substr(c.offset[i], c.offset[i + n] - c.offset[i]));
    i += n;
  }
}

}  // namespace

CharClass char_class(uint32_t cp) {
  if (is_white_space(cp)) return CharClass::kSpace;
  if (cp < 0x80) {
    if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return CharClass::kLetter;
    if (cp >= '0' && cp <= '9') return CharClass::kNumber;
    return CharClass::kOther;
  }
  auto it = std::upper_bound(std::begin(kRanges), std::end(kRanges), cp,
                             [](uint32_t v, const Range& r) { return v < r.first; });
  if (it == std::begin(kRanges)) return CharClass::kOther;
  --it;
  return cp <= it->last ? it->cls : CharClass::kOther;
}

PreTokenizer pre_tokenizer_for(const std::string& pre) {
  if (pre.empty() || pre == "default" || pre == "gpt2" || pre == "gpt-2" || pre == "mpt" || pre == "olmo")
    return PreTokenizer::kGpt2;
  if (pre == "smollm" || pre == "starcoder" || pre == "refact" || pre == "codeshell" || pre == "command-r")
    return PreTokenizer::kDigitsThenGpt2;
  if (pre == "llama3" || pre == "llama-bpe" || pre == "llama-v3" || pre == "smaug-bpe" || pre == "dbrx")
    return PreTokenizer::kLlama3;
  if (pre == "qwen2" || pre == "deepseek-r1-qwen" || pre == "stablelm2") return PreTokenizer::kQwen2;
  throw Error("unsupported BPE pre-tokenizer '" + pre +
              "' (supported: gpt2/default, smollm/starcoder/refact/codeshell/command-r, llama3/llama-bpe, qwen2)");
}

void pre_tokenize(PreTokenizer kind, std::string_view text, std::vector<std::string_view>& words) {
  if (text.empty()) return;
  const Chars c = decode_chars(text);
  const size_t n = c.size();
  switch (kind) {
    case PreTokenizer::kGpt2:
      split_segment(c, text, 0, n, match_gpt2, words);
      return;
    case PreTokenizer::kDigitsThenGpt2: {
      size_t begin = 0;
      for (size_t i = 0; i < n; ++i) {
        if (!is_number(c, i)) continue;
        split_segment(c, text, begin, i, match_gpt2, words);
        split_segment(c, text, i, i + 1, match_gpt2, words);
        begin = i + 1;
      }
      split_segment(c, text, begin, n, match_gpt2, words);
      return;
    }
    case PreTokenizer::kLlama3:
      split_segment(c, text, 0, n, [](const Chars& ch, size_t i, size_t e) { return match_llama3(ch, i, e, 3); }, words);
      return;
    case PreTokenizer::kQwen2:
      split_segment(c, text, 0, n, [](const Chars& ch, size_t i, size_t e) { return match_llama3(ch, i, e, 1); }, words);
      return;
  }
}

}  // namespace fathom
