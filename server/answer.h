#pragma once
// A finished chat choice as every API reports it (chat completions, /v1/responses, gRPC): its
// thinking, its text and its tool calls, read in the model's own format: harmony's channels
// (server/harmony.h), or a <think> span (server/reasoning.h) and then calls in the tool format
// (server/tools.h: calls only from an answer that stopped, or a named call).
#include <string>
#include <vector>

#include "engine/request.h"
#include "server/reasoning.h"
#include "server/tools.h"

namespace fathom {

struct AnswerParts {
  std::string reasoning;
  std::string content;  // the text outside the thinking and the calls
  std::vector<ToolCall> calls;
};

AnswerParts answer_parts(const ReasoningMode& reasoning, const ToolPlan& tools, const std::string& text,
                         FinishReason finish, const std::string& id_prefix);

}  // namespace fathom
