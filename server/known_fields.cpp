#include "server/known_fields.h"

#include <set>
#include <string_view>

#include "server/config.h"

namespace fathom {
namespace {

using Fields = std::set<std::string_view>;

// Every generation endpoint: OpenAI's sampling fields and fathom's extensions (top_k, min_p,
// repetition_penalty and ignore_eos as vLLM spells them; the "fathom" object).
const Fields kCommon = {"model", "stream", "stream_options", "temperature", "top_p", "n", "seed", "stop",
                        "presence_penalty", "frequency_penalty", "logit_bias", "max_tokens", "user",
                        "response_format", "top_k", "min_p", "repetition_penalty", "ignore_eos", "fathom",
                        // peers' structured outputs (server/openai_request.cpp, parse_peer_constraint)
                        "grammar", "json_schema", "guided_json", "guided_grammar", "structured_outputs"};
const Fields kCompletion = {"prompt", "echo", "logprobs", "best_of", "suffix"};
const Fields kChat = {"messages", "logprobs", "top_logprobs", "max_completion_tokens", "tools", "tool_choice",
                      "parallel_tool_calls", "functions", "function_call", "store", "metadata", "service_tier",
                      "safety_identifier", "prompt_cache_key",
                      // vLLM / SGLang: variables for the model's chat template (enable_thinking, ...)
                      "chat_template_kwargs", "reasoning_effort"};
const Fields kResponses = {"model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "metadata",
                           "user", "text", "tools", "tool_choice", "parallel_tool_calls", "stream", "store",
                           "previous_response_id", "conversation", "reasoning", "background", "prompt", "include",
                           "service_tier", "safety_identifier", "prompt_cache_key", "fathom", "top_logprobs"};
const Fields kEmbeddings = {"model", "input", "encoding_format", "dimensions", "user"};

bool known(std::string_view key, ApiKind kind) {
  switch (kind) {
    case ApiKind::kCompletion: return kCommon.count(key) || kCompletion.count(key);
    case ApiKind::kChat: return kCommon.count(key) || kChat.count(key);
    case ApiKind::kResponses: return kResponses.count(key);
    case ApiKind::kEmbeddings: return kEmbeddings.count(key);
  }
  return false;
}

}  // namespace

void check_known_fields(const nlohmann::json& body, ApiKind kind, const ServerConfig& config) {
  if (!config.reject_unknown_fields) return;
  for (auto it = body.begin(); it != body.end(); ++it)
    if (!known(it.key(), kind)) {
      const std::string key = it.key().size() > 64 ? it.key().substr(0, 64) + "..." : it.key();
      throw ApiError(400, "unrecognized request argument supplied: " + key, key, "unknown_parameter");
    }
}

}  // namespace fathom
