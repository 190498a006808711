#pragma once
// The rules every generation request obeys, whichever protocol carried it (OpenAI JSON over HTTP
// or gRPC): the served model's names, the prompt against the context, max_tokens' default and
// limits, n, the client-priority policy, stop strings and sampling ranges. Protocol code reads its
// own fields and calls these; a broken rule throws RuleError naming the field, which HTTP answers
// 400 / 404 (an OpenAI error with `param`) and gRPC INVALID_ARGUMENT / NOT_FOUND. Authentication
// (server/auth.h) and cancellation (the engine's RequestHandle) are shared the same way.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "base/error.h"

namespace fathom {

class Model;
struct SamplingParams;
struct ServerConfig;
struct StopConditions;

class RuleError : public Error {
 public:
  enum class Kind { kInvalid, kNotFound };
  RuleError(Kind kind, std::string field, const std::string& message, std::string code = "")
      : Error(message), kind(kind), field(std::move(field)), code(std::move(code)) {}
  Kind kind;
  std::string field;  // the request field at fault ("max_tokens", "sampling.top_p", ...)
  std::string code;   // OpenAI's error code when it has one ("context_length_exceeded"); "": by kind
};

inline constexpr int32_t kMaxTopLogprobs = 20;
inline constexpr size_t kMaxStopStrings = 4;
inline constexpr int64_t kMaxClientPriority = 1000000;  // the range a client may send; clamped after

// An empty name means the served model; otherwise it must be its configured name, path, file name
// or file name without .gguf. Else kNotFound.
void check_served_model(const std::string& name, const ServerConfig& config, const std::string& field);

// The prompt is non-empty and shorter than the context.
void check_prompt_fits(size_t prompt_tokens, const Model& model, const std::string& field);

// The tokens to generate: `asked` must be >= 1, <= limits.max_tokens and fit the context with the
// prompt; absent, limits.default_max_tokens clamped to what the context leaves.
int32_t resolve_max_tokens(std::optional<int64_t> asked, size_t prompt_tokens, const Model& model,
                           const ServerConfig& config, const std::string& field);

// Samples per prompt: [1, limits.max_n], default 1.
int32_t resolve_n(std::optional<int64_t> asked, const ServerConfig& config, const std::string& field);

// A client priority must be within ±kMaxClientPriority; it runs clamped to ±limits.max_priority
// (0 by default: every request equal).
int32_t resolve_priority(std::optional<int64_t> asked, const ServerConfig& config, const std::string& field);

// Appends one stop string: non-empty, at most kMaxStopStrings in all.
void add_stop_string(const std::string& stop, StopConditions& conditions, const std::string& field);

// `value` of the sampling parameter `name` (temperature, top_p, min_p, presence_penalty,
// frequency_penalty, repetition_penalty, logit_bias) within its range, as a float.
float check_sampling_number(std::string_view name, double value, const std::string& field);

// A request's sampling before its own fields: the model's defaults (Model::sampling_defaults: a Hugging
// Face directory's generation_config.json) over the engine's. Throws RuleError naming the metadata key
// when a default is outside what a request may ask: the server checks once at start-up.
SamplingParams default_sampling(const Model& model);

}  // namespace fathom
