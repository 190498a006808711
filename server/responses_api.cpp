#include "server/responses_api.h"

#include "server/openai_request.h"
#include "server/openai_response.h"

namespace fathom {
namespace {

using nlohmann::json;

[[noreturn]] void bad(const std::string& param, const std::string& message) {
  throw ApiError(400, message, param, "invalid_value");
}

// One input item's text: a string, or parts of type input_text / output_text / text.
std::string item_text(const json& content, const std::string& param) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) bad(param, "'" + param + "' must be a string or an array of text parts");
  std::string text;
  for (const json& part : content) {
    const std::string type = part.is_object() ? part.value("type", "") : "";
    if ((type != "input_text" && type != "output_text" && type != "text") || !part.contains("text") ||
        !part["text"].is_string())
      bad(param, "'" + param + "': only input_text / output_text parts are supported");
    text += part["text"].get<std::string>();
  }
  return text;
}

// `input` + `instructions` as chat messages.
json chat_messages(const json& body) {
  json messages = json::array();
  if (auto it = body.find("instructions"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) bad("instructions", "'instructions' must be a string");
    messages.push_back({{"role", "system"}, {"content", *it}});
  }
  auto input = body.find("input");
  if (input == body.end() || input->is_null()) bad("input", "'input' is required");
  if (input->is_string()) {
    messages.push_back({{"role", "user"}, {"content", *input}});
    return messages;
  }
  if (!input->is_array() || input->empty()) bad("input", "'input' must be a string or a non-empty array of messages");
  for (size_t i = 0; i < input->size(); ++i) {
    const json& item = (*input)[i];
    const std::string param = "input[" + std::to_string(i) + "]";
    if (!item.is_object()) bad(param, "'" + param + "' must be a message object");
    if (item.contains("type") && item["type"] != "message")
      bad(param + ".type", "only message items are supported (no function_call or reasoning items)");
    if (!item.contains("role") || !item["role"].is_string()) bad(param + ".role", "'" + param + ".role' is required");
    if (!item.contains("content")) bad(param + ".content", "'" + param + ".content' is required");
    messages.push_back({{"role", item["role"]}, {"content", item_text(item["content"], param + ".content")}});
  }
  return messages;
}

json output_message(const std::string& id, const std::string& text, const char* status) {
  return {{"type", "message"},
          {"id", id},
          {"status", status},
          {"role", "assistant"},
          {"content", json::array({{{"type", "output_text"}, {"text", text}, {"annotations", json::array()}}})}};
}

std::string message_id(const ResponseMeta& meta) { return "msg_" + meta.id.substr(meta.id.find('_') + 1); }

// The response object around `output`, with the request's parameters echoed.
json envelope(const ApiRequest& req, const ResponseMeta& meta, const char* status, json output, const json& usage) {
  const json& p = req.responses;
  return {{"id", meta.id},
          {"object", "response"},
          {"created_at", meta.created},
          {"status", status},
          {"error", nullptr},
          {"incomplete_details", nullptr},
          {"instructions", p.value("instructions", json())},
          {"max_output_tokens", p.value("max_output_tokens", json())},
          {"model", meta.model},
          {"output", std::move(output)},
          {"parallel_tool_calls", true},
          {"previous_response_id", nullptr},
          {"reasoning", {{"effort", nullptr}, {"summary", nullptr}}},
          {"store", false},
          {"temperature", p.value("temperature", json(1.0))},
          {"text", {{"format", p.value("format", json{{"type", "text"}})}}},
          {"tool_choice", "auto"},
          {"tools", json::array()},
          {"top_p", p.value("top_p", json(1.0))},
          {"truncation", "disabled"},
          {"usage", usage},
          {"user", p.value("user", json())},
          {"metadata", p.value("metadata", json::object())}};
}

