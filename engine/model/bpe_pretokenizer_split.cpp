// The pre-tokenizers that are sequences of regexes (DeepSeek LLM / Coder / V3, Falcon): each regex
// splits every piece the previous one produced into its matches and the text between them, both
// kept (HF tokenizers' Split with behavior "isolated"; llama.cpp's regex lists). Each regex is a
// finder: its leftmost match in a piece from i on, as a backtracking engine picks it, in linear
// time over the piece (no rescanning of a run at each of its characters: hostile input is long).
#include <algorithm>
#include <cstdint>
#include <iterator>
#include <utility>

#include "engine/model/bpe_pretokenizer_internal.h"

namespace fathom::pretok {
namespace {

struct Span {
  size_t begin, end;  // characters
};
struct Found {
  size_t at, len;  // len 0: no match
};

bool in(uint32_t cp, uint32_t first, uint32_t last) { return cp >= first && cp <= last; }

// DeepSeek LLM's letter class: the cased letters (Lu, Ll, Lt) of its tokenizer.json's regex.
constexpr std::pair<uint32_t, uint32_t> kDeepseekCased[] = {
    {0x41, 0x5A},       {0x61, 0x7A},       {0xB5, 0xB5},       {0xC0, 0xD6},       {0xD8, 0xF6},
    {0xF8, 0x1BA},      {0x1BC, 0x1BF},     {0x1C4, 0x293},     {0x295, 0x2AF},     {0x370, 0x373},
    {0x376, 0x377},     {0x37B, 0x37D},     {0x37F, 0x37F},     {0x386, 0x386},     {0x388, 0x38A},
    {0x38C, 0x38C},     {0x38E, 0x3A1},     {0x3A3, 0x3F5},     {0x3F7, 0x481},     {0x48A, 0x52F},
    {0x531, 0x556},     {0x10A0, 0x10C5},   {0x13A0, 0x13F5},   {0x13F8, 0x13FD},   {0x1C90, 0x1CBA},
    {0x1CBD, 0x1CBF},   {0x1D00, 0x1D2B},   {0x1D6B, 0x1D77},   {0x1D79, 0x1D9A},   {0x1E00, 0x1F15},
    {0x1F18, 0x1F1D},   {0x1F20, 0x1F45},   {0x1F48, 0x1F4D},   {0x1F50, 0x1F57},   {0x1F59, 0x1F59},
    {0x1F5B, 0x1F5B},   {0x1F5D, 0x1F5D},   {0x1F5F, 0x1F7D},   {0x1F80, 0x1FB4},   {0x1FB6, 0x1FBC},
    {0x1FBE, 0x1FBE},   {0x1FC2, 0x1FC4},   {0x1FC6, 0x1FCC},   {0x1FD0, 0x1FD3},   {0x1FD6, 0x1FDB},
    {0x1FE0, 0x1FEC},   {0x1FF2, 0x1FF4},   {0x1FF6, 0x1FFC},   {0x2102, 0x2102},   {0x2107, 0x2107},
    {0x210A, 0x2113},   {0x2115, 0x2115},   {0x2119, 0x211D},   {0x2124, 0x2124},   {0x2126, 0x2126},
    {0x2128, 0x2128},   {0x212A, 0x212D},   {0x212F, 0x2134},   {0x2139, 0x2139},   {0x213C, 0x213F},
    {0x2145, 0x2149},   {0x214E, 0x214E},   {0x2183, 0x2184},   {0x2C00, 0x2C7B},   {0x2C7E, 0x2CE4},
    {0x2CEB, 0x2CEE},   {0x2CF2, 0x2CF3},   {0xA640, 0xA66D},   {0xA680, 0xA69B},   {0xA722, 0xA76F},
    {0xA771, 0xA787},   {0xA78B, 0xA78E},   {0xAB70, 0xABBF},   {0xFB00, 0xFB06},   {0xFB13, 0xFB17},
    {0xFF21, 0xFF3A},   {0xFF41, 0xFF5A},   {0x10400, 0x1044F}, {0x104B0, 0x104D3}, {0x104D8, 0x104FB},
    {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF}, {0x1E900, 0x1E943},
};

bool is_deepseek_cased(const Chars& c, size_t i) {
  const uint32_t cp = c.cp[i];
  auto it = std::upper_bound(std::begin(kDeepseekCased), std::end(kDeepseekCased), cp,
                             [](uint32_t v, const std::pair<uint32_t, uint32_t>& r) { return v < r.first; });
  return it != std::begin(kDeepseekCased) && cp <= std::prev(it)->second;
}
// [!-/:-~！-／：-～‘-‟　-。] (ASCII and full-width punctuation, quotes, ideographic space and stops)
bool is_deepseek_punct(const Chars& c, size_t i) {
  const uint32_t cp = c.cp[i];
  return in(cp, '!', '/') || in(cp, ':', '~') || in(cp, 0xFF01, 0xFF0F) || in(cp, 0xFF1A, 0xFF5E) ||
         in(cp, 0x2018, 0x201F) || in(cp, 0x3000, 0x3002);
}
// [一-龥ࠀ-一가-퟿]: U+0800..U+9FA5 (CJK and everything from Samaritan up) and Hangul syllables on.
bool is_deepseek_cjk(const Chars& c, size_t i) {
  return in(c.cp[i], 0x0800, 0x9FA5) || in(c.cp[i], 0xAC00, 0xD7FF);
}
// [一-龥぀-ゟ゠-ヿ]: CJK ideographs, hiragana, katakana.
bool is_v3_cjk(const Chars& c, size_t i) {
  return in(c.cp[i], 0x4E00, 0x9FA5) || in(c.cp[i], 0x3040, 0x30FF);
}
bool is_punct(const Chars& c, size_t i) { return c.cls[i] == CharClass::kPunctuation; }
bool is_punct_or_symbol(const Chars& c, size_t i) {
  return c.cls[i] == CharClass::kPunctuation || c.cls[i] == CharClass::kSymbol;
}
bool is_letter_or_mark(const Chars& c, size_t i) { return is_letter(c, i) || c.cls[i] == CharClass::kMark; }
// [\p{P}\$\+<=>\^~\|`]: Unicode punctuation and all of ASCII's (HF's Punctuation pre-tokenizer).
bool is_falcon_punct(const Chars& c, size_t i) {
  return is_punct(c, i) || (c.cp[i] < 0x80 && c.cls[i] == CharClass::kSymbol);
}
bool is_ascii_letter(const Chars& c, size_t i) { return c.cp[i] < 0x80 && is_letter(c, i); }
bool is_ascii_punct(const Chars& c, size_t i) { return c.cp[i] < 0x80 && is_punct_or_symbol(c, i); }
bool is_ascii_digit(const Chars& c, size_t i) { return c.cp[i] >= '0' && c.cp[i] <= '9'; }

// X+, or X{1,max}.
template <typename Pred>
Found find_run(const Chars& c, size_t i, size_t end, Pred pred, size_t max = SIZE_MAX) {
  for (; i < end; ++i)
    if (pred(c, i)) return {i, run(c, i, end, pred, max)};
  return {end, 0};
}

// \s?X+ : a white-space character joins the run it precedes.
template <typename Pred>
Found find_space_run(const Chars& c, size_t i, size_t end, Pred pred) {
  for (; i < end; ++i) {
    if (pred(c, i)) return {i, run(c, i, end, pred)};
    if (is_space(c, i) && i + 1 < end && pred(c, i + 1)) return {i, 1 + run(c, i + 1, end, pred)};
  }
  return {end, 0};
}

// \s+$ : the white space ending the piece.
Found find_trailing_space(const Chars& c, size_t i, size_t end) {
  size_t p = end;
  while (p > i && is_space(c, p - 1)) --p;
  return {p, end - p};
}

// [0-9][0-9][0-9]
Found find_three_digits(const Chars& c, size_t i, size_t end) {
  for (; i + 3 <= end; ++i)
    if (is_ascii_digit(c, i) && is_ascii_digit(c, i + 1) && is_ascii_digit(c, i + 2)) return {i, 3};
  return {end, 0};
}

// DeepSeek V3's main regex anchored at i; 0 when no alternative matches there.
size_t match_deepseek_v3(const Chars& c, size_t i, size_t end) {
  // [!"#...~][A-Za-z]+
  if (is_ascii_punct(c, i) && i + 1 < end && is_ascii_letter(c, i + 1)) return 1 + run(c, i + 1, end, is_ascii_letter);
  // [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+ (a leading mark is the run's own first character)
  if (is_letter_or_mark(c, i)) return run(c, i, end, is_letter_or_mark);
  if (!is_crlf(c, i) && !is_punct_or_symbol(c, i) && i + 1 < end && is_letter_or_mark(c, i + 1))
    return 1 + run(c, i + 1, end, is_letter_or_mark);
  // ' ?[\p{P}\p{S}]+[\r\n]*'
  const size_t j = (c.cp[i] == ' ' && i + 1 < end && is_punct_or_symbol(c, i + 1)) ? i + 1 : i;
  if (is_punct_or_symbol(c, j)) {
    const size_t k = j + run(c, j, end, is_punct_or_symbol);
    return k - i + run(c, k, end, is_crlf);
  }
  if (!is_space(c, i)) return 0;
  // \s*[\r\n]+ : up to and including the last CR/LF of the white-space run.
  const size_t k = run(c, i, end, is_space);
  for (size_t p = i + k; p > i; --p)
    if (is_crlf(c, p - 1)) return p - i;
  return match_space_run(c, i, end);
}

// The leftmost match of an anchored matcher (0 where it fails).
template <typename Match>
Found find_anchored(const Chars& c, size_t i, size_t end, Match match) {
  for (; i < end; ++i)
    if (size_t n = match(c, i, end)) return {i, n};
  return {end, 0};
}

template <typename Find>
void split_isolated(const Chars& c, std::vector<Span>& pieces, Find find) {
  std::vector<Span> out;
  out.reserve(pieces.size() * 2);
  for (const Span& p : pieces) {
    size_t i = p.begin;
    while (i < p.end) {
      const Found f = find(c, i, p.end);
      if (f.len == 0) break;
      if (f.at > i) out.push_back({i, f.at});
      out.push_back({f.at, f.at + f.len});
      i = f.at + f.len;
    }
    if (i < p.end) out.push_back({i, p.end});
  }
  pieces.swap(out);
}

}  // namespace

void split_sequence(PreTokenizer kind, const Chars& c, std::string_view text, std::vector<std::string_view>& words) {
  std::vector<Span> p{{0, c.size()}};
  using C = const Chars&;
  switch (kind) {
    case PreTokenizer::kDeepseekLlm:
    case PreTokenizer::kDeepseekCoder: {
      const bool llm = kind == PreTokenizer::kDeepseekLlm;
      split_isolated(c, p, [](C ch, size_t i, size_t e) { return find_run(ch, i, e, is_crlf, 1); });
      if (llm) {
        split_isolated(c, p, [](C ch, size_t i, size_t e) { return find_space_run(ch, i, e, is_deepseek_cased); });
        split_isolated(c, p, [](C ch, size_t i, size_t e) { return find_space_run(ch, i, e, is_deepseek_punct); });
        split_isolated(c, p, find_trailing_space);
      } else {
        split_isolated(c, p, [](C ch, size_t i, size_t e) { return find_space_run(ch, i, e, is_letter); });
        split_isolated(c, p, [](C ch, size_t i, size_t e) { return find_space_run(ch, i, e, is_punct); });
      }
      split_isolated(c, p, [](C ch, size_t i, size_t e) { return find_run(ch, i, e, is_deepseek_cjk); });
      const size_t digits = llm ? SIZE_MAX : 1;  // \p{N}+ or \p{N}
      split_isolated(c, p, [digits](C ch, size_t i, size_t e) { return find_run(ch, i, e, is_number, digits); });
      break;
    }
    case PreTokenizer::kDeepseekV3:
      split_isolated(c, p, [](C ch, size_t i, size_t e) { return find_run(ch, i, e, is_number, 3); });
      split_isolated(c, p, [](C ch, size_t i, size_t e) { return find_run(ch, i, e, is_v3_cjk); });
      split_isolated(c, p, [](C ch, size_t i, size_t e) { return find_anchored(ch, i, e, match_deepseek_v3); });
      break;
    case PreTokenizer::kFalcon:
      split_isolated(c, p, [](C ch, size_t i, size_t e) { return find_run(ch, i, e, is_falcon_punct); });
      split_isolated(c, p, [](C ch, size_t i, size_t e) { return Found{i, match_gpt2(ch, i, e)}; });
      split_isolated(c, p, find_three_digits);
      break;
    default:
      break;
  }
  for (const Span& s : p) words.push_back(text.substr(c.offset[s.begin], c.offset[s.end] - c.offset[s.begin]));
}

}  // namespace fathom::pretok
