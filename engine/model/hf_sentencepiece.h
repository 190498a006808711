#pragma once
// A SentencePiece-style tokenizer.json (Llama 2, Mistral, Gemma: a BPE `model` with `byte_fallback`,
// spaces written as U+2581 "▁") -> what SentencePieceTokenizer reads from a GGUF: per-token scores
// that make libsentencepiece's BPE merge exactly as the `tokenizers` package's does, and how the
// space prefix goes on. Only the shapes transformers' Llama/Gemma converters write are read; any
// other normalizer, pre-tokenizer or decoder, and any merge list libsentencepiece cannot follow
// exactly, is a load error naming it.
#include <cstdint>
#include <string>
#include <vector>

#include "engine/model/hf_json.h"

namespace fathom::hf {

// How a run of text between added tokens reaches the BPE, from tokenizer.json's normalizer,
// pre_tokenizer and decoder.
struct SpmText {
  // Prepend("▁") normalizer (Llama 2's legacy form): every run starts with ▁, spaces or not
  // (tokenizer.ggml.add_space_prefix, libsentencepiece's own dummy prefix).
  bool prepend_each = false;
  // Metaspace pre-tokenizer's prepend_scheme: "first" (only the run at the start of the text) or
  // "always"; either skips a run that already starts with a space or ▁. Empty: no such prefix.
  std::string metaspace;
};
SpmText spm_text(const Reader& r, const Json& tok);

// Token types as llama.cpp writes them (hf_tokenizer.cpp's constants).
constexpr int32_t kSpmNormal = 1, kSpmControl = 3, kSpmUserDefined = 4, kSpmByte = 6;

// Per token, its score for libsentencepiece: -(1 + rank of the first merge that makes it), 0 for a
// token no merge makes (a user-defined one of those is then matched in the raw text only). libsentencepiece merges the adjacent pair whose concatenation is a piece of the
// highest score, leftmost first; `tokenizers` merges the listed pair of the lowest rank, leftmost
// first. The two agree when (each refused otherwise): the merges making one token are consecutive;
// every pair of normal or user-defined tokens whose concatenation is such a token (normal, or
// user-defined and made by a merge) is listed; every
// character of such a token is a token itself (tokenizers falls back to bytes before merging,
// libsentencepiece after); no merge makes a byte or unused token. A merge making a control token is
// kept: libsentencepiece never makes one from text, tokenizers only when special tokens are not
// parsed (its text is matched as the special token otherwise).
std::vector<float> spm_scores(const Reader& r, const Json& merges, const std::vector<std::string>& tokens,
                              const std::vector<int32_t>& types);

}  // namespace fathom::hf
