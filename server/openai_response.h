#pragma once
// OpenAI response bodies: whole responses, SSE chunks and error objects, built from the
// engine's StreamEvents. Token text in logprobs comes from Tokenizer::token_bytes and may be
// part of a UTF-8 character: always serialise with dump_json (invalid UTF-8 -> U+FFFD).
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/utf8.h"
#include "engine/request.h"
#include "server/openai_request.h"

namespace fathom {

class Tokenizer;

// What one choice produced so far (non-streaming responses accumulate every event here).
struct ChoiceOutput {
  std::string text;
  std::vector<int32_t> token_ids;
  std::vector<SampledToken> logprobs;
  std::vector<SampledToken> prompt_logprobs;  // echo with logprobs: the prompt's tokens, first
  FinishReason finish = FinishReason::kNone;
  std::string error;
};

// Identity shared by every body of one response.
struct ResponseMeta {
  std::string id;       // "cmpl-…" / "chatcmpl-…"
  int64_t created = 0;  // unix seconds
  std::string model;
  std::string request_id;  // the transport's X-Request-Id (logs); "" when there is none
};

std::string dump_json(const nlohmann::json& j);

// OpenAI's finish_reason: "stop", "length"; a cancelled request reports "abort" (as vLLM does).
const char* api_finish_reason(FinishReason r);

// {"error": {"message", "type", "param", "code"}}; type follows the status.
nlohmann::json error_body(int status, const std::string& message, const std::string& param = "",
                          const std::string& code = "");

nlohmann::json usage_json(const RequestUsage& usage);

// Whole (non-streaming) responses.
nlohmann::json completion_response(const ApiRequest& req, const ResponseMeta& meta,
                                   const std::vector<ChoiceOutput>& choices, const RequestUsage& usage,
                                   const Tokenizer& tokenizer);
nlohmann::json chat_response(const ApiRequest& req, const ResponseMeta& meta, const std::vector<ChoiceOutput>& choices,
                             const RequestUsage& usage, const Tokenizer& tokenizer);

// One streamed chunk for one event. `text_offset` is the choice's completion-text offset of
// the event's first token (completions logprobs); advanced past the event's tokens.
// `first` marks the choice's first chunk (chat sends the assistant role there).
nlohmann::json stream_chunk(const ApiRequest& req, const ResponseMeta& meta, const StreamEvent& event, bool first,
                            Utf8Offset& text_offset, const Tokenizer& tokenizer);
// The final usage chunk of stream_options.include_usage: empty choices plus usage.
nlohmann::json usage_chunk(const ApiRequest& req, const ResponseMeta& meta, const RequestUsage& usage);

// One chunk of a streamed chat choice carrying `delta` (the first also the assistant role),
// `finish_reason` (null until the choice's last chunk) and `logprobs` (chat_logprobs_json, or
// null): what server/tool_stream.h's and server/harmony.h's deltas go in.
nlohmann::json chat_delta_chunk(const ApiRequest& req, const ResponseMeta& meta, int32_t choice, nlohmann::json delta,
                                bool first, const nlohmann::json& finish_reason,
                                nlohmann::json logprobs = nullptr);
// Chat's logprobs object for `tokens`: {"content": [{token, logprob, bytes, top_logprobs}], "refusal"}.
nlohmann::json chat_logprobs_json(const std::vector<SampledToken>& tokens, const Tokenizer& tokenizer);

// The prefix choice `choice`'s tool-call ids derive from ("call_<response id>_<choice>_"; tool_call_id in
// server/tools.h appends the call's index, or makes Mistral's 9 characters of it).
std::string tool_call_id_prefix(const ResponseMeta& meta, size_t choice);

// "data: <json>\n\n" and the terminating "data: [DONE]\n\n".
std::string sse_frame(const nlohmann::json& j);
inline constexpr const char* kSseDone = "data: [DONE]\n\n";

}  // namespace fathom
