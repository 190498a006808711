#pragma once
// tokenizer.json (+ tokenizer_config.json, generation_config.json, chat_template.jinja) of a Hugging
// Face checkpoint -> the tokenizer.ggml.* metadata llama.cpp's converter writes, at load: a
// byte-level BPE vocabulary (tokens, token types, merges), the pre-tokenizer recognised by its
// regular expression among those bpe_pretokenizer.h implements, BOS/EOS, every end-of-generation
// id and the chat template. Anything that would tokenize differently from the `tokenizers` package
// and that fathom does not implement is a load error naming it.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/model/gguf.h"

namespace fathom {

struct HfTokenizerFiles {
  std::string tokenizer_json;                         // required
  std::optional<std::string> tokenizer_config_json;   // optional files: nullopt when absent
  std::optional<std::string> generation_config_json;
  std::optional<std::string> chat_template_jinja;     // chat_template.jinja (transformers >= 4.43)
  std::string dir;                                    // for messages: "<dir>/tokenizer.json: ..."
};

// Adds the tokenizer.ggml.* keys (and fathom.eog_token_ids: every EOS id of the checkpoint) to
// `metadata`. `vocab_rows`: the embedding's rows (config.json vocab_size): the vocabulary is padded
// to it as llama.cpp pads (unused "[PAD<i>]" tokens), and no token id may reach it. `config_eos` and
// `config_bos`: config.json's ids, the last fallback. Throws fathom::Error naming file and reason.
void hf_tokenizer_metadata(const HfTokenizerFiles& files, int64_t vocab_rows, const std::vector<int64_t>& config_eos,
                           std::optional<int64_t> config_bos, std::map<std::string, GgufValue>& metadata);

}  // namespace fathom
