#include "engine/model/bpe_tokenizer.h"

#include <queue>

#include "base/error.h"
#include "base/utf8.h"
#include "engine/model/gguf.h"
#include "engine/model/unicode_nfc.h"

namespace fathom {
namespace {

// GPT-2's byte -> code point table: printable Latin-1 bytes map to themselves, the other 68
// bytes to U+0100.. in byte order, so every byte has a visible, unique character.
struct ByteAlphabet {
  uint32_t cp_of_byte[256];
  std::unordered_map<uint32_t, uint8_t> byte_of_cp;
  ByteAlphabet() {
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      cp_of_byte[b] = printable ? static_cast<uint32_t>(b) : next++;
      byte_of_cp[cp_of_byte[b]] = static_cast<uint8_t>(b);
    }
  }
};
const ByteAlphabet& byte_alphabet() {
  static const ByteAlphabet alphabet;
  return alphabet;
}


// The bytes a vocabulary string stands for: each character of the byte alphabet is one byte.
// Strings with characters outside the alphabet (added tokens stored verbatim) are their own text.
std::string piece_to_bytes(const std::string& piece) {
  const ByteAlphabet& a = byte_alphabet();
  std::string out;
  size_t i = 0;
  while (i < piece.size()) {
    const auto b0 = static_cast<unsigned char>(piece[i]);
    uint32_t cp;
    size_t n;
    if (b0 < 0x80) {
      cp = b0, n = 1;
    } else if ((b0 & 0xE0) == 0xC0 && i + 1 < piece.size()) {
      cp = ((b0 & 0x1Fu) << 6) | (static_cast<unsigned char>(piece[i + 1]) & 0x3Fu), n = 2;
    } else {
      return piece;  // alphabet characters are all below U+0800
    }
    auto it = a.byte_of_cp.find(cp);
    if (it == a.byte_of_cp.end()) return piece;
    out += static_cast<char>(it->second);
    i += n;
  }
  return out;
}

}  // namespace

BpeTokenizer::BpeTokenizer(const GgufFile& file) {
  auto tokens = file.get_string_array("tokenizer.ggml.tokens");
  if (!tokens || tokens->empty()) throw Error(file.path() + ": missing tokenizer.ggml.tokens");
  pieces_ = std::move(*tokens);
  const int32_t n = vocab_size();
  if (auto types = file.get_int_array("tokenizer.ggml.token_type")) {
    if (static_cast<int32_t>(types->size()) != n)
      throw Error(file.path() + ": tokenizer.ggml.token_type has " + std::to_string(types->size()) + " entries for " +
                  std::to_string(n) + " tokens");
    token_types_.assign(types->begin(), types->end());
  } else {
    token_types_.assign(n, 1);
  }
  auto id_key = [&](const char* key) -> int32_t {
    auto v = file.get_int(key);
    if (!v) return -1;
    if (*v < 0 || *v >= n) throw Error(file.path() + ": " + key + " = " + std::to_string(*v) + " is out of range");
    return static_cast<int32_t>(*v);
  };
  bos_id_ = id_key("tokenizer.ggml.bos_token_id");
  eos_id_ = id_key("tokenizer.ggml.eos_token_id");
  add_bos_ = file.get_bool("tokenizer.ggml.add_bos_token").value_or(false) && bos_id_ >= 0;
  add_eos_ = file.get_bool("tokenizer.ggml.add_eos_token").value_or(false) && eos_id_ >= 0;
  const std::string pre = file.get_string("tokenizer.ggml.pre").value_or("default");
  pre_ = pre_tokenizer_for(pre);
  ignore_merges_ = pre == "llama3" || pre == "llama-bpe" || pre == "llama-v3" ||
                   file.get_bool("fathom.ignore_merges").value_or(false);
  if (const auto normalizer = file.get_string("fathom.normalizer")) {
    if (*normalizer != "NFC")
      throw Error(file.path() + ": fathom.normalizer '" + *normalizer + "' is not supported (NFC)");
    nfc_ = true;
  }

  adopt_harmony_conventions();
  index_vocabulary(/*match_user_defined=*/true);
  collect_end_of_generation(file);

  bytes_of_.resize(n);
  for (int32_t id = 0; id < n; ++id) bytes_of_[id] = piece_to_bytes(pieces_[id]);

  const ByteAlphabet& a = byte_alphabet();
  for (int b = 0; b < 256; ++b) {
    std::string s;
    append_utf8(a.cp_of_byte[b], s);
    auto it = piece_ids_.find(s);
    byte_ids_[b] = it == piece_ids_.end() ? -1 : it->second;
  }

  auto merges = file.get_string_array("tokenizer.ggml.merges");
  if (!merges) throw Error(file.path() + ": missing tokenizer.ggml.merges for a gpt2 tokenizer");
  merges_.reserve(merges->size());
  for (size_t rank = 0; rank < merges->size(); ++rank) {
    const std::string& m = (*merges)[rank];
    const size_t space = m.find(' ', 1);  // the left part is never empty; a part may itself be a space-free 'Ġ'
    if (space == std::string::npos) throw Error(file.path() + ": malformed merge '" + m + "'");
    const std::string_view left(m.data(), space), right(m.data() + space + 1, m.size() - space - 1);
    auto l = piece_ids_.find(left), r = piece_ids_.find(right);
    auto res = piece_ids_.find(std::string(left) + std::string(right));
    if (l == piece_ids_.end() || r == piece_ids_.end() || res == piece_ids_.end()) continue;  // cannot apply
    merges_.emplace(pair_key(l->second, r->second), Merge{static_cast<int32_t>(rank), res->second});
  }
}

