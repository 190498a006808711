#pragma once
// GPT-2 style byte-level BPE (tokenizer.ggml.model = "gpt2"): text -> special-token split ->
// pre-tokenizer words (tokenizer.ggml.pre) -> each word's bytes spelled in GPT-2's
// byte-to-unicode alphabet -> merges applied lowest rank first (rank = position in
// tokenizer.ggml.merges), with a cache of recent words.
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/model/bpe_pretokenizer.h"
#include "engine/model/tokenizer.h"

namespace fathom {

class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(const GgufFile& file);
  std::vector<int32_t> encode(std::string_view text, const EncodeOptions& opts = {}) const override;
  std::string token_bytes(int32_t id) const override;

 private:
  struct Merge {
    int32_t rank;    // position in tokenizer.ggml.merges: lower merges first
    int32_t result;  // id of the merged token
  };
  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  void merge_word(std::vector<int32_t>& symbols) const;

  PreTokenizer pre_;
  // Llama 3's vocabularies (tokenizer.json's "ignore_merges"): a word that is itself a token is
  // that token, whatever the merges would make of it (llama.cpp: the llama3 pre-tokenizer names;
  // fathom.ignore_merges: a tokenizer.json's other than Llama 3's, e.g. gpt-oss's).
  bool ignore_merges_ = false;
  // tokenizer.json's NFC normalizer (Qwen 2/3; fathom.normalizer): plain text in NFC before
  // pre-tokenization. GGUF files carry none (llama.cpp does not normalise).
  bool nfc_ = false;
  std::unordered_map<uint64_t, Merge> merges_;  // (left id, right id) -> merge
  int32_t byte_ids_[256];                       // id of the single-character token of each byte (-1: none)
  std::vector<std::string> bytes_of_;           // per token: its bytes (byte alphabet decoded)

  static constexpr size_t kCacheLimit = 1 << 16;  // words; the cache is cleared when it fills
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace fathom
