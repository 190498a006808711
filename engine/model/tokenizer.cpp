// Tokenizer base: vocabulary index, special-token splitting, end-of-generation ids, decode and
// the incremental detokenizer. The two models (SentencePiece, byte-level BPE) live in their own
// files; from_gguf picks one by tokenizer.ggml.model.
#include "engine/model/tokenizer.h"

#include <algorithm>

#include "base/error.h"
#include "engine/model/bpe_tokenizer.h"
#include "engine/model/gguf.h"
#include "engine/model/sentencepiece_tokenizer.h"

namespace fathom {
namespace {

constexpr int32_t kTypeUnknown = 2, kTypeControl = 3, kTypeUserDefined = 4;
constexpr const char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

// Length of the UTF-8 prefix of s[i..] that is still a valid start of one character:
// returns {n, complete}. complete == true: s[i..i+n) is a whole character. complete == false and
// i + n == s.size(): a valid but unfinished character (more bytes may complete it). Otherwise
// s[i..i+n) is a maximal invalid subpart (n >= 1) to replace with one U+FFFD.
struct Utf8Step {
  size_t n;
  bool complete;
};
Utf8Step utf8_step(std::string_view s, size_t i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) return {1, true};
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte (Unicode Table 3-7)
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;  // <= U+10FFFF
  } else {
    return {1, false};  // stray continuation byte or C0/C1/F5..FF
  }
  size_t n = 1;
  for (; n < need; ++n) {
    if (i + n >= s.size()) return {n, false};  // unfinished
    const auto b = static_cast<unsigned char>(s[i + n]);
    const bool ok = n == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    if (!ok) return {n, false};  // invalid: the subpart ends before this byte
  }
  return {n, true};
}

// Appends the valid UTF-8 of `bytes` to `out`, invalid subparts as U+FFFD. Returns how many
// trailing bytes form an unfinished character (not consumed) unless `at_end`, in which case they
// are replaced too.
size_t append_sanitized(std::string_view bytes, bool at_end, std::string& out) {
  size_t i = 0;
  while (i < bytes.size()) {
    const Utf8Step st = utf8_step(bytes, i);
    if (st.complete) {
      out.append(bytes.substr(i, st.n));
    } else if (i + st.n == bytes.size() && !at_end && st.n > 0 &&
               static_cast<unsigned char>(bytes[i]) >= 0xC2 && static_cast<unsigned char>(bytes[i]) <= 0xF4) {
      return bytes.size() - i;  // wait for the rest of this character
    } else {
      out += kReplacement;
    }
    i += st.n;
  }
  return 0;
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const GgufFile& file) {
  const std::string model = file.get_string("tokenizer.ggml.model").value_or("");
  if (model == "llama") return std::make_unique<SentencePieceTokenizer>(file);
  if (model == "gpt2") return std::make_unique<BpeTokenizer>(file);
  if (model.empty()) throw Error(file.path() + ": no tokenizer.ggml.model in the GGUF metadata");
  throw Error(file.path() + ": unsupported tokenizer.ggml.model '" + model + "' (supported: llama, gpt2)");
}

void Tokenizer::index_vocabulary(bool match_user_defined) {
  piece_ids_.clear();
  piece_ids_.reserve(pieces_.size());
  special_by_text_.clear();
  for (auto& lengths : special_lengths_) lengths.clear();
  for (int32_t id = 0; id < vocab_size(); ++id) {
    const std::string& p = pieces_[id];
    piece_ids_.emplace(p, id);  // first occurrence wins for duplicated strings
    const int32_t type = id < static_cast<int32_t>(token_types_.size()) ? token_types_[id] : 1;
    const bool special = type == kTypeControl || type == kTypeUnknown;
    const bool user = type == kTypeUserDefined && match_user_defined;
    if (p.empty() || !(special || user)) continue;
    special_by_text_.emplace(p, SpecialToken{id, user});
    auto& lengths = special_lengths_[static_cast<unsigned char>(p[0])];
    if (std::find(lengths.begin(), lengths.end(), p.size()) == lengths.end()) lengths.push_back(p.size());
  }
  for (auto& lengths : special_lengths_) std::sort(lengths.rbegin(), lengths.rend());
}

std::vector<Tokenizer::TextSpan> Tokenizer::split_special(std::string_view text, const EncodeOptions& opts) const {
  const bool parse_special = opts.parse_special;
  std::vector<TextSpan> spans;
  size_t plain_begin = 0, i = 0, r = 0;  // r: the first literal range that ends after i
  const size_t n_literal = opts.literal ? opts.literal->size() : 0;
  while (i < text.size()) {
    while (r < n_literal && (*opts.literal)[r].second <= i) ++r;
    const auto& lengths = special_lengths_[static_cast<unsigned char>(text[i])];
    const SpecialToken* found = nullptr;
    size_t found_len = 0;
    for (uint32_t len : lengths) {  // longest first
      if (len > text.size() - i) continue;
      auto it = special_by_text_.find(text.substr(i, len));
      if (it == special_by_text_.end() || !(parse_special || it->second.always)) continue;
      // Message content is text: no special token is recognised in it (GGUF files mark chat
      // control tokens as control or as user-defined; either would let a message forge a turn).
      if (r < n_literal && (*opts.literal)[r].first < i + len) continue;
      found = &it->second;
      found_len = len;
      break;
    }
    if (!found) {
      ++i;
      continue;
    }
    if (i > plain_begin) spans.push_back({text.substr(plain_begin, i - plain_begin), -1});
    spans.push_back({text.substr(i, found_len), found->id});
    i += found_len;
    plain_begin = i;
  }
  if (plain_begin < text.size()) spans.push_back({text.substr(plain_begin), -1});
  return spans;
}

