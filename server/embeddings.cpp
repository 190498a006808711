#include "server/embeddings.h"

#include <algorithm>
#include <cstring>

#include "engine/model/model.h"
#include "server/config.h"
#include "server/json_fields.h"
#include "server/known_fields.h"
#include "server/request_rules.h"

namespace fathom {
namespace {

using nlohmann::json;

[[noreturn]] void bad(const std::string& field, const std::string& message) {
  throw RuleError(RuleError::Kind::kInvalid, field, message);
}

std::vector<int32_t> ids_of(const json& array, const Model& model) {
  std::vector<int32_t> ids;
  ids.reserve(array.size());
  for (const json& v : array) {
    if (!v.is_number_integer()) bad("input", "'input' must be a string, an array of strings or of token-id arrays");
    const int64_t id = integer_value(v);
    if (id < 0 || id >= model.vocab())
      bad("input", "token id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(model.vocab()) + ")");
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

bool all_integers(const json& array) {
  return std::all_of(array.begin(), array.end(), [](const json& v) { return v.is_number_integer(); });
}


}  // namespace

std::vector<int32_t> embedding_tokens(const Tokenizer& tokenizer, const std::string& text) {
  std::vector<int32_t> ids = tokenizer.encode(text);
  if (tokenizer.add_eos() && (ids.empty() || ids.back() != tokenizer.eos_id())) ids.push_back(tokenizer.eos_id());
  return ids;
}

Pooling served_pooling(const Model& model, const ServerConfig& config) {
  const std::string& p = config.embedding_pooling;
  if (p.empty()) return model.config().pooling;
  return p == "mean" ? Pooling::kMean : p == "cls" ? Pooling::kCls : p == "last" ? Pooling::kLast : Pooling::kNone;
}

void check_embedding_request(const EmbeddingRequest& r, std::optional<int64_t> dimensions, const Model& model,
                             const std::string& field) {
  if (r.pooling == Pooling::kNone)
    throw RuleError(RuleError::Kind::kInvalid, "model",
                    "this model serves no embeddings: its file names no pooling (" + model.config().arch_name +
                        ".pooling_type); start the server with --embedding-pooling mean|cls|last to pool its hidden "
                        "states",
                    "embeddings_not_served");
  if (r.inputs.empty()) bad(field, "'" + field + "' is empty");
  if (r.inputs.size() > kMaxEmbeddingInputs)
    bad(field, "at most " + std::to_string(kMaxEmbeddingInputs) + " inputs per request");
  int64_t total = 0;
  for (const std::vector<int32_t>& in : r.inputs) {
    if (in.empty()) bad(field, "an input is empty");
    if (static_cast<int64_t>(in.size()) > model.config().context_length)
      throw RuleError(RuleError::Kind::kInvalid, field,
                      "an input has " + std::to_string(in.size()) + " tokens; this model's maximum context length is " +
                          std::to_string(model.config().context_length),
                      "context_length_exceeded");
    total += static_cast<int64_t>(in.size());
  }
  if (total > kMaxEmbeddingTokens)
    bad(field, "the inputs have " + std::to_string(total) + " tokens; at most " + std::to_string(kMaxEmbeddingTokens) +
                   " per request");
  if (dimensions && *dimensions != model.config().dim)
    bad("dimensions", "this model's embeddings have " + std::to_string(model.config().dim) +
                          " dimensions; its file says nothing of training for shorter ones (Matryoshka), so " +
                          std::to_string(*dimensions) + " is refused");
}

EmbeddingRequest parse_embeddings_request(const json& body, const Model& model, const ServerConfig& config) {
  check_known_fields(body, ApiKind::kEmbeddings, config);
  EmbeddingRequest r;
  r.pooling = served_pooling(model, config);
  const auto in = body.find("input");
  if (in == body.end()) bad("input", "'input' is required");
  const std::string shapes = "'input' must be a string, an array of strings or of token-id arrays";
  if (in->is_string()) {
    r.inputs.push_back(embedding_tokens(model.tokenizer(), in->get<std::string>()));
  } else if (in->is_array() && !in->empty() && all_integers(*in)) {
    r.inputs.push_back(ids_of(*in, model));
  } else if (in->is_array()) {
    if (in->size() > kMaxEmbeddingInputs) bad("input", "at most " + std::to_string(kMaxEmbeddingInputs) + " inputs per request");
    for (const json& one : *in) {
      if (one.is_string()) r.inputs.push_back(embedding_tokens(model.tokenizer(), one.get<std::string>()));
      else if (one.is_array() && all_integers(one)) r.inputs.push_back(ids_of(one, model));
      else bad("input", shapes);
    }
  } else {
    bad("input", shapes);
  }
  if (const auto f = body.find("encoding_format"); f != body.end() && !f->is_null()) {
    if (!f->is_string() || (*f != "float" && *f != "base64")) bad("encoding_format", "'encoding_format' must be \"float\" or \"base64\"");
    r.base64 = *f == "base64";
  }
  std::optional<int64_t> dimensions;
  if (const auto d = body.find("dimensions"); d != body.end() && !d->is_null()) {
    if (!d->is_number_integer()) bad("dimensions", "'dimensions' must be a positive integer");
    dimensions = integer_value(*d);
    if (*dimensions < 1) bad("dimensions", "'dimensions' must be a positive integer");
  }
  if (const auto u = body.find("user"); u != body.end() && !u->is_null() && !u->is_string()) bad("user", "'user' must be a string");
  check_embedding_request(r, dimensions, model, "input");
  return r;
}

std::string base64_floats(const std::vector<float>& v) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string bytes(v.size() * sizeof(float), '\0');
  for (size_t i = 0; i < v.size(); ++i) {  // little-endian whatever the host
    uint32_t u;
    std::memcpy(&u, &v[i], sizeof u);
    for (int b = 0; b < 4; ++b) bytes[i * 4 + b] = static_cast<char>((u >> (8 * b)) & 0xff);
  }
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const size_t left = bytes.size() - i;
    const uint32_t chunk = (static_cast<uint8_t>(bytes[i]) << 16) | (left > 1 ? static_cast<uint8_t>(bytes[i + 1]) << 8 : 0) |
                           (left > 2 ? static_cast<uint8_t>(bytes[i + 2]) : 0);
    out += kAlphabet[(chunk >> 18) & 63];
    out += kAlphabet[(chunk >> 12) & 63];
    out += left > 1 ? kAlphabet[(chunk >> 6) & 63] : '=';
    out += left > 2 ? kAlphabet[chunk & 63] : '=';
  }
  return out;
}

json embeddings_response(const EmbeddingRequest& request, const EmbeddingResult& result, const std::string& model_name) {
  json data = json::array();
  for (size_t i = 0; i < result.vectors.size(); ++i) {
    json item = {{"object", "embedding"}, {"index", i}};
    if (request.base64) item["embedding"] = base64_floats(result.vectors[i]);
    else item["embedding"] = result.vectors[i];
    data.push_back(std::move(item));
  }
  return {{"object", "list"},
          {"data", std::move(data)},
          {"model", model_name},
          {"usage", {{"prompt_tokens", result.prompt_tokens}, {"total_tokens", result.prompt_tokens}}}};
}

}  // namespace fathom
