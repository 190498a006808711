#pragma once
// One streamed chat choice with tools offered, as OpenAI streams it: text is sent as it is
// generated whenever it cannot be (part of) a tool call.
//   named tool_choice: the text *is* the call's arguments (the output is constrained to its
//     schema): the first delta carries the call's id and name, every later one an arguments piece;
//   auto: content streams like any text, except a tail that could begin "<tool_call>" (Mistral's:
//     "[TOOL_CALLS]"; held, as a stop string would be); from the marker on, the rest is held and
//     parsed at the end (tool_calls, finish_reason "tool_calls"; or content again when it holds no
//     valid call);
//     Llama 3.x's format: an answer starting with '{' or <|python_tag|> is held, any other streams;
//   required: the text is {"name", "arguments"} and is held to the end.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/request.h"
#include "server/tools.h"

namespace fathom {

class ToolCallStream {
 public:
  ToolCallStream(const ToolPlan& plan, std::string call_id_prefix) : plan_(plan), id_prefix_(std::move(call_id_prefix)) {}
  // The chat `delta` objects (without role) to send for the next piece of text; may be none.
  std::vector<nlohmann::json> push(const std::string& text);
  // The last deltas; `reason` gets the finish_reason to send ("tool_calls" when calls were made).
  std::vector<nlohmann::json> finish(FinishReason finish, nlohmann::json& reason);

 private:
  const ToolPlan& plan_;
  std::string id_prefix_;
  bool header_sent_ = false;  // named: the call's id and name went out
  std::string pending_;       // auto: content not sent yet (a possible call marker's prefix)
  std::string held_;          // auto from the call marker on (Llama: a call), required: everything
  bool plain_ = false;        // auto, Llama: the answer is not a call; it streams as it comes

  std::vector<nlohmann::json> push_llama(const std::string& text);
};

}  // namespace fathom
