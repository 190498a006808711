#pragma once
// Function tools for /v1/chat/completions: `tools` ({"type": "function", "function": {name,
// description, parameters, strict}}), `tool_choice` (none, auto, required, or a named function),
// assistant `tool_calls` and `tool` messages in the conversation.
//
// The tools are described to the model in a system section (the Hermes / Qwen convention that
// ChatML models are trained on: <tools> signatures, calls as <tool_call>{"name", "arguments"}
// </tool_call>, results as <tool_response>). A named or required tool_choice constrains the output
// token by token (engine/constraint): named = the function's parameters schema, so the text *is*
// the arguments; required = one of {"name": const, "arguments": schema}, or with
// parallel_tool_calls true a non-empty array of them. With auto the model
// may answer in text or in <tool_call> blocks, which are parsed out. Streaming: server/tool_stream.h.
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/request.h"

namespace fathom {

class Tokenizer;

struct ToolSpec {
  std::string name;
  std::string description;
  nlohmann::json parameters;  // a JSON Schema object
  bool strict = false;
};

struct ToolPlan {
  enum class Mode { kNone, kAuto, kRequired, kNamed };
  Mode mode = Mode::kNone;
  std::vector<ToolSpec> tools;
  std::string named;  // kNamed: the function to call
  // parallel_tool_calls: true lets kRequired make several calls (a JSON array of them). Unlike
  // OpenAI's default it is off unless asked for: SmolLM2, allowed an array, kept adding calls
  // until max_tokens.
  bool parallel = false;
  // How the model writes calls: Hermes <tool_call>{"name", "arguments"}</tool_call> blocks (the
  // server's own tool section, Qwen, Hermes), Llama 3.x's bare {"name", "parameters"} object,
  // optionally after <|python_tag|> (its template's own tool prompt; server/chat_input.h), or
  // Mistral's [TOOL_CALLS] followed by a JSON list of {"name", "arguments"} (Nemo, 7B v0.3) or by
  // name[ARGS]{arguments} per call (Small 3.2, Devstral, Ministral 3), with call ids of 9
  // letters and digits (its templates refuse others), or gpt-oss's harmony messages to
  // functions.NAME (server/harmony.h, which reads the whole answer: thinking, text and calls).
  enum class Format { kHermes, kLlamaJson, kMistral, kHarmony };
  Format format = Format::kHermes;
  bool offered() const { return mode != Mode::kNone && !tools.empty(); }
  const char* arguments_key() const { return format == Format::kLlamaJson ? "parameters" : "arguments"; }
};

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON text
};

// `tools` + `tool_choice`; throws ApiError 400 naming the field.
ToolPlan parse_tools(const nlohmann::json& body);
// A call of an assistant message in the conversation, checked.
struct PastToolCall {
  std::string id;  // "" when the client gave none
  std::string name;
  nlohmann::ordered_json arguments;  // the call's JSON text parsed, in its key order ({} when absent)
};
// An assistant message's `tool_calls`; throws ApiError 400 naming `param` for a malformed one.
std::vector<PastToolCall> parse_past_tool_calls(const nlohmann::json& tool_calls, const std::string& param);
// The system-prompt section describing the tools ("" when none are offered).
std::string tools_prompt(const ToolPlan& plan);
// An assistant message's tool_calls and a tool message's content, as the model sees them.
std::string render_tool_calls(const nlohmann::json& tool_calls, const std::string& param);
std::string render_tool_result(const std::string& content);
// The output constraint a named / required tool_choice implies (kind kNone otherwise); for harmony,
// a call in its own format after the analysis the model may open with (server/harmony.h).
OutputConstraint tool_constraint(const ToolPlan& plan);
// The calls in a finished answer; `content` gets the text outside them. Empty when none.
std::vector<ToolCall> extract_tool_calls(const ToolPlan& plan, const std::string& text, std::string& content,
                                         const std::string& id_prefix);
// The calls of a finished answer, as every API reports them: parsed when it stopped, and always
// for a named call (its text is the call, even when the length limit cut it); none otherwise
// (`content` then gets the whole text).
std::vector<ToolCall> answer_tool_calls(const ToolPlan& plan, const std::string& text, FinishReason finish,
                                        std::string& content, const std::string& id_prefix);
nlohmann::json tool_calls_json(const std::vector<ToolCall>& calls, bool with_index);
// The id of call `index` of an answer whose calls' ids start with `prefix`: prefix + index, or for
// Mistral's format 9 letters and digits derived from both.
std::string tool_call_id(const ToolPlan& plan, const std::string& prefix, size_t index);
// The text that opens a call in the auto mode ("<tool_call>", "[TOOL_CALLS]"; "" for Llama's).
std::string_view call_marker(ToolPlan::Format format);
// The control tokens of `format` the model writes in a call (<|python_tag|>, [TOOL_CALLS], [ARGS],
// [CALL_ID]; harmony's markers): the output's text must show them for the call to be parsed
// (Request::shown_tokens).
std::vector<std::string_view> call_control_tokens(ToolPlan::Format format);
// The ids of those that are control tokens of `tokenizer`'s vocabulary (none when no tools are
// offered, except for harmony, whose markers also separate the thinking from the answer).
std::vector<int32_t> shown_call_tokens(const ToolPlan& plan, const Tokenizer& tokenizer);

}  // namespace fathom