json responses_usage(const RequestUsage& u) {
  return {{"input_tokens", u.prompt_tokens},
          {"input_tokens_details", {{"cached_tokens", u.cached_prompt_tokens}}},
          {"output_tokens", u.completion_tokens},
          {"output_tokens_details", {{"reasoning_tokens", 0}}},
          {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

}  // namespace

ApiRequest parse_responses_request(const json& body, const Model& model, const ServerConfig& config) {
  for (const char* stateful : {"previous_response_id", "conversation"})
    if (auto it = body.find(stateful); it != body.end() && !it->is_null())
      bad(stateful, std::string("'") + stateful + "' needs stored responses; this server is stateless (store: false)");
  for (const char* unsupported : {"reasoning", "background", "prompt", "include"})
    if (auto it = body.find(unsupported); it != body.end() && !it->is_null() && !(it->is_array() && it->empty()))
      bad(unsupported, std::string("'") + unsupported + "' is not supported");
  if (auto t = body.find("tools"); t != body.end() && !t->is_null() && !(t->is_array() && t->empty()))
    bad("tools", "tools are not supported yet");
  json chat = {{"messages", chat_messages(body)}};
  // text.format {"type": "json_schema", "name", "schema", "strict"} is chat's response_format
  // with the schema's fields one level up.
  if (auto t = body.find("text"); t != body.end() && !t->is_null()) {
    if (!t->is_object()) bad("text", "'text' must be an object");
    if (auto f = t->find("format"); f != t->end() && !f->is_null()) {
      if (!f->is_object()) bad("text.format", "'text.format' must be an object");
      const std::string type = f->value("type", std::string("text"));
      if (type == "json_schema") {
        json spec = json::object();
        for (const char* key : {"name", "schema", "strict"})
          if (f->contains(key)) spec[key] = (*f)[key];
        chat["response_format"] = {{"type", "json_schema"}, {"json_schema", spec}};
      } else if (type == "json_object" || type == "text") {
        chat["response_format"] = {{"type", type}};
      } else {
        bad("text.format", "text.format type must be text, json_object or json_schema");
      }
    }
  }
  for (const char* key : {"temperature", "top_p", "stream", "user", "model"})
    if (auto it = body.find(key); it != body.end()) chat[key] = *it;
  if (auto it = body.find("max_output_tokens"); it != body.end()) chat["max_tokens"] = *it;
  if (auto it = body.find("metadata"); it != body.end() && !it->is_null() && !it->is_object())
    bad("metadata", "'metadata' must be an object of strings");
  ApiRequest out = parse_chat_request(chat, model, config);
  out.responses = json::object();
  for (const char* key : {"instructions", "max_output_tokens", "temperature", "top_p", "metadata", "user"})
    if (auto it = body.find(key); it != body.end() && !it->is_null()) out.responses[key] = *it;
  if (auto t = body.find("text"); t != body.end() && t->is_object() && t->contains("format"))
    out.responses["format"] = (*t)["format"];
  return out;
}

json response_object(const ApiRequest& req, const ResponseMeta& meta, const std::string& text, FinishReason finish,
                     const RequestUsage& usage) {
  const bool cut = finish == FinishReason::kLength;
  json r = envelope(req, meta, cut ? "incomplete" : "completed",
                    json::array({output_message(message_id(meta), text, cut ? "incomplete" : "completed")}),
                    responses_usage(usage));
  if (cut) r["incomplete_details"] = {{"reason", "max_output_tokens"}};
  return r;
}

std::string ResponsesStream::frame(json event) {
  event["sequence_number"] = sequence_++;
  return "event: " + event["type"].get<std::string>() + "\ndata: " + dump_json(event) + "\n\n";
}

std::vector<std::string> ResponsesStream::begin() {
  const std::string item = message_id(meta_);
  const json part = {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}};
  json in_progress = envelope(req_, meta_, "in_progress", json::array(), nullptr);
  json added = output_message(item, "", "in_progress");
  added["content"] = json::array();
  return {frame({{"type", "response.created"}, {"response", in_progress}}),
          frame({{"type", "response.in_progress"}, {"response", in_progress}}),
          frame({{"type", "response.output_item.added"}, {"output_index", 0}, {"item", added}}),
          frame({{"type", "response.content_part.added"},
                 {"item_id", item},
                 {"output_index", 0},
                 {"content_index", 0},
                 {"part", part}})};
}

std::vector<std::string> ResponsesStream::delta(const std::string& text) {
  if (text.empty()) return {};
  text_ += text;
  return {frame({{"type", "response.output_text.delta"},
                 {"item_id", message_id(meta_)},
                 {"output_index", 0},
                 {"content_index", 0},
                 {"delta", text},
                 {"logprobs", json::array()}})};
}

std::vector<std::string> ResponsesStream::end(FinishReason finish, const RequestUsage& usage, const std::string& error) {
  const std::string item = message_id(meta_);
  if (finish == FinishReason::kError) {
    json failed = envelope(req_, meta_, "failed", json::array(), responses_usage(usage));
    failed["error"] = {{"code", "server_error"}, {"message", "generation failed: " + error}};
    return {frame({{"type", "response.failed"}, {"response", failed}})};
  }
  const json part = {{"type", "output_text"}, {"text", text_}, {"annotations", json::array()}};
  const json final_response = response_object(req_, meta_, text_, finish, usage);
  const bool cut = finish == FinishReason::kLength;
  return {frame({{"type", "response.output_text.done"},
                 {"item_id", item},
                 {"output_index", 0},
                 {"content_index", 0},
                 {"text", text_},
                 {"logprobs", json::array()}}),
          frame({{"type", "response.content_part.done"},
                 {"item_id", item},
                 {"output_index", 0},
                 {"content_index", 0},
                 {"part", part}}),
          frame({{"type", "response.output_item.done"},
                 {"output_index", 0},
                 {"item", output_message(item, text_, cut ? "incomplete" : "completed")}}),
          frame({{"type", cut ? "response.incomplete" : "response.completed"}, {"response", final_response}})};
}

}  // namespace fathom
