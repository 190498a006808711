#pragma once
// A chat request's conversation (`messages`, `tools`, `chat_template_kwargs`, `reasoning_effort`)
// as the model's chat template takes it. A Jinja template that describes tools itself in a call
// format the server parses (Hermes <tool_call>: Qwen 2.5/3, Hermes, SmolLM3; Llama 3.x's
// {"name", "parameters"}; Mistral's [TOOL_CALLS]; gpt-oss's harmony) gets the request's tools,
// assistant tool_calls (arguments as objects, as vLLM passes them) and tool turns as they are
// (for harmony, less what its template raises on: server/chat_input.cpp). Any other template gets
// them flattened into text: the server's tool section in the system turn, calls as <tool_call>
// blocks, results as user turns in <tool_response> (server/tools.h).
#include <string_view>

#include <nlohmann/json.hpp>

#include "engine/model/chat_template.h"
#include "server/tools.h"

namespace fathom {

// How `tmpl` takes tools: `structured` when it describes them itself in a call format the server
// parses (Hermes <tool_call>, Llama 3.x's {"name", "parameters"} prompt, Mistral's [TOOL_CALLS],
// harmony), with that format; otherwise the flattened Hermes form.
struct ToolRendering {
  bool structured = false;
  ToolPlan::Format format = ToolPlan::Format::kHermes;
};
ToolRendering tool_rendering(const ChatTemplate& tmpl, bool with_tools);

// Throws ApiError (400) naming the field for a malformed message, tool call or kwargs.
// `rendering`: tool_rendering(tmpl, tools.offered()), which the caller also needs (the call format).
// `raw_body`: the body's JSON text, when there is one: the tools then reach the template in the
// client's key order (`body` is parsed into key-sorted objects).
ChatInput chat_input(const nlohmann::json& body, const ToolPlan& tools, const ToolRendering& rendering,
                     bool add_generation_prompt = true, std::string_view raw_body = {});

}  // namespace fathom
