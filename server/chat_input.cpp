#include "server/chat_input.h"

#include <string>

#include "server/bounded_json.h"
#include "server/harmony.h"
#include "server/openai_request.h"

namespace fathom {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

[[noreturn]] void bad(const std::string& param, const std::string& message) {
  throw ApiError(400, message, param, "invalid_value");
}

[[noreturn]] void bad_type(const std::string& param, const char* expected) {
  throw ApiError(400, "'" + param + "' must be " + expected, param, "invalid_type");
}

// A message's content: a string, null (absent), or text parts concatenated.
ordered_json message_content(const json& message, const std::string& param) {
  const auto it = message.find("content");
  if (it == message.end() || it->is_null()) return nullptr;
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array()) bad_type(param, "a string or an array of text parts");
  std::string text;
  for (const json& part : *it) {
    if (!part.is_object() || part.value("type", json()) != "text" || !part.contains("text") || !part["text"].is_string())
      bad(param, "'" + param + "': only {\"type\": \"text\", \"text\": ...} parts are supported");
    text += part["text"].get<std::string>();
  }
  return text;
}

std::string text_of(const ordered_json& content) { return content.is_string() ? content.get<std::string>() : ""; }

bool is_text(const ordered_json& content) { return content.is_string() && !content.get<std::string>().empty(); }

// An earlier turn's thinking, under any of its names.
bool has_thinking(const json& message) {
  for (const char* key : {"reasoning_content", "reasoning", "thinking"})
    if (const auto it = message.find(key); it != message.end() && it->is_string() && !it->get<std::string>().empty())
      return true;
  return false;
}