void Tokenizer::collect_end_of_generation(const GgufFile& file) {
  eog_ids_.clear();
  auto add = [&](int64_t id) {
    if (id >= 0 && id < vocab_size() && std::find(eog_ids_.begin(), eog_ids_.end(), id) == eog_ids_.end())
      eog_ids_.push_back(static_cast<int32_t>(id));
  };
  add(eos_id_);
  for (const char* key : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"})
    if (auto id = file.get_int(key)) add(*id);
  // Every EOS id of a Hugging Face checkpoint (generation_config.json's list: hf_tokenizer.h).
  if (auto ids = file.get_int_array("fathom.eog_token_ids"))
    for (int64_t id : *ids) add(id);
  for (const char* name : {"<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|endoftext|>", "<|eom_id|>"}) {
    auto it = piece_ids_.find(name);
    if (it != piece_ids_.end()) add(it->second);
  }
  if (!harmony_) return;
  // A harmony answer is messages: <|end|> closes one, <|return|> the answer, <|call|> a tool call.
  for (const char* name : {"<|return|>", "<|call|>"}) add(piece_ids_.at(name));
  const int32_t end = piece_ids_.at("<|end|>");
  eog_ids_.erase(std::remove(eog_ids_.begin(), eog_ids_.end(), end), eog_ids_.end());
}

void Tokenizer::adopt_harmony_conventions() {
  constexpr std::string_view kShown[] = {"<|channel|>", "<|message|>", "<|start|>", "<|end|>", "<|constrain|>"};
  constexpr std::string_view kRequired[] = {"<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>"};
  auto has = [&](std::string_view name) { return std::find(pieces_.begin(), pieces_.end(), name) != pieces_.end(); };
  harmony_ = std::all_of(std::begin(kRequired), std::end(kRequired), has);
  if (!harmony_) return;
  for (int32_t id = 0; id < vocab_size() && id < static_cast<int32_t>(token_types_.size()); ++id)
    if ((token_types_[id] == kTypeControl || token_types_[id] == kTypeUnknown) &&
        std::find(std::begin(kShown), std::end(kShown), pieces_[id]) != std::end(kShown))
      token_types_[id] = kTypeUserDefined;
}

bool Tokenizer::is_control(int32_t id) const {
  if (id < 0 || id >= static_cast<int32_t>(token_types_.size())) return false;
  return token_types_[id] == kTypeControl || token_types_[id] == kTypeUnknown;
}

bool Tokenizer::is_end_of_generation(int32_t id) const {
  return std::find(eog_ids_.begin(), eog_ids_.end(), id) != eog_ids_.end();
}

int32_t Tokenizer::token_id(std::string_view text) const {
  if (text.empty()) return -1;
  auto it = piece_ids_.find(text);
  if (it != piece_ids_.end()) return it->second;
  const std::vector<int32_t> ids = encode(text, EncodeOptions{/*add_bos=*/false, /*parse_special=*/true});
  return ids.size() == 1 ? ids[0] : -1;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string bytes;
  bool first = true;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) throw Error("decode: token id " + std::to_string(id) + " is out of range");
    std::string b = token_bytes(id);
    if (b.empty()) continue;
    if (first && strip_leading_space_ && b[0] == ' ') b.erase(0, 1);
    first = false;
    bytes += b;
  }
  std::string out;
  out.reserve(bytes.size());
  append_sanitized(bytes, /*at_end=*/true, out);
  return out;
}

std::string IncrementalDetokenizer::push(int32_t id) {
  if (id < 0 || id >= tokenizer_.vocab_size())
    throw Error("detokenize: token id " + std::to_string(id) + " is out of range");
  std::string b = tokenizer_.token_bytes(id);
  if (b.empty()) return {};
  if (first_ && tokenizer_.strips_leading_space() && b[0] == ' ') b.erase(0, 1);
  first_ = false;
  pending_ += b;
  std::string out;
  const size_t held = append_sanitized(pending_, /*at_end=*/false, out);
  pending_.erase(0, pending_.size() - held);
  return out;
}

std::string IncrementalDetokenizer::flush() {
  std::string out;
  append_sanitized(pending_, /*at_end=*/true, out);
  pending_.clear();
  return out;
}

}  // namespace fathom
