#include "server/tools.h"

#include <string_view>

#include "engine/model/tokenizer.h"
#include "server/openai_request.h"
#include "server/bounded_json.h"
#include "server/harmony.h"
#include "server/json_fields.h"
#include "server/schema_rules.h"

namespace fathom {
namespace {

using nlohmann::json;

constexpr std::string_view kPythonTag = "<|python_tag|>";  // Llama 3.x: a call follows
constexpr std::string_view kToolCalls = "[TOOL_CALLS]", kArgs = "[ARGS]", kCallId = "[CALL_ID]";  // Mistral
constexpr std::string_view kChannel = "<|channel|>", kMessage = "<|message|>", kStart = "<|start|>",  // harmony
                           kEnd = "<|end|>", kConstrain = "<|constrain|>";

[[noreturn]] void bad(const std::string& param, const std::string& message) {
  throw ApiError(400, message, param, "invalid_value");
}

bool valid_name(const std::string& n) {
  if (n.empty() || n.size() > 64) return false;
  for (char c : n)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
      return false;
  return true;
}

// A past call as the Hermes text shows it; the arguments keep the client's key order.
nlohmann::ordered_json call_object(const std::string& name, const nlohmann::ordered_json& arguments) {
  return {{"name", name}, {"arguments", arguments}};
}

}  // namespace

ToolPlan parse_tools(const json& body) {
  ToolPlan plan;
  auto t = body.find("tools");
  if (t == body.end() || t->is_null()) {
    if (auto c = body.find("tool_choice"); c != body.end() && !c->is_null() && *c != "none" && *c != "auto")
      bad("tool_choice", "'tool_choice' needs 'tools'");
    return plan;
  }
  if (!t->is_array()) bad("tools", "'tools' must be an array of function tools");
  if (t->size() > 128) bad("tools", "at most 128 tools");
  for (size_t i = 0; i < t->size(); ++i) {
    const json& tool = (*t)[i];
    const std::string param = "tools[" + std::to_string(i) + "]";
    if (!tool.is_object() || string_field_or(tool, "type") != "function" || !tool.contains("function") ||
        !tool["function"].is_object())
      bad(param, "'" + param + "' must be {\"type\": \"function\", \"function\": {...}}");
    const json& f = tool["function"];
    ToolSpec spec;
    spec.name = string_field_or(f, "name");
    if (!valid_name(spec.name)) bad(param + ".function.name", "a function name is 1-64 of [A-Za-z0-9_-]");
    for (const ToolSpec& other : plan.tools)
      if (other.name == spec.name) bad(param + ".function.name", "duplicate function name '" + spec.name + "'");
    if (f.contains("description") && !f["description"].is_null()) {
      if (!f["description"].is_string()) bad(param + ".function.description", "must be a string");
      spec.description = f["description"].get<std::string>();
    }
    spec.parameters = f.contains("parameters") && !f["parameters"].is_null() ? f["parameters"]
                                                                             : json{{"type", "object"}, {"properties", json::object()}};
    if (!spec.parameters.is_object()) bad(param + ".function.parameters", "must be a JSON Schema object");
    // A call's arguments are a JSON object (OpenAI requires an object schema): a schema without a
    // type describes one; any other type is refused, or a named call would return a bare string.
    if (auto type = spec.parameters.find("type"); type == spec.parameters.end())
      spec.parameters["type"] = "object";
    else if (*type != "object")
      bad(param + ".function.parameters", "'" + param + ".function.parameters' must describe an object ({\"type\": \"object\", ...})");
    if (f.contains("strict") && !f["strict"].is_null()) {
      if (!f["strict"].is_boolean()) bad(param + ".function.strict", "must be true or false");
      spec.strict = f["strict"].get<bool>();
    }
    plan.tools.push_back(std::move(spec));
  }
  plan.mode = ToolPlan::Mode::kAuto;
  if (auto p = body.find("parallel_tool_calls"); p != body.end() && !p->is_null()) {
    if (!p->is_boolean()) bad("parallel_tool_calls", "'parallel_tool_calls' must be true or false");
    plan.parallel = p->get<bool>();
  }
  auto c = body.find("tool_choice");
  if (c == body.end() || c->is_null() || *c == "auto") return plan;
  if (*c == "none") plan.mode = ToolPlan::Mode::kNone;
  else if (*c == "required") plan.mode = ToolPlan::Mode::kRequired;
  else if (c->is_object() && string_field_or(*c, "type") == "function" && c->contains("function") &&
           (*c)["function"].is_object() && (*c)["function"].contains("name") && (*c)["function"]["name"].is_string()) {
    plan.named = (*c)["function"]["name"].get<std::string>();
    bool known = false;
    for (const ToolSpec& s : plan.tools) known = known || s.name == plan.named;
    if (!known) bad("tool_choice", "tool_choice names '" + plan.named + "', which is not in 'tools'");
    plan.mode = ToolPlan::Mode::kNamed;
  } else {
    bad("tool_choice", "'tool_choice' must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\": ...}}");
  }
  // Named and required calls are constrained by the parameters' schemas: each must be one the
  // constraint can enforce (auto only shows them to the model).
  for (size_t i = 0; i < plan.tools.size(); ++i)
    if (plan.mode == ToolPlan::Mode::kRequired || plan.tools[i].name == plan.named)
      check_schema_keywords(plan.tools[i].parameters, "tools[" + std::to_string(i) + "].function.parameters");
  return plan;
}

std::string tools_prompt(const ToolPlan& plan) {
  if (!plan.offered()) return "";
  std::string s =
      "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
      "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
  for (const ToolSpec& t : plan.tools) {
    json sig = {{"type", "function"},
                {"function", {{"name", t.name}, {"description", t.description}, {"parameters", t.parameters}}}};
    s += '\n';
    s += sig.dump();
  }
  s += "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
       "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
       "</tool_call>";
  return s;
}

std::vector<PastToolCall> parse_past_tool_calls(const json& tool_calls, const std::string& param) {
  if (!tool_calls.is_array()) bad(param, "'" + param + "' must be an array");
  std::vector<PastToolCall> calls;
  for (size_t i = 0; i < tool_calls.size(); ++i) {
    const json& call = tool_calls[i];
    const std::string at = param + "[" + std::to_string(i) + "]";
    if (!call.is_object() || !call.contains("function") || !call["function"].is_object())
      bad(at, "each tool call needs a 'function' object");
    const json& f = call["function"];
    if (!f.contains("name") || !f["name"].is_string()) bad(at, "each tool call needs 'function.name'");
    PastToolCall c{string_field_or(call, "id"), f["name"].get<std::string>(), nlohmann::ordered_json::object()};
    const auto args = f.find("arguments");
    if (args != f.end() && args->is_string()) {
      c.arguments = parse_bounded_ordered_json(args->get<std::string>());
      if (c.arguments.is_discarded())
        bad(at + ".function.arguments", "tool call arguments must be JSON text nested at most 64 levels, with at most " +
                                            std::to_string(kMaxOrderedKeys) + " keys per object");
    } else if (args != f.end() && !args->is_null()) {
      bad(at + ".function.arguments", "'" + at + ".function.arguments' must be a string of JSON");
    }
    calls.push_back(std::move(c));
  }
  return calls;
}

std::string render_tool_calls(const json& tool_calls, const std::string& param) {
  std::string s;
  for (const PastToolCall& call : parse_past_tool_calls(tool_calls, param)) {
    if (!s.empty()) s += "\n";
    s += "<tool_call>\n";
    s += call_object(call.name, call.arguments).dump();
    s += "\n</tool_call>";
  }
  return s;
}

std::string render_tool_result(const std::string& content) {
  std::string s = "<tool_response>\n";
  s += content;
  s += "\n</tool_response>";
  return s;
}

OutputConstraint tool_constraint(const ToolPlan& plan) {
  if (plan.format == ToolPlan::Format::kHarmony) return harmony_tool_constraint(plan);
  OutputConstraint c;
  if (plan.mode == ToolPlan::Mode::kNamed) {
    for (const ToolSpec& t : plan.tools)
      if (t.name == plan.named) {
        c = {OutputConstraint::Kind::kJsonSchema, t.parameters.dump(), t.strict};
      }
  } else if (plan.mode == ToolPlan::Mode::kRequired) {
    json any = json::array();
    for (const ToolSpec& t : plan.tools)
      any.push_back({{"type", "object"},
                     {"properties", {{"name", {{"const", t.name}}}, {plan.arguments_key(), t.parameters}}},
                     {"required", {"name", plan.arguments_key()}},
                     {"additionalProperties", false}});
    const json one = {{"anyOf", any}};
    c = {OutputConstraint::Kind::kJsonSchema,
         (plan.parallel ? json{{"type", "array"}, {"items", one}, {"minItems", 1}} : one).dump(), false};
  }
  return c;
}

std::vector<ToolCall> extract_tool_calls(const ToolPlan& plan, const std::string& text, std::string& content,
                                         const std::string& id_prefix) {
  std::vector<ToolCall> calls;
  content = text;
  auto id = [&] { return tool_call_id(plan, id_prefix, calls.size()); };
  if (plan.mode == ToolPlan::Mode::kNamed) {
    calls.push_back({id(), plan.named, text});
    content.clear();
    return calls;
  }
  auto known = [&](const std::string& name) {
    for (const ToolSpec& t : plan.tools)
      if (t.name == name) return true;
    return false;
  };
  const char* args_key = plan.arguments_key();
  auto from_json = [&](const std::string& s) {
    const json j = parse_bounded_json(s);
    if (j.is_object() && j.contains("name") && j["name"].is_string() && known(j["name"].get<std::string>()) &&
        j.contains(args_key) && j[args_key].is_object()) {
      calls.push_back({id(), j["name"].get<std::string>(), j[args_key].dump()});
      return true;
    }
    return false;
  };
  if (plan.mode == ToolPlan::Mode::kRequired) {  // one call, or an array of them (parallel)
    const json j = parse_bounded_json(text);
    if (j.is_array()) {
      for (const json& one : j) from_json(one.dump());
    } else {
      from_json(text);
    }
    if (!calls.empty()) content.clear();
    return calls;
  }
  if (plan.format == ToolPlan::Format::kLlamaJson) {
    // auto, Llama 3.x: the whole answer is one call object (after an optional <|python_tag|>), or
    // several separated by ';'; anything else is content.
    std::string body = text;
    const size_t b = body.find_first_not_of(" \n\t");
    body = b == std::string::npos ? "" : body.substr(b);
    if (body.rfind(kPythonTag, 0) == 0) body = body.substr(kPythonTag.size());
    if (from_json(body)) {
      content.clear();
      return calls;
    }
    size_t at = 0;
    while (at <= body.size()) {
      const size_t semi = body.find(';', at);
      const std::string one = body.substr(at, semi == std::string::npos ? std::string::npos : semi - at);
      if (one.find_first_not_of(" \n\t") != std::string::npos && !from_json(one)) {
        calls.clear();
        return calls;
      }
      if (semi == std::string::npos) break;
      at = semi + 1;
    }
    if (!calls.empty()) content.clear();
    return calls;
  }
  if (plan.format == ToolPlan::Format::kMistral) {
    // auto, Mistral: the text before the first [TOOL_CALLS] is content; after it, each
    // [TOOL_CALLS] starts a JSON list (or object) of calls, or name[ARGS]{arguments} with an
    // optional [CALL_ID]id before [ARGS]. Any part that is not a valid call: no calls at all.
    const size_t first = text.find(kToolCalls);
    if (first == std::string::npos) return calls;
    auto trim = [](std::string_view v) {
      const size_t b = v.find_first_not_of(" \n\t"), e = v.find_last_not_of(" \n\t");
      return b == std::string_view::npos ? std::string_view() : v.substr(b, e - b + 1);
    };
    bool ok = true;
    for (size_t at = first; ok && at != std::string::npos;) {
      const size_t begin = at + kToolCalls.size(), next = text.find(kToolCalls, begin);
      const std::string_view part = trim(std::string_view(text).substr(begin, next == std::string::npos ? std::string::npos : next - begin));
      at = next;
      if (!part.empty() && (part[0] == '[' || part[0] == '{')) {
        const json j = parse_bounded_json(std::string(part));
        if (j.is_array()) {
          for (const json& one : j) ok = ok && from_json(one.dump());
          ok = ok && !j.empty();
        } else {
          ok = from_json(std::string(part));
        }
        continue;
      }
      const size_t args = part.find(kArgs);
      if (args == std::string_view::npos) {
        ok = false;
        continue;
      }
      std::string_view name = part.substr(0, args);
      if (const size_t cid = name.find(kCallId); cid != std::string_view::npos) name = name.substr(0, cid);
      name = trim(name);
      const json arguments = parse_bounded_json(std::string(part.substr(args + kArgs.size())));
      ok = known(std::string(name)) && arguments.is_object();
      if (ok) calls.push_back({id(), std::string(name), arguments.dump()});
    }
    if (!ok) {
      calls.clear();
      return calls;
    }
    content = std::string(trim(std::string_view(text).substr(0, first)));
    return calls;
  }
  // auto: <tool_call> ... </tool_call> blocks, the rest is content.
  std::string rest;
  size_t at = 0;
  for (;;) {
    const size_t open = text.find("<tool_call>", at);
    const size_t close = open == std::string::npos ? std::string::npos : text.find("</tool_call>", open);
    if (close == std::string::npos) break;
    rest += text.substr(at, open - at);
    from_json(text.substr(open + 11, close - open - 11));
    at = close + 12;
  }
  rest += text.substr(at);
  if (!calls.empty()) {
    const size_t b = rest.find_first_not_of(" \n\t"), e = rest.find_last_not_of(" \n\t");
    content = b == std::string::npos ? "" : rest.substr(b, e - b + 1);
  }
  return calls;
}

std::vector<ToolCall> answer_tool_calls(const ToolPlan& plan, const std::string& text, FinishReason finish,
                                        std::string& content, const std::string& id_prefix) {
  content = text;
  if (!plan.offered() || (finish != FinishReason::kStop && plan.mode != ToolPlan::Mode::kNamed)) return {};
  return extract_tool_calls(plan, text, content, id_prefix);
}

json tool_calls_json(const std::vector<ToolCall>& calls, bool with_index) {
  json out = json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    json c = {{"id", calls[i].id}, {"type", "function"}, {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}};
    if (with_index) c["index"] = i;
    out.push_back(std::move(c));
  }
  return out;
}