// An assistant turn's tool_calls for a template: [{"id", "type", "function": {"name", "arguments"}}]
// with the arguments parsed into an object (templates print them with tojson; a string would print
// quoted).
ordered_json template_tool_calls(const json& calls, const std::string& param) {
  ordered_json out = ordered_json::array();
  for (const PastToolCall& c : parse_past_tool_calls(calls, param))
    out.push_back({{"id", c.id.empty() ? "call_" + std::to_string(out.size()) : c.id},
                   {"type", "function"},
                   {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
  return out;
}

}  // namespace

ToolRendering tool_rendering(const ChatTemplate& tmpl, bool with_tools) {
  // gpt-oss's harmony template: tools as a TypeScript-like namespace, calls as messages to functions.NAME.
  if (harmony_template(tmpl, with_tools)) return {tmpl.renders_tools(), ToolPlan::Format::kHarmony};
  if (!tmpl.renders_tools()) return {};
  const std::string& source = tmpl.source(with_tools);
  if (source.find("<tool_call>") != std::string::npos) return {true, ToolPlan::Format::kHermes};
  // Llama 3.1-3.3's templates: 'Respond in the format {"name": function name, "parameters": ...}'.
  if (source.find("\"parameters\": dictionary of argument name") != std::string::npos)
    return {true, ToolPlan::Format::kLlamaJson};
  // Mistral's templates write calls after [TOOL_CALLS] (a JSON list, or name[ARGS]arguments).
  if (source.find("[TOOL_CALLS]") != std::string::npos) return {true, ToolPlan::Format::kMistral};
  return {};
}

ChatInput chat_input(const json& body, const ToolPlan& tools, const ToolRendering& rendering, bool add_generation_prompt,
                     std::string_view raw_body) {
  const auto m = body.find("messages");
  if (m == body.end() || m->is_null()) bad("messages", "'messages' is required");
  if (!m->is_array()) bad_type("messages", "an array of messages");
  if (m->empty()) bad("messages", "'messages' must not be empty");
  // The template itself sees tools and tool turns when it describes tools in the convention the
  // server parses; otherwise they become text (see chat_input.h).
  const bool structured = rendering.structured;
  const bool harmony = rendering.format == ToolPlan::Format::kHarmony;
  ChatInput in;
  in.add_generation_prompt = add_generation_prompt;
  for (size_t i = 0; i < m->size(); ++i) {
    const json& msg = (*m)[i];
    const std::string param = "messages[" + std::to_string(i) + "]";
    if (!msg.is_object()) bad_type(param, "an object with 'role' and 'content'");
    auto role = msg.find("role");
    if (role == msg.end() || !role->is_string()) bad_type(param + ".role", "a string");
    std::string r = role->get<std::string>();
    if (r == "developer") r = "system";  // OpenAI's newer name for the system role
    if (r != "system" && r != "user" && r != "assistant" && r != "tool")
      bad(param + ".role", "unsupported role '" + r + "' (system, developer, user, assistant and tool are)");
    ordered_json content = message_content(msg, param + ".content");
    const auto calls = msg.find("tool_calls");
    const bool has_calls = r == "assistant" && calls != msg.end() && !calls->is_null();
    ordered_json out;
    if (!structured) {
      // Tool turns as text: the hand-written families and templates without tools read text turns.
      std::string text = text_of(content);
      if (r == "tool") {
        in.messages.push_back({{"role", "user"}, {"content", render_tool_result(text)}});
        continue;
      }
      if (has_calls) text += (text.empty() ? "" : "\n") + render_tool_calls(*calls, param + ".tool_calls");
      out = {{"role", r}, {"content", std::move(text)}};
    } else {
      out = {{"role", r}};
      // Harmony's template renders a call's turn's content as its analysis, and raises when it is
      // null or when thinking is there too (which it renders instead): such content is left out.
      const bool drop = harmony && has_calls && (content.is_null() || (is_text(content) && has_thinking(msg)));
      if (!drop) out["content"] = std::move(content);
      if (has_calls) out["tool_calls"] = template_tool_calls(*calls, param + ".tool_calls");
    }
    for (const char* key : {"name", "tool_call_id", "reasoning_content", "reasoning", "thinking"}) {
      const auto it = msg.find(key);
      if (it == msg.end() || it->is_null()) continue;
      if (!it->is_string()) bad_type(param + "." + key, "a string");
      if (structured || std::string_view(key) != "tool_call_id") out[key] = it->get<std::string>();
    }
    // An earlier turn's thinking under any of its three names, as transformers copies it: Qwen 3
    // reads reasoning_content, gpt-oss thinking.
    for (const char* from : {"reasoning_content", "reasoning", "thinking"})
      if (out.contains(from)) {
        const ordered_json thought = out[from];
        for (const char* to : {"reasoning_content", "reasoning", "thinking"})
          if (!out.contains(to)) out[to] = thought;
        break;
      }
    in.messages.push_back(std::move(out));
  }
  if (structured) {
    if (tools.offered()) {
      // The client's key order where the text is at hand (templates print tools with tojson).
      const ordered_json ordered = raw_body.empty() ? ordered_json() : parse_bounded_ordered_json(raw_body, "tools");
      // (The same tools as validated, compared without order: a duplicate key could differ.)
      const bool same = ordered.is_object() && ordered.contains("tools") && json(ordered["tools"]) == body.at("tools");
      in.tools = same ? ordered["tools"] : ordered_json(body.at("tools"));
      // Harmony's template writes each function's description into a comment and raises on none.
      if (harmony)
        for (ordered_json& tool : in.tools)
          if (tool.is_object() && tool.contains("function") && tool["function"].is_object() &&
              !tool["function"].contains("description"))
            tool["function"]["description"] = "";
    }
  } else if (const std::string section = tools_prompt(tools); !section.empty()) {
    // The tools' descriptions lead the system message (one is added when there is none).
    if (in.messages[0]["role"] == "system") {
      in.messages[0]["content"] = text_of(in.messages[0]["content"]) + "\n\n" + section;
    } else {
      in.messages.insert(in.messages.begin(), ordered_json{{"role", "system"}, {"content", section}});
    }
  }
  if (const auto k = body.find("chat_template_kwargs"); k != body.end() && !k->is_null()) {
    if (!k->is_object()) bad_type("chat_template_kwargs", "an object of template variables");
    in.kwargs = ordered_json(*k);
  }
  // OpenAI's reasoning_effort reaches the template as a variable, as vLLM passes it (gpt-oss's writes
  // "Reasoning: <effort>" into its system message; each template reads its own values).
  if (const auto e = body.find("reasoning_effort"); e != body.end() && !e->is_null()) {
    if (!e->is_string() || e->get<std::string>().empty() || e->get<std::string>().size() > 32)
      bad_type("reasoning_effort", "a string of 1 to 32 characters, such as \"low\", \"medium\" or \"high\"");
    if (const auto kw = in.kwargs.find("reasoning_effort"); kw != in.kwargs.end() && *kw != e->get<std::string>())
      bad("reasoning_effort", "'reasoning_effort' and chat_template_kwargs.reasoning_effort differ");
    in.kwargs["reasoning_effort"] = e->get<std::string>();
  }
  return in;
}

}  // namespace fathom
