#include "engine/model/hf_sentencepiece.h"

#include <unordered_map>
#include <unordered_set>

namespace fathom::hf {
namespace {

constexpr const char kMeta[] = "\xE2\x96\x81";  // U+2581, SentencePiece's written space

bool is_string_pattern(const Reader& r, const Json& step, const char* text) {
  const Json* pattern = r.field(step, "pattern");
  const Json* s = pattern ? r.field(*pattern, "String") : nullptr;
  return s && *s == Json(text);
}

// Replace(" " -> "▁"), the space escaping of every SentencePiece-style normalizer.
bool is_space_escape(const Reader& r, const Json& step) {
  const Json* content = r.field(step, "content");
  return r.type_of(step, "normalizer") == "Replace" && is_string_pattern(r, step, " ") && content &&
         *content == Json(kMeta);
}

// The normalizer: whether it escapes spaces and whether it prepends ▁. Nothing else is accepted.
void read_normalizer(const Reader& r, const Json& tok, bool& escapes, bool& prepends) {
  escapes = prepends = false;
  const Json* n = r.field(tok, "normalizer");
  if (!n) return;
  std::vector<const Json*> steps;
  if (r.type_of(*n, "normalizer") == "Sequence") {
    const Json* list = r.field(*n, "normalizers");
    if (!list || !list->is_array() || list->size() > 2) r.fail("normalizer " + shown(*n) + " is not supported");
    for (const Json& s : *list) steps.push_back(&s);
  } else {
    steps.push_back(n);
  }
  for (const Json* s : steps) {
    const Json* prepend = r.field(*s, "prepend");
    if (!escapes && s->is_object() && is_space_escape(r, *s)) {
      escapes = true;
    } else if (!prepends && s->is_object() && r.type_of(*s, "normalizer") == "Prepend" && prepend &&
               *prepend == Json(kMeta)) {
      prepends = true;
    } else {
      r.fail("normalizer step " + shown(*s) +
             " is not supported for a SentencePiece-style BPE with byte_fallback (Replace ' ' with U+2581, Prepend U+2581)");
    }
  }
}

// The decoder: Replace("▁" -> " "), ByteFallback, Fuse, then Strip(" ", 1, 0) when `strips`.
bool read_decoder(const Reader& r, const Json& tok) {
  const Json* d = r.field(tok, "decoder");
  const Json* steps = d ? r.field(*d, "decoders") : nullptr;
  auto fail = [&] {
    r.fail("decoder " + (d ? shown(*d) : std::string("(none)")) +
           " is not supported for a SentencePiece-style BPE with byte_fallback (Sequence: Replace U+2581 with ' ', ByteFallback, Fuse, "
           "optionally Strip one leading space)");
  };
  if (!d || r.type_of(*d, "decoder") != "Sequence" || !steps || !steps->is_array() || steps->size() < 3 ||
      steps->size() > 4)
    fail();
  const Json& replace = (*steps)[0];
  const Json* content = r.field(replace, "content");
  if (!replace.is_object() || r.type_of(replace, "decoder") != "Replace" || !is_string_pattern(r, replace, kMeta) ||
      !content || *content != Json(" "))
    fail();
  if (!(*steps)[1].is_object() || r.type_of((*steps)[1], "decoder") != "ByteFallback") fail();
  if (!(*steps)[2].is_object() || r.type_of((*steps)[2], "decoder") != "Fuse") fail();
  if (steps->size() == 3) return false;
  const Json& strip = (*steps)[3];
  const Json* what = r.field(strip, "content");
  const Json* start = r.field(strip, "start");
  const Json* stop = r.field(strip, "stop");
  if (!strip.is_object() || r.type_of(strip, "decoder") != "Strip" || !what || *what != Json(" ") || !start ||
      *start != Json(1) || !stop || *stop != Json(0))
    fail();
  return true;
}

// Byte offsets where the UTF-8 characters of `s` start after the first (s is a vocabulary string).
std::vector<size_t> char_boundaries(const std::string& s) {
  std::vector<size_t> cuts;
  for (size_t i = 1; i < s.size(); ++i)
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) cuts.push_back(i);
  return cuts;
}

}  // namespace

SpmText spm_text(const Reader& r, const Json& tok) {
  bool escapes = false, prepends = false;
  read_normalizer(r, tok, escapes, prepends);
  SpmText out;
  out.prepend_each = prepends;
  if (const Json* p = r.field(tok, "pre_tokenizer")) {
    const std::string type = r.type_of(*p, "pre_tokenizer");
    if (type == "Metaspace" && !escapes && !prepends) {
      const Json* replacement = r.field(*p, "replacement");
      if (!replacement || *replacement != Json(kMeta))
        r.fail("pre_tokenizer Metaspace replacement " + (replacement ? shown(*replacement) : "(none)") +
               " is not supported (U+2581)");
      // tokenizers reads a Metaspace without `split` as splitting at every ▁: libsentencepiece does not.
      if (r.flag(*p, "split", true, "pre_tokenizer Metaspace"))
        r.fail("pre_tokenizer Metaspace split = true is not supported (words merged apart)");
      const Json* scheme = r.field(*p, "prepend_scheme");
      std::string s;
      if (scheme && scheme->is_string()) s = scheme->get<std::string>();
      else if (!scheme) s = r.flag(*p, "add_prefix_space", true, "pre_tokenizer Metaspace") ? "always" : "never";
      if (s != "first" && s != "always" && s != "never")
        r.fail("pre_tokenizer Metaspace prepend_scheme " + (scheme ? shown(*scheme) : shown(s)) + " is not supported");
      if (s != "never") out.metaspace = s;
      escapes = true;
    } else if (type == "Split" && escapes && is_string_pattern(r, *p, " ")) {
      // Gemma's: split at spaces the normalizer has already replaced, so it splits nothing.
      const Json* behavior = r.field(*p, "behavior");
      if (!behavior || *behavior != Json("MergedWithPrevious") || r.flag(*p, "invert", false, "Split"))
        r.fail("pre_tokenizer " + shown(*p) + " is not supported");
    } else {
      r.fail("pre_tokenizer " + shown(*p) +
             " is not supported for a SentencePiece-style BPE with byte_fallback (none; Metaspace without a space-escaping normalizer; "
             "Split at ' ' after one)");
    }
  }
  if (!escapes)
    r.fail("a SentencePiece-style BPE (byte_fallback) whose normalizer or pre-tokenizer does not write spaces as U+2581 is not supported");
  const bool prefix = out.prepend_each || !out.metaspace.empty();
  if (read_decoder(r, tok) != prefix)
    r.fail(std::string("decoder ") + (prefix ? "lacks" : "has") + " Strip of the leading space, but the text " +
           (prefix ? "gets" : "does not get") + " a U+2581 prefix: decoding would not invert encoding");
  return out;
}

