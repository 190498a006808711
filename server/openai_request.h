#pragma once
// OpenAI request bodies (JSON) -> engine Requests, with validation. A rejection is an ApiError
// carrying the HTTP status and the fields of the OpenAI error object, or a RuleError from the
// rules HTTP and gRPC share (server/request_rules.h), which the HTTP routes answer 400 / 404.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/request.h"
#include "server/reasoning.h"
#include "server/tools.h"

namespace fathom {

class Model;
struct ServerConfig;

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, const std::string& message, std::string param = "", std::string code = "")
      : std::runtime_error(message), status(status), param(std::move(param)), code(std::move(code)) {}
  int status;         // HTTP status: 400, 401, 404, 413, 429, 500, 503
  std::string param;  // the offending request field, "" for none
  std::string code;   // OpenAI error code, "" for none
};

// The endpoint a request came to. /v1/responses requests are chat requests underneath (kind kChat
// after parsing, ApiRequest::responses set).
enum class ApiKind { kCompletion, kChat, kResponses, kEmbeddings };

struct ApiRequest {
  ApiKind kind = ApiKind::kCompletion;
  Request engine;             // prompt tokens, sampling, stop, n, max_tokens, attention
  std::string model;          // the model name echoed in responses
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool logprobs = false;       // return logprobs (completions: logprobs >= 0; chat: logprobs true)
  int32_t top_logprobs = 0;    // alternatives per token
  // /v1/completions: every prompt (engine.prompt is the first); each runs as its own engine
  // request with engine.n choices, and response choice p·n + c is prompt p's choice c.
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> echo;  // per prompt, its text when "echo" is set (prefixes each choice)
  // POST /v1/responses: the request's parameters the response object echoes (instructions,
  // max_output_tokens, temperature, top_p, metadata, user); null for the other APIs.
  nlohmann::json responses;
  ToolPlan tools;  // chat: function tools offered and how the model must use them
  // chat with a reasoning model's template: answers are split into reasoning_content and content
  // (server/reasoning.h).
  ReasoningMode reasoning;
  int32_t choices() const { return engine.n * static_cast<int32_t>(prompts.empty() ? 1 : prompts.size()); }
};

// Parses a request body; malformed JSON (or absurdly deep nesting) is a 400.
nlohmann::json parse_json_body(const std::string& body);

// The "model" field must name the served model: its configured name, or the model file's
// name with or without ".gguf". Absent is accepted. Unknown -> 404 model_not_found.
void check_model_name(const nlohmann::json& body, const ServerConfig& config);

// POST /v1/completions and /v1/chat/completions bodies. Throw ApiError (400/404).
ApiRequest parse_completion_request(const nlohmann::json& body, const Model& model, const ServerConfig& config);
// `raw_body`: the body's JSON text when there is one (see server/chat_input.h).
ApiRequest parse_chat_request(const nlohmann::json& body, const Model& model, const ServerConfig& config,
                              std::string_view raw_body = {});
// The prompt of a chat body's "messages" (roles, tool_calls, tool results) with `tools` described,
// through the model's chat template; what gRPC's chat input uses too. Sets tools.format to the
// template's call format (server/chat_input.h). Throws ApiError (400).
struct ChatPrompt {
  std::vector<int32_t> ids;
  ReasoningMode reasoning;  // how the answer to this prompt is split (server/reasoning.h)
};
// `raw_body`: JSON text holding the same "tools" in the client's key order (see parse_chat_request).
ChatPrompt encode_chat_body(const nlohmann::json& body, const Model& model, ToolPlan& tools,
                            std::string_view raw_body = {});

// POST /tokenize: {"prompt"|"text": str, "add_special": bool} or {"messages": [...]}.
std::vector<int32_t> parse_tokenize_request(const nlohmann::json& body, const Model& model,
                                            std::string_view raw_body = {});
// POST /detokenize: {"tokens": [ids]}; ids must be in the vocabulary.
std::vector<int32_t> parse_detokenize_request(const nlohmann::json& body, const Model& model);

}  // namespace fathom
