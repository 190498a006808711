#pragma once
// Embeddings (OpenAI's POST /v1/embeddings, gRPC Embed): what a request asks for, the rules it
// obeys whichever protocol carried it, and OpenAI's response object. The run through the engine is
// server/embedding_run.h.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/model/model_config.h"

namespace fathom {

class Model;
class Tokenizer;
struct ServerConfig;

inline constexpr size_t kMaxEmbeddingInputs = 2048;          // per request, as OpenAI's API
inline constexpr int64_t kMaxEmbeddingTokens = int64_t{1} << 20;  // summed over a request's inputs

// The pooling embeddings are served with: config.embedding_pooling when set ("none" turns them
// off), else the model's own (<arch>.pooling_type). kNone: the model serves no embeddings.
Pooling served_pooling(const Model& model, const ServerConfig& config);

// A text input's tokens: as a completion prompt's (BOS where the vocabulary asks for it), then EOS
// where the vocabulary asks for that too (tokenizer.ggml.add_eos_token), as llama.cpp and the
// models' Hugging Face tokenizers do.
std::vector<int32_t> embedding_tokens(const Tokenizer& tokenizer, const std::string& text);

struct EmbeddingRequest {
  std::vector<std::vector<int32_t>> inputs;  // token ids, one list per input
  Pooling pooling = Pooling::kNone;
  bool base64 = false;  // encoding_format "base64": little-endian float32 bytes, base64-encoded
  int32_t priority = 0;
};

// Throws RuleError (field `field`) unless the model serves embeddings, there are 1..2048 inputs,
// each non-empty and within the context, and kMaxEmbeddingTokens in all; and unless `dimensions`
// (when given) is the model's width: a model's metadata says nothing of Matryoshka training, so a
// truncated vector would be a different, untrained embedding.
void check_embedding_request(const EmbeddingRequest& r, std::optional<int64_t> dimensions, const Model& model,
                             const std::string& field);

// The body of POST /v1/embeddings: input (a string, an array of strings, an array of token ids or
// an array of such arrays), encoding_format, dimensions, user. Throws RuleError naming the field.
EmbeddingRequest parse_embeddings_request(const nlohmann::json& body, const Model& model, const ServerConfig& config);

struct EmbeddingResult {
  std::vector<std::vector<float>> vectors;  // per input: dim floats, unit L2 norm
  int64_t prompt_tokens = 0;
};

// OpenAI's response object: {"object": "list", "data": [{"object": "embedding", "index", "embedding"}],
// "model", "usage": {"prompt_tokens", "total_tokens"}}.
nlohmann::json embeddings_response(const EmbeddingRequest& request, const EmbeddingResult& result,
                                   const std::string& model_name);

// `v` as OpenAI's base64 encoding_format: its float32 bytes, little-endian, in base64.
std::string base64_floats(const std::vector<float>& v);

}  // namespace fathom
