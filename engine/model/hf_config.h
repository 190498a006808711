#pragma once
// config.json of a Hugging Face checkpoint -> the GGUF metadata llama.cpp's converter would write
// for it (general.architecture and the <arch>.* keys), at load. Every key of config.json is either
// translated, checked to be neutral, or known to change nothing at inference (dropout, dtype, ...):
// any other key is a load error naming it, never a model that runs without it.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/model/gguf.h"

namespace fathom {

struct HfConfig {
  std::string arch;                            // general.architecture: llama, qwen2, qwen3, qwen3moe, phi3, gemma*
  std::map<std::string, GgufValue> metadata;   // general.architecture, <arch>.*, fathom.rope_neox, fathom.norm_offset
  // Tensors the translation computes, with their GGUF names (longrope's rope_factors_long/short).
  std::map<std::string, std::vector<float>> extra_tensors;
  std::optional<bool> tie_word_embeddings;     // absent: decided by whether lm_head.weight exists
  int64_t vocab_size = 0;                      // the embedding's rows
  std::vector<int64_t> eos_ids;                // config.json's eos_token_id (an int or a list)
  std::optional<int64_t> bos_id;
  // Gemma3ForConditionalGeneration: the text model's tensors are under language_model.model.* or
  // model.language_model.*, beside a vision tower and projector that are not served (hf_dir.cpp
  // skips them).
  bool multimodal = false;
};

// `path` names the file in messages. Throws fathom::Error("<path>: ...") for invalid JSON, an
// architecture fathom does not load from a directory, a missing or out-of-range value, and any key
// it does not implement. Gemma3ForConditionalGeneration's config.json is read as its text_config
// (the text model, which fathom serves), its vision keys as knowingly unused.
HfConfig hf_config_from_json(std::string_view text, const std::string& path);

}  // namespace fathom
