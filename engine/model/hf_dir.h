#pragma once
// A Hugging Face model directory (config.json, model.safetensors or model.safetensors.index.json
// and its shards, tokenizer.json, tokenizer_config.json, generation_config.json,
// chat_template.jinja) translated at load into the artefacts a GGUF file gives: metadata as
// llama.cpp's convert_hf_to_gguf.py would write it (hf_config.h, hf_tokenizer.h) and tensors that
// are views into the mapped shards under their GGUF names (F32, F16, BF16; no copy), but gpt-oss's
// fused experts, transposed, split or repacked into owned copies (hf_gpt_oss.h). Everything
// after this (ModelConfig, ModelWeights, Tokenizer, the chat template) is the GGUF path unchanged.
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/model/gguf.h"

namespace fathom {

// Throws fathom::Error("<dir>/<file>: <reason>") for a missing or malformed file, an unsupported
// architecture, key, dtype or tokenizer, a shard index naming a path outside the directory, or a
// tensor listed twice.
std::unique_ptr<GgufFile> open_hf_directory(const std::string& dir);

// The tokenizer files of a directory alone (tokenizer.json and the optional tokenizer_config.json,
// generation_config.json, chat_template.jinja; config.json only for vocab_size and token ids when
// it exists): a metadata-only GgufFile for Tokenizer::from_gguf (tools/tokenize, the tests).
std::unique_ptr<GgufFile> open_hf_tokenizer(const std::string& dir);

// open_hf_directory for a directory, GgufFile::open otherwise.
std::unique_ptr<GgufFile> open_model_file(const std::string& path);

// The GGUF name of a checkpoint tensor of architecture `arch` (general.architecture; llama.cpp's
// tables, which name llama's, qwen2's, qwen3's, qwen3moe's and phi3's tensors alike, and gemma2's and
// gemma3's norms their own way, gpt-oss's sinks, router and pre-MLP norm llama.cpp's way), or `hf_name` itself when it has none, or names a layer at or past
// `n_layers`: the weights loader then refuses it as unused, by that name.
std::string gguf_tensor_name(const std::string& hf_name, int64_t n_layers, std::string_view arch);

}  // namespace fathom
