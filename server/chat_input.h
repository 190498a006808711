#pragma once
// A chat request's conversation (`messages`, `tools`, `chat_template_kwargs`) as the model's chat
// template takes it. A Jinja template that describes tools itself in the Hermes convention the
// server parses (<tool_call>: Qwen 2.5/3, Hermes, SmolLM3) gets the request's tools, assistant
// tool_calls (arguments as objects, as vLLM passes them) and tool turns as they are. Any other
// template gets them flattened into text: the server's tool section in the system turn, calls as
// <tool_call> blocks, results as user turns in <tool_response> (server/tools.h).
#include <nlohmann/json.hpp>

#include "engine/model/chat_template.h"
#include "server/tools.h"

namespace fathom {

// Throws ApiError (400) naming the field for a malformed message, tool call or kwargs.
ChatInput chat_input(const nlohmann::json& body, const ChatTemplate& tmpl, const ToolPlan& tools,
                     bool add_generation_prompt = true);

}  // namespace fathom
