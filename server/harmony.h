#pragma once
// gpt-oss's "harmony" response format (OpenAI's open-weight models). An answer is a run of
// messages, each a header, <|message|> and a body:
//   <|channel|>analysis<|message|>THINKING<|end|><|start|>assistant<|channel|>final<|message|>ANSWER
//   <|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}
// The prompt ends with "<|start|>assistant", so the first header has no <|start|>. A header names
// the channel (analysis: reasoning; final: the answer; commentary: a preamble to the user, or a
// tool call) and, for a call, the recipient "to=functions.NAME" (before or after the channel),
// then optionally a content type ("<|constrain|>json" or "json"). A body ends at <|end|>, or at
// <|call|> / <|return|>, which end generation (the vocabulary's end-of-generation tokens: the text
// usually just stops there).
//
// HarmonySplit reads the text as it streams, as llama.cpp and vLLM serve gpt-oss: analysis ->
// reasoning_content; final and commentary without a recipient -> content; a message to
// functions.NAME -> a tool call when NAME is offered, its body is a JSON object and the message is
// complete (closed by a marker, or the answer stopped on its own). Bodies of one kind in separate
// messages are joined by "\n". Whatever does not read as harmony is content, as written: text where
// a header should start (a model that writes none), a header that cannot be read or is longer than
// kMaxHeader bytes, a call that is not valid. Text that may begin a marker is held back until known.
#include <string>
#include <string_view>
#include <vector>

#include "engine/model/chat_template.h"
#include "engine/request.h"
#include "server/tools.h"

namespace fathom {

struct HarmonyPiece {
  std::string reasoning;
  std::string content;
  std::vector<ToolCall> calls;  // complete calls, in order
};

class HarmonySplit {
 public:
  static constexpr size_t kMaxHeader = 256;
  // `plan`: the functions a call may name (none when no tools are offered or tool_choice is none);
  // `id_prefix`: call ids are tool_call_id(plan, id_prefix, i).
  HarmonySplit(const ToolPlan& plan, std::string id_prefix) : plan_(plan), id_prefix_(std::move(id_prefix)) {}
  // What the next piece of text completes.
  HarmonyPiece push(std::string_view text);
  // The rest, when the choice ends: a call still open is complete only if `finish` is kStop; a
  // header the length limit cut is dropped (it says nothing yet).
  HarmonyPiece finish(FinishReason finish);

 private:
  enum class State { kHeader, kBody, kRaw };
  enum class Kind { kReasoning, kContent, kCall };
  void open_message(HarmonyPiece& out);  // at <|message|>: the header decides the kind
  void close_message(bool complete, HarmonyPiece& out);
  void emit(Kind kind, std::string_view text, HarmonyPiece& out);

  const ToolPlan& plan_;
  std::string id_prefix_;
  State state_ = State::kHeader;
  std::string held_;    // kHeader: the header so far; kBody: a tail that may begin an end marker
  std::string header_;  // the open message's header as written
  Kind kind_ = Kind::kContent;
  std::string call_name_, call_body_;  // kCall: held until the message ends
  size_t calls_ = 0;
  bool seen_[2] = {false, false};     // reasoning, content: some text was emitted
  bool in_message_[2] = {false, false};  // ... by the open message
};

// The whole text at once.
HarmonyPiece split_harmony(std::string_view text, FinishReason finish, const ToolPlan& plan,
                           const std::string& id_prefix);

// The analysis channel's opening and closing text: the thinking span whose tokens are counted as
// reasoning tokens (ThinkingSpan::open_text). A body also ends at <|call|> or <|return|>, which end
// the generation too.
inline constexpr std::string_view kHarmonyAnalysis = "<|channel|>analysis", kHarmonyEnd = "<|end|>";

// True for a Jinja template in the harmony format (it writes <|channel|> and <|message|>).
bool harmony_template(const ChatTemplate& tmpl, bool with_tools);

// A harmony model's output constraints, as xgrammar structural tags (OutputConstraint::kStructuralTag)
// that leave the thinking free: an optional analysis message, then
//   named / required tool_choice: a call of that function (any offered one) with its parameters'
//     JSON, in the header forms the model writes (kind kNone for other modes);
//   `answer` (response_format, json_schema, ...; kJson / kJsonSchema): a final message holding it
//     (a grammar, or no constraint, comes back unchanged: a grammar constrains the whole text).
OutputConstraint harmony_tool_constraint(const ToolPlan& plan);
OutputConstraint harmony_answer_constraint(const OutputConstraint& answer);

}  // namespace fathom
