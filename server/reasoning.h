#pragma once
// A reasoning model's output split into its thinking and its answer, as vLLM's, SGLang's and
// DeepSeek's APIs return them (`reasoning_content` beside `content`): the span between <think> and
// </think> is reasoning, the rest is the answer. A prompt that ends inside an open <think> block
// (DeepSeek-R1 distills' templates open it; Qwen 3 with enable_thinking=false closes it) starts in
// the reasoning span. Enabled for chat templates that write </think> (reasoning_mode).
#include <string>
#include <string_view>

#include "engine/model/chat_template.h"
#include "engine/request.h"

namespace fathom {

class Tokenizer;

struct ReasoningPiece {
  std::string reasoning;
  std::string content;
};

class ReasoningSplit {
 public:
  explicit ReasoningSplit(bool starts_inside) : state_(starts_inside ? State::kInside : State::kStart) {}
  // The next piece of generated text; a tail that may be the start of a tag is held back.
  ReasoningPiece push(std::string_view text);
  // Whatever is held, at the end of the choice.
  ReasoningPiece finish();

 private:
  enum class State { kStart, kInside, kAnswerStart, kAnswer };
  State state_;
  std::string held_;
};

// The whole text at once.
ReasoningPiece split_reasoning(std::string_view text, bool starts_inside);

// True when a rendered prompt ends inside an open <think> block.
bool prompt_opens_thinking(std::string_view prompt_text);

// A chat's reasoning mode: on for a Jinja template that writes </think> (Qwen 3, QwQ, DeepSeek-R1
// distills); `open` when the prompt ends inside <think>. `harmony`: on for a template in gpt-oss's
// harmony format, whose analysis channel is the thinking (server/harmony.h).
struct ReasoningMode {
  bool on = false;
  bool open = false;
  bool harmony = false;
};
ReasoningMode reasoning_mode(const ChatTemplate& tmpl, bool with_tools, std::string_view prompt_text);

// The thinking span an output constraint leaves free under `mode` (engine/request.h ThinkingSpan):
// the ids of <think> and </think> in `tokenizer`'s vocabulary. None (end -1) when the mode is off or
// </think> is not one token there: the grammar then applies from the first token, thinking or not.
// For harmony, whose analysis no single token opens, the analysis channel's text markers only: its
// tokens are counted, and its constraints allow the analysis themselves (server/harmony.h).
ThinkingSpan thinking_span(const ReasoningMode& mode, const Tokenizer& tokenizer);

// A finished answer split by `mode`; all of it is content when the mode is off (harmony answers:
// server/answer.h).
ReasoningPiece split_answer(std::string_view text, const ReasoningMode& mode);

}  // namespace fathom