std::string tool_call_id(const ToolPlan& plan, const std::string& prefix, size_t index) {
  if (plan.format != ToolPlan::Format::kMistral) return prefix + std::to_string(index);
  static constexpr char kAlphabet[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  uint64_t h = 14695981039346656037ull;  // FNV-1a of prefix and index
  for (char c : prefix + "#" + std::to_string(index)) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  std::string id;
  for (int i = 0; i < 9; ++i, h /= 62) id += kAlphabet[h % 62];
  return id;
}

std::string_view call_marker(ToolPlan::Format format) {
  switch (format) {
    case ToolPlan::Format::kHermes: return "<tool_call>";
    case ToolPlan::Format::kMistral: return kToolCalls;
    case ToolPlan::Format::kLlamaJson: return "";
    case ToolPlan::Format::kHarmony: return "";
  }
  return "";
}

std::vector<std::string_view> call_control_tokens(ToolPlan::Format format) {
  switch (format) {
    case ToolPlan::Format::kLlamaJson: return {kPythonTag};
    case ToolPlan::Format::kMistral: return {kToolCalls, kArgs, kCallId};
    case ToolPlan::Format::kHarmony: return {kChannel, kMessage, kStart, kEnd, kConstrain};
    case ToolPlan::Format::kHermes: return {};
  }
  return {};
}

std::vector<int32_t> shown_call_tokens(const ToolPlan& plan, const Tokenizer& tokenizer) {
  std::vector<int32_t> ids;
  if (!plan.offered() && plan.format != ToolPlan::Format::kHarmony) return ids;
  for (std::string_view marker : call_control_tokens(plan.format))
    if (const int32_t id = tokenizer.token_id(marker); id >= 0 && tokenizer.is_control(id)) ids.push_back(id);
  return ids;
}

}  // namespace fathom