std::string BpeTokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= vocab_size()) throw Error("token id " + std::to_string(id) + " is out of range");
  if (is_control(id)) return {};
  return bytes_of_[id];
}

// Applies merges to `symbols` in place: always the lowest-ranked adjacent pair, leftmost first
// on ties (as HF tokenizers and llama.cpp do). A heap of candidate pairs over a linked list of
// symbols keeps a w-symbol word at O(w log w).
void BpeTokenizer::merge_word(std::vector<int32_t>& symbols) const {
  const int n = static_cast<int>(symbols.size());
  if (n < 2) return;
  std::vector<int> prev(n), next(n);
  for (int i = 0; i < n; ++i) prev[i] = i - 1, next[i] = i + 1 < n ? i + 1 : -1;
  struct Candidate {
    int32_t rank;
    int left, right;
    int32_t left_id, right_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto consider = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    auto it = merges_.find(pair_key(symbols[left], symbols[right]));
    if (it != merges_.end()) heap.push({it->second.rank, left, right, symbols[left], symbols[right]});
  };
  for (int i = 0; i + 1 < n; ++i) consider(i, i + 1);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    // Stale when either side has merged since (a merged symbol never gets its old id back).
    if (next[c.left] != c.right || symbols[c.left] != c.left_id || symbols[c.right] != c.right_id) continue;
    symbols[c.left] = merges_.at(pair_key(c.left_id, c.right_id)).result;
    symbols[c.right] = -1;
    next[c.left] = next[c.right];
    if (next[c.right] >= 0) prev[next[c.right]] = c.left;
    consider(prev[c.left], c.left);
    consider(c.left, next[c.left]);
  }
  size_t out = 0;
  for (int i = 0; i >= 0; i = next[i]) symbols[out++] = symbols[i];
  symbols.resize(out);
}

void BpeTokenizer::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    auto it = cache_.find(std::string(word));
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> symbols;
  if (ignore_merges_) {
    std::string spelled;  // the word in the byte alphabet, as vocabulary pieces are written
    for (char ch : word) append_utf8(byte_alphabet().cp_of_byte[static_cast<unsigned char>(ch)], spelled);
    auto it = piece_ids_.find(spelled);
    if (it != piece_ids_.end() && (token_types_.empty() || token_types_[it->second] == 1)) {  // a normal token
      out.push_back(it->second);
      return;
    }
  }
  symbols.reserve(word.size());
  for (char ch : word) {
    // A byte the vocabulary cannot spell (SmolLM2 lacks 21, e.g. 0x04 and 0xF1) is dropped, as HF
    // tokenizers does for byte-level BPE without an unknown token; the GGUF's "unknown" id there is
    // <|endoftext|>, which must not appear in the middle of a prompt.
    const int32_t id = byte_ids_[static_cast<unsigned char>(ch)];
    if (id >= 0) symbols.push_back(id);
  }
  merge_word(symbols);
  out.insert(out.end(), symbols.begin(), symbols.end());
  std::lock_guard<std::mutex> lock(cache_mutex_);
  if (cache_.size() >= kCacheLimit) cache_.clear();
  cache_.emplace(std::string(word), std::move(symbols));
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text, const EncodeOptions& opts) const {
  std::vector<int32_t> ids;
  if (opts.add_bos && add_bos_) ids.push_back(bos_id_);
  std::vector<std::string_view> words;
  for (const TextSpan& span : split_special(text, opts)) {
    if (span.special_id >= 0) {
      ids.push_back(span.special_id);
      continue;
    }
    words.clear();
    const std::string normalized = nfc_ ? nfc(span.text) : std::string();
    pre_tokenize(pre_, nfc_ ? std::string_view(normalized) : span.text, words);
    for (std::string_view w : words) encode_word(w, ids);
  }
  return ids;
}

}  // namespace fathom
