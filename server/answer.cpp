#include "server/answer.h"

#include "server/harmony.h"

namespace fathom {

AnswerParts answer_parts(const ReasoningMode& reasoning, const ToolPlan& tools, const std::string& text,
                         FinishReason finish, const std::string& id_prefix) {
  if (reasoning.harmony) {
    HarmonyPiece p = split_harmony(text, finish, tools, id_prefix);
    return {std::move(p.reasoning), std::move(p.content), std::move(p.calls)};
  }
  ReasoningPiece split = split_answer(text, reasoning);
  AnswerParts out{std::move(split.reasoning), "", {}};
  out.calls = answer_tool_calls(tools, split.content, finish, out.content, id_prefix);
  return out;
}

}  // namespace fathom
