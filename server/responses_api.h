#pragma once
// OpenAI's Responses API (POST /v1/responses), stateless (store is always false):
// `input` (a string, or message items with input_text / output_text parts, and function_call /
// function_call_output items for a tool round trip), `instructions`, `max_output_tokens`,
// `temperature`, `top_p`, `stream`, `metadata`, `user`, `text.format`, `reasoning.effort` (chat's
// reasoning_effort), chat's `fathom` extension object, `include` message.output_text.logprobs with
// `top_logprobs` (a plain text answer's token logprobs), function `tools` and `tool_choice` (server/tools.h; calls come back as
// function_call output items; a reasoning model's thinking as a reasoning item). The request
// becomes a chat request (one choice) and runs through the same rules; the result is a
// `response` object, or when streaming the documented event sequence:
// response.created, response.in_progress, response.output_item.added,
// response.content_part.added, response.output_text.delta..., response.output_text.done,
// response.content_part.done, response.output_item.done, response.completed (or
// response.incomplete when max_output_tokens cut it, response.failed on an engine error).
// A reasoning model's <think> span streams live as a reasoning item (output_item.added,
// response.reasoning_text.delta..., .done, output_item.done) before the message item. With tools
// offered, or a harmony model (whose channels may interleave), the text is held to the end (it may
// be calls) and every output item is sent whole then (function calls as output_item.added,
// function_call_arguments.delta / .done, output_item.done). Rejected with a 400 naming the field: previous_response_id / conversation
// (no stored state), tools other than functions, background.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/request.h"
#include "server/reasoning.h"

namespace fathom {

class Model;
struct ApiRequest;
struct ResponseMeta;
struct ServerConfig;

// `raw_body`: the body's JSON text, when there is one: the tools then reach the template in the
// client's key order.
ApiRequest parse_responses_request(const nlohmann::json& body, const Model& model, const ServerConfig& config,
                                   std::string_view raw_body = {});

// The response object for finished text (status "completed", or "incomplete" when the length
// limit ended it). `logprobs`: the text's tokens in chat's shape, for a request that included
// message.output_text.logprobs (plain text answers only: parse_responses_request refuses them with
// tools or a reasoning model).
nlohmann::json response_object(const ApiRequest& req, const ResponseMeta& meta, const std::string& text,
                               FinishReason finish, const RequestUsage& usage,
                               const nlohmann::json& logprobs = nlohmann::json::array());

// Builds the streamed events of one response, numbering them (sequence_number).
class ResponsesStream {
 public:
  ResponsesStream(const ApiRequest& req, const ResponseMeta& meta);
  std::vector<std::string> begin();                      // created ... content_part.added
  // output_text.delta (none for ""); `logprobs`: its tokens' (chat's shape), when asked for.
  std::vector<std::string> delta(const std::string& text, const nlohmann::json& logprobs = nlohmann::json::array());
  std::vector<std::string> end(FinishReason finish, const RequestUsage& usage, const std::string& error);

 private:
  std::string frame(nlohmann::json event);  // "event: <type>\ndata: <json>\n\n"
  // With tools offered or a harmony model the text is held to the end (it may be calls, and
  // harmony's thinking may come after text): every item's events then.
  bool held() const;
  std::vector<std::string> held_items(const nlohmann::json& final_response);
  // A <think> model's pieces as they come: the reasoning item, then the message (thinking_ set).
  void live_piece(const ReasoningPiece& piece, std::vector<std::string>& out);
  // The message's text delta, with the logprobs pending; the message opened first if it is not.
  void text_delta(const std::string& text, std::vector<std::string>& out);
  void open_message(std::vector<std::string>& out);
  void close_reasoning(std::vector<std::string>& out);
  int message_index() const { return reasoning_.empty() ? 0 : 1; }  // after the reasoning item, if any
  const ApiRequest& req_;
  const ResponseMeta& meta_;
  std::string text_;
  nlohmann::json logprobs_ = nlohmann::json::array();  // every token's, for the final response
  nlohmann::json pending_ = nlohmann::json::array();   // tokens whose text has not come out yet
  int64_t sequence_ = 0;
  std::optional<ReasoningSplit> thinking_;  // a <think> model without tools: streamed live
  std::string reasoning_, content_;          // what has streamed of the reasoning item and the message
  bool reasoning_open_ = false, message_open_ = false;
};

}  // namespace fathom
