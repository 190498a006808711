// Hand-written matchers for the pre-tokenizer regexes of byte-level BPE vocabularies. Each
// matcher returns the length (in characters) of the regex's match at position i of a segment,
// trying the alternatives in order as a backtracking regex engine does; the end of the segment
// counts as end of text for the (?!\S) look-ahead, as in HF tokenizers and llama.cpp.
#include <algorithm>

#include "base/error.h"
#include "engine/model/bpe_pretokenizer_internal.h"

namespace fathom {
namespace pretok {
namespace {

// The case folding (?i:...) applies to the letters of the contractions, as Oniguruma and Python's
// regex fold them: ASCII's, and U+017F LATIN SMALL LETTER LONG S, which folds to 's'.
uint32_t fold_case(uint32_t cp) { return cp >= 'A' && cp <= 'Z' ? cp + 32 : cp == 0x17F ? 's' : cp; }

// 's|'t|'re|'ve|'m|'ll|'d at i (case-insensitive for Llama 3 / Qwen 2 / GPT-4o); 0 when none.
size_t match_contraction(const Chars& c, size_t i, size_t end, bool ignore_case) {
  if (c.cp[i] != '\'' || i + 1 >= end) return 0;
  auto at = [&](size_t k) { return ignore_case ? fold_case(c.cp[k]) : c.cp[k]; };
  const uint32_t a = at(i + 1);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (i + 2 >= end) return 0;
  const uint32_t b = at(i + 2);
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

}  // namespace

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

namespace {

// \s*[\r\n]+|\s+(?!\S)|\s+ at i (c[i] is white space): up to and including the last CR/LF of
// the white-space run, or without CR/LF, match_space_run's.
size_t match_crlf_or_space_run(const Chars& c, size_t i, size_t end) {
  const size_t k = run(c, i, end, is_space);
  for (size_t p = i + k; p > i; --p)
    if (is_crlf(c, p - 1)) return p - i;
  return match_space_run(c, i, end);
}

bool is_mark(const Chars& c, size_t i) { return c.cls[i] == CharClass::kMark; }
bool is_letter_or_mark(const Chars& c, size_t i) { return is_letter(c, i) || is_mark(c, i); }
// [^\s\p{L}\p{M}\p{N}]
bool is_other_not_mark(const Chars& c, size_t i) { return is_other(c, i) && !is_mark(c, i); }

// Llama 3's regex with \p{N}{1,max_digits}; with `marks` (Qwen 3.5) the word class is [\p{L}\p{M}]
// and the punctuation class leaves marks out.
size_t match_llama3(const Chars& c, size_t i, size_t end, size_t max_digits, bool marks = false) {
  if (size_t n = match_contraction(c, i, end, /*ignore_case=*/true)) return n;
  const auto word = marks ? is_letter_or_mark : is_letter;
  const auto other = marks ? is_other_not_mark : is_other;
  // [^\r\n\p{L}\p{N}]?\p{L}+ (or [\p{L}\p{M}]+)
  if (!is_letter(c, i) && !is_number(c, i) && !is_crlf(c, i) && i + 1 < end && word(c, i + 1))
    return 1 + run(c, i + 1, end, word);
  if (word(c, i)) return run(c, i, end, word);
  // \p{N}{1,max}
  if (is_number(c, i)) return run(c, i, end, is_number, max_digits);
  // ' ?[^\s\p{L}\p{N}]+[\r\n]*' (or [^\s\p{L}\p{M}\p{N}])
  const size_t j = (c.cp[i] == ' ' && i + 1 < end && other(c, i + 1)) ? i + 1 : i;
  if (other(c, j)) {
    size_t k = j + run(c, j, end, other);
    return k - i + run(c, k, end, is_crlf);
  }
  return match_crlf_or_space_run(c, i, end);
}

// o200k's letter classes: [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] (upper) and [\p{Ll}\p{Lm}\p{Lo}\p{M}]
// (lower); Lm, Lo and the marks are in both.
bool is_o200k_upper(const Chars& c, size_t i) {
  const LetterCategory l = c.letter[i];
  return l == LetterCategory::kLu || l == LetterCategory::kLt || l == LetterCategory::kLm ||
         l == LetterCategory::kLo || is_mark(c, i);
}
bool is_o200k_lower(const Chars& c, size_t i) {
  const LetterCategory l = c.letter[i];
  return l == LetterCategory::kLl || l == LetterCategory::kLm || l == LetterCategory::kLo || is_mark(c, i);
}
// [^\r\n\p{L}\p{N}]: what may lead a word (white space, punctuation, symbols, marks, the rest).
bool is_word_lead(const Chars& c, size_t i) { return !is_letter(c, i) && !is_number(c, i) && !is_crlf(c, i); }
// [\r\n/]
bool is_crlf_or_slash(const Chars& c, size_t i) { return is_crlf(c, i) || c.cp[i] == '/'; }

// [upper]*[lower]+ at j, as a backtracking engine matches it: the upper run, given back one
// character at a time until a lower one can start; 0 when none can. Given back, the lower run is
// that one character: the upper run's characters after it are Lu/Lt, and what follows the run is
// not lower (else nothing is given back).
size_t o200k_upper_star_lower_plus(const Chars& c, size_t j, size_t end) {
  const size_t k = run(c, j, end, is_o200k_upper);
  if (j + k < end && is_o200k_lower(c, j + k)) return k + run(c, j + k, end, is_o200k_lower);
  for (size_t p = j + k; p > j; --p)
    if (is_o200k_lower(c, p - 1)) return p - j;
  return 0;
}
// [upper]+[lower]* at j; 0 when c[j] is not upper.
size_t o200k_upper_plus_lower_star(const Chars& c, size_t j, size_t end) {
  const size_t k = run(c, j, end, is_o200k_upper);
  return k == 0 ? 0 : k + run(c, j + k, end, is_o200k_lower);
}

// GPT-4o's (tiktoken's o200k) regex:
//   [^\r\n\p{L}\p{N}]?[upper]*[lower]+C? | [^\r\n\p{L}\p{N}]?[upper]+[lower]*C? | \p{N}{1,3}
//   | ?[^\s\p{L}\p{N}]+[\r\n/]* | \s*[\r\n]+ | \s+(?!\S) | \s+
// with C = (?i:'s|'t|'re|'ve|'m|'ll|'d): the contraction only ever ends a word.
size_t match_gpt4o(const Chars& c, size_t i, size_t end) {
  // Each word alternative with its optional leading character first, then without it (a mark can
  // be either), then the contraction if one follows.
  for (auto word : {o200k_upper_star_lower_plus, o200k_upper_plus_lower_star}) {
    size_t n = 0;
    if (is_word_lead(c, i) && i + 1 < end) n = word(c, i + 1, end);
    n = n ? 1 + n : word(c, i, end);
    if (n) return i + n < end ? n + match_contraction(c, i + n, end, /*ignore_case=*/true) : n;
  }
  if (is_number(c, i)) return run(c, i, end, is_number, 3);
  // ' ?[^\s\p{L}\p{N}]+[\r\n/]*'
  const size_t j = (c.cp[i] == ' ' && i + 1 < end && is_other(c, i + 1)) ? i + 1 : i;
  if (is_other(c, j)) {
    const size_t k = j + run(c, j, end, is_other);
    return k - i + run(c, k, end, is_crlf_or_slash);
  }
  return match_crlf_or_space_run(c, i, end);
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
}  // namespace pretok

using namespace pretok;  // NOLINT: this file's own helpers

PreTokenizer pre_tokenizer_for(const std::string& pre) {
  if (pre.empty() || pre == "default" || pre == "gpt2" || pre == "gpt-2" || pre == "mpt" || pre == "olmo")
    return PreTokenizer::kGpt2;
  if (pre == "smollm" || pre == "starcoder" || pre == "refact" || pre == "codeshell" || pre == "command-r")
    return PreTokenizer::kDigitsThenGpt2;
  if (pre == "llama3" || pre == "llama-bpe" || pre == "llama-v3" || pre == "smaug-bpe" || pre == "dbrx")
    return PreTokenizer::kLlama3;
  if (pre == "qwen2" || pre == "deepseek-r1-qwen" || pre == "stablelm2") return PreTokenizer::kQwen2;
  if (pre == "qwen35") return PreTokenizer::kQwen35;
  if (pre == "deepseek-llm") return PreTokenizer::kDeepseekLlm;
  if (pre == "deepseek-coder") return PreTokenizer::kDeepseekCoder;
  if (pre == "deepseek-v3" || pre == "hunyuan-dense") return PreTokenizer::kDeepseekV3;  // llama.cpp: same regexes
  if (pre == "falcon") return PreTokenizer::kFalcon;
  // llama.cpp: LLAMA_VOCAB_PRE_TYPE_GPT4O, and MINIMAX_M2 with the same regex.
  if (pre == "gpt-4o" || pre == "llama4" || pre == "kanana2" || pre == "talkie" || pre == "minimax-m2")
    return PreTokenizer::kGpt4o;
  throw Error("unsupported BPE pre-tokenizer '" + pre +
              "' (supported: gpt2/default, smollm/starcoder/refact/codeshell/command-r, llama3/llama-bpe, qwen2, "
              "qwen35, deepseek-llm, deepseek-coder, deepseek-v3/hunyuan-dense, falcon, gpt-4o/llama4/minimax-m2)");
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
    case PreTokenizer::kQwen35:
      split_segment(c, text, 0, n, [](const Chars& ch, size_t i, size_t e) { return match_llama3(ch, i, e, 1, true); },
                    words);
      return;
    case PreTokenizer::kGpt4o:
      split_segment(c, text, 0, n, match_gpt4o, words);
      return;
    case PreTokenizer::kDeepseekLlm:
    case PreTokenizer::kDeepseekCoder:
    case PreTokenizer::kDeepseekV3:
    case PreTokenizer::kFalcon:
      split_sequence(kind, c, text, words);
      return;
  }
}

}  // namespace fathom