std::vector<float> spm_scores(const Reader& r, const Json& merges, const std::vector<std::string>& tokens,
                              const std::vector<int32_t>& types) {
  std::unordered_map<std::string_view, int32_t> id_of;
  id_of.reserve(tokens.size());
  for (size_t id = 0; id < tokens.size(); ++id) id_of.emplace(tokens[id], static_cast<int32_t>(id));
  auto visible = [&](int32_t id) { return types[id] == kSpmNormal || types[id] == kSpmUserDefined; };
  auto lookup = [&](const std::string& s, const Json& m) {
    const auto it = id_of.find(s);
    if (it == id_of.end()) r.fail("merge " + shown(m) + ": " + shown(s) + " is not a token");
    return it->second;
  };

  std::vector<int64_t> first_rank(tokens.size(), -1);
  std::unordered_set<uint64_t> listed;  // (left id << 32) | right id
  listed.reserve(merges.size());
  int32_t previous = -1;
  int64_t rank = 0;
  for (const Json& m : merges) {
    const auto [left, right] = merge_parts(r, m);
    const uint64_t pair = (static_cast<uint64_t>(lookup(left, m)) << 32) | static_cast<uint32_t>(lookup(right, m));
    const int32_t made = lookup(left + right, m);
    if (!visible(made) && types[made] != kSpmControl)
      r.fail("merge " + shown(m) + " makes " + shown(tokens[made]) + ", a byte or unused token");
    if (first_rank[made] < 0) {
      first_rank[made] = rank;
    } else if (previous != made) {
      r.fail("the merges making " + shown(tokens[made]) + " are not consecutive (ranks " +
             std::to_string(first_rank[made]) + " and " + std::to_string(rank) +
             "): libsentencepiece ranks a merge by the token it makes");
    }
    listed.insert(pair);
    previous = made;
    ++rank;
  }

  // A user-defined token no merge makes is matched in the raw text only: libsentencepiece sees it as
  // a control piece (SentencePieceTokenizer), never a symbol of escaped text.
  auto in_spm = [&](int32_t id) {
    return types[id] == kSpmNormal || (types[id] == kSpmUserDefined && first_rank[id] >= 0);
  };
  for (size_t id = 0; id < tokens.size(); ++id) {
    if (!in_spm(static_cast<int32_t>(id))) continue;
    const std::string& t = tokens[id];
    const std::vector<size_t> cuts = char_boundaries(t);
    size_t from = 0;
    for (size_t k = 0; k <= cuts.size(); ++k) {  // every character is a token of its own
      if (cuts.empty()) break;
      const size_t to = k < cuts.size() ? cuts[k] : t.size();
      const std::string_view ch = std::string_view(t).substr(from, to - from);
      const auto c = id_of.find(ch);
      // A user-defined character is matched in the raw text, so it never reaches either BPE ("▁"
      // does: it is what the text's spaces become).
      if (c == id_of.end() || !(in_spm(c->second) || (types[c->second] == kSpmUserDefined && ch != kMeta)))
        r.fail("token " + shown(t) + " holds the character " + shown(t.substr(from, to - from)) +
               ", which is not a token: tokenizers falls back to bytes before merging, libsentencepiece after");
      from = to;
    }
    for (size_t cut : cuts) {  // every split into two tokens is a listed merge
      const auto a = id_of.find(std::string_view(t).substr(0, cut));
      const auto b = id_of.find(std::string_view(t).substr(cut));
      if (a == id_of.end() || b == id_of.end() || !in_spm(a->second) || !in_spm(b->second)) continue;
      if (!listed.contains((static_cast<uint64_t>(a->second) << 32) | static_cast<uint32_t>(b->second)))
        r.fail("tokens " + shown(tokens[a->second]) + " and " + shown(tokens[b->second]) + " make " + shown(t) +
               ", but merges lacks that pair: libsentencepiece would merge them, tokenizers not");
    }
  }
  std::vector<float> scores(tokens.size(), 0.0f);
  for (size_t id = 0; id < tokens.size(); ++id)
    if (first_rank[id] >= 0) scores[id] = -static_cast<float>(first_rank[id] + 1);
  return scores;
}

}  // namespace fathom::hf
