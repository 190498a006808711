#include "server/responses_api.h"

#include <set>
#include <utility>

#include "server/json_fields.h"
#include "server/known_fields.h"
#include "server/openai_request.h"
#include "server/openai_response.h"
#include "server/bounded_json.h"
#include "server/answer.h"

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
    const std::string type = string_field_or(part, "type");
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
  std::set<std::string> calls;  // call_ids of the function_call items so far
  for (size_t i = 0; i < input->size(); ++i) {
    const json& item = (*input)[i];
    const std::string param = "input[" + std::to_string(i) + "]";
    if (!item.is_object()) bad(param, "'" + param + "' must be a message object");
    const std::string type = string_field_or(item, "type", "message");
    auto text_field = [&](const char* key) {
      if (!item.contains(key) || !item[key].is_string()) bad(param + "." + key, "'" + param + "." + key + "' must be a string");
      return item[key].get<std::string>();
    };
    if (type == "function_call") {  // an earlier call of ours: chat's assistant tool_calls
      calls.insert(text_field("call_id"));
      json call = {{"id", text_field("call_id")}, {"type", "function"},
                   {"function", {{"name", text_field("name")}, {"arguments", text_field("arguments")}}}};
      if (!messages.empty() && messages.back()["role"] == "assistant" && messages.back().contains("tool_calls"))
        messages.back()["tool_calls"].push_back(std::move(call));  // consecutive calls: one turn
      else
        messages.push_back({{"role", "assistant"}, {"content", nullptr}, {"tool_calls", json::array({std::move(call)})}});
      continue;
    }
    if (type == "function_call_output") {  // its result: chat's tool message
      // As OpenAI: an output answers a function_call earlier in the same input (this server keeps
      // no state between responses), else the model would read a result of a call it never made.
      if (!calls.count(text_field("call_id")))
        bad(param + ".call_id", "no function_call item before '" + param + "' has call_id '" +
                                    text_field("call_id").substr(0, 64) + "'");
      const json& out = item.contains("output") ? item["output"] : json();
      messages.push_back({{"role", "tool"},
                          {"tool_call_id", text_field("call_id")},
                          {"content", out.is_string() ? out.get<std::string>() : item_text(out, param + ".output")}});
      continue;
    }
    if (type != "message")
      bad(param + ".type", "input items are message, function_call or function_call_output (no reasoning items)");
    if (!item.contains("role") || !item["role"].is_string()) bad(param + ".role", "'" + param + ".role' is required");
    if (!item.contains("content")) bad(param + ".content", "'" + param + ".content' is required");
    messages.push_back({{"role", item["role"]}, {"content", item_text(item["content"], param + ".content")}});
  }
  return messages;
}

// `logprobs`: the text's tokens in chat's shape ({token, logprob, bytes, top_logprobs}), when the
// request included message.output_text.logprobs; null: the part carries none.
json output_text_part(const std::string& text) {
  return {{"type", "output_text"}, {"text", text}, {"annotations", json::array()}};
}

json output_message(const std::string& id, const std::string& text, const char* status, const json& logprobs = nullptr) {
  json part = output_text_part(text);
  if (!logprobs.is_null()) part["logprobs"] = logprobs;
  return {{"type", "message"},
          {"id", id},
          {"status", status},
          {"role", "assistant"},
          {"content", json::array({std::move(part)})}};
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
          {"parallel_tool_calls", p.value("parallel_tool_calls", json(false))},  // off unless asked (server/tools.h)
          {"previous_response_id", nullptr},
          {"reasoning", {{"effort", p.value("reasoning_effort", json())}, {"summary", nullptr}}},
          {"store", false},
          {"temperature", p.value("temperature", json(1.0))},
          {"text", {{"format", p.value("format", json{{"type", "text"}})}}},
          {"tool_choice", p.value("tool_choice", json("auto"))},
          {"tools", p.value("tools", json::array())},
          {"top_p", p.value("top_p", json(1.0))},
          {"truncation", "disabled"},
          {"usage", usage},
          {"user", p.value("user", json())},
          {"metadata", p.value("metadata", json::object())}};
}

// Responses' function tools ({"type": "function", "name", "description", "parameters", "strict"})
// and tool_choice ({"type": "function", "name"}) in chat's shape (the function's fields one level
// down), `parallel_tool_calls` passed through.
void chat_tools(const json& body, json& chat) {
  if (auto t = body.find("tools"); t != body.end() && !t->is_null()) {
    if (!t->is_array()) bad("tools", "'tools' must be an array of function tools");
    json tools = json::array();
    for (size_t i = 0; i < t->size(); ++i) {
      const json& tool = (*t)[i];
      const std::string param = "tools[" + std::to_string(i) + "]";
      if (!tool.is_object() || string_field_or(tool, "type") != "function")
        bad(param + ".type", "only function tools are supported ({\"type\": \"function\", \"name\", \"parameters\"})");
      json function = json::object();
      for (const char* key : {"name", "description", "parameters", "strict"})
        if (tool.contains(key)) function[key] = tool[key];
      tools.push_back({{"type", "function"}, {"function", std::move(function)}});
    }
    chat["tools"] = std::move(tools);
  }
  if (auto c = body.find("tool_choice"); c != body.end() && !c->is_null()) {
    if (string_field_or(*c, "type") == "function" && c->contains("name"))
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", (*c)["name"]}}}};
    else
      chat["tool_choice"] = *c;
  }
  if (auto p = body.find("parallel_tool_calls"); p != body.end()) chat["parallel_tool_calls"] = *p;
}

// A tool call as a Responses output item.
json function_call_item(const ToolCall& call, const char* status) {
  return {{"type", "function_call"},
          {"id", "fc_" + call.id.substr(call.id.find('_') + 1)},
          {"call_id", call.id},
          {"name", call.name},
          {"arguments", call.arguments},
          {"status", status}};
}

std::string reasoning_id(const ResponseMeta& meta) { return "rs_" + meta.id.substr(meta.id.find('_') + 1); }

// A reasoning model's thinking (server/reasoning.h), as the Responses API carries an open model's.
json reasoning_item(const ResponseMeta& meta, const std::string& text) {
  return {{"type", "reasoning"},
          {"id", reasoning_id(meta)},
          {"summary", json::array()},
          {"content", json::array({{{"type", "reasoning_text"}, {"text", text}}})}};
}

// The output items of a finished answer: a reasoning model's thinking, its message (unless tools
// took all of the text) and its tool calls — by the rule chat and gRPC use (answer_tool_calls: calls
// only from an answer that ended, or from a named call), so a reply cut at max_output_tokens is
// never half a call.
json output_items(const ApiRequest& req, const ResponseMeta& meta, const std::string& whole, FinishReason finish,
                  const char* status, const json& logprobs) {
  json items = json::array();
  const AnswerParts answer = answer_parts(req.reasoning, req.tools, whole, finish, tool_call_id_prefix(meta, 0));
  if (!answer.reasoning.empty()) items.push_back(reasoning_item(meta, answer.reasoning));
  if (answer.calls.empty() || !answer.content.empty())
    items.push_back(output_message(message_id(meta), answer.content, status, req.logprobs ? logprobs : json()));
  for (const ToolCall& call : answer.calls) items.push_back(function_call_item(call, "completed"));
  return items;
}

json responses_usage(const RequestUsage& u) {
  return {{"input_tokens", u.prompt_tokens},
          {"input_tokens_details", {{"cached_tokens", u.cached_prompt_tokens}}},
          {"output_tokens", u.completion_tokens},
          {"output_tokens_details", {{"reasoning_tokens", u.reasoning_tokens}}},
          {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

}  // namespace

// The Responses tools as chat tools, in the client's key order (from the body's text): what the
// template prints with tojson. "" without a body text or tools.
std::string ordered_chat_tools(std::string_view raw_body) {
  using nlohmann::ordered_json;
  if (raw_body.empty()) return {};
  const ordered_json body = parse_bounded_ordered_json(raw_body, "tools");
  if (!body.is_object() || !body.contains("tools") || !body["tools"].is_array()) return {};
  ordered_json tools = ordered_json::array();
  for (const ordered_json& tool : body["tools"]) {
    ordered_json function = ordered_json::object();
    if (tool.is_object())
      for (auto it = tool.begin(); it != tool.end(); ++it)
        if (it.key() == "name" || it.key() == "description" || it.key() == "parameters" || it.key() == "strict")
          function[it.key()] = it.value();
    tools.push_back({{"type", "function"}, {"function", std::move(function)}});
  }
  return ordered_json{{"tools", std::move(tools)}}.dump();
}

ApiRequest parse_responses_request(const json& body, const Model& model, const ServerConfig& config,
                                   std::string_view raw_body) {
  check_known_fields(body, ApiKind::kResponses, config);
  for (const char* stateful : {"previous_response_id", "conversation"})
    if (auto it = body.find(stateful); it != body.end() && !it->is_null())
      bad(stateful, std::string("'") + stateful + "' needs stored responses; this server is stateless (store: false)");
  for (const char* unsupported : {"background", "prompt"})
    if (auto it = body.find(unsupported); it != body.end() && !it->is_null() && !(it->is_array() && it->empty()))
      bad(unsupported, std::string("'") + unsupported + "' is not supported");
  json chat = {{"messages", chat_messages(body)}};
  // reasoning.effort is chat's reasoning_effort (a template variable: server/chat_input.h); a
  // summary is never made (the reasoning item carries the whole thinking), so asking for one is moot.
  if (auto r = body.find("reasoning"); r != body.end() && !r->is_null()) {
    if (!r->is_object()) bad("reasoning", "'reasoning' must be an object");
    for (auto it = r->begin(); it != r->end(); ++it) {
      const std::string param = "reasoning." + it.key().substr(0, 64);
      if (!it->is_null() && !it->is_string()) bad(param, "'" + param + "' must be a string");
      if (it.key() == "effort") {
        if (it->is_string()) chat["reasoning_effort"] = *it;
      } else if (it.key() != "summary" && it.key() != "generate_summary") {
        bad(param, "'" + param + "' is not supported (effort, summary)");
      }
    }
  }
  chat_tools(body, chat);
  // include: ["message.output_text.logprobs"] asks for the text's token logprobs (chat's logprobs),
  // top_logprobs (0-20) for the alternatives at each token.
  if (auto in = body.find("include"); in != body.end() && !in->is_null()) {
    if (!in->is_array()) bad("include", "'include' must be an array of strings");
    for (size_t i = 0; i < in->size(); ++i) {
      const std::string param = "include[" + std::to_string(i) + "]";
      if (!(*in)[i].is_string()) bad(param, "'" + param + "' must be a string");
      if ((*in)[i] != "message.output_text.logprobs")
        bad(param, "'" + (*in)[i].get<std::string>().substr(0, 64) + "' is not supported (message.output_text.logprobs)");
      chat["logprobs"] = true;
    }
  }
  if (auto t = body.find("top_logprobs"); t != body.end() && !t->is_null()) {
    if (!t->is_number_integer() || *t < 0 || *t > 20) bad("top_logprobs", "'top_logprobs' must be an integer from 0 to 20");
    if (chat.contains("logprobs")) chat["top_logprobs"] = *t;  // without the include it asks for nothing
  }
  // fathom's extension object, as on chat (server/openai_request.cpp parse_extension): the attention
  // policy, priority, speculation, ignore_eos, a grammar.
  if (auto f = body.find("fathom"); f != body.end()) chat["fathom"] = *f;
  // text.format {"type": "json_schema", "name", "schema", "strict"} is chat's response_format
  // with the schema's fields one level up.
  if (auto t = body.find("text"); t != body.end() && !t->is_null()) {
    if (!t->is_object()) bad("text", "'text' must be an object");
    if (auto f = t->find("format"); f != t->end() && !f->is_null()) {
      if (!f->is_object()) bad("text.format", "'text.format' must be an object");
      if (f->contains("type") && !(*f)["type"].is_string()) bad("text.format.type", "'text.format.type' must be a string");
      const std::string type = string_field_or(*f, "type", "text");
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
  ApiRequest out = parse_chat_request(chat, model, config, ordered_chat_tools(raw_body));
  if (out.logprobs && (out.reasoning.on || out.tools.offered()))
    bad("include", "logprobs on /v1/responses are given for a plain text answer (no tools, no reasoning model); "
                   "/v1/chat/completions gives them with either");
  out.responses = json::object();
  for (const char* key : {"instructions", "max_output_tokens", "temperature", "top_p", "metadata", "user", "tools",
                          "tool_choice", "parallel_tool_calls"})
    if (auto it = body.find(key); it != body.end() && !it->is_null()) out.responses[key] = *it;
  if (auto t = body.find("text"); t != body.end() && t->is_object() && t->contains("format"))
    out.responses["format"] = (*t)["format"];
  if (auto e = chat.find("reasoning_effort"); e != chat.end()) out.responses["reasoning_effort"] = *e;
  return out;
}

json response_object(const ApiRequest& req, const ResponseMeta& meta, const std::string& text, FinishReason finish,
                     const RequestUsage& usage, const json& logprobs) {
  const bool cut = finish == FinishReason::kLength;
  const char* status = cut ? "incomplete" : "completed";
  json r = envelope(req, meta, status, output_items(req, meta, text, finish, status, logprobs), responses_usage(usage));
  if (cut) r["incomplete_details"] = {{"reason", "max_output_tokens"}};
  return r;
}

ResponsesStream::ResponsesStream(const ApiRequest& req, const ResponseMeta& meta) : req_(req), meta_(meta) {
  if (req_.reasoning.on && !req_.reasoning.harmony && !req_.tools.offered()) thinking_.emplace(req_.reasoning.open);
}

bool ResponsesStream::held() const { return req_.tools.offered() || req_.reasoning.harmony; }

// The reasoning item (when there is thinking) is output 0 and the message follows it: a <think>
// span only opens an answer (server/reasoning.h), so thinking never follows text.
void ResponsesStream::live_piece(const ReasoningPiece& piece, std::vector<std::string>& out) {
  if (!piece.reasoning.empty()) {
    if (!reasoning_open_) {
      json added = reasoning_item(meta_, "");
      added["content"] = json::array();
      added["status"] = "in_progress";
      out.push_back(frame({{"type", "response.output_item.added"}, {"output_index", 0}, {"item", added}}));
      reasoning_open_ = true;
    }
    reasoning_ += piece.reasoning;
    out.push_back(frame({{"type", "response.reasoning_text.delta"}, {"item_id", reasoning_id(meta_)},
                         {"output_index", 0}, {"content_index", 0}, {"delta", piece.reasoning}}));
  }
  if (!piece.content.empty()) text_delta(piece.content, out);
}

void ResponsesStream::text_delta(const std::string& text, std::vector<std::string>& out) {
  open_message(out);
  content_ += text;
  out.push_back(frame({{"type", "response.output_text.delta"}, {"item_id", message_id(meta_)},
                       {"output_index", message_index()}, {"content_index", 0}, {"delta", text},
                       {"logprobs", std::exchange(pending_, json::array())}}));
}

void ResponsesStream::close_reasoning(std::vector<std::string>& out) {
  if (!reasoning_open_) return;
  reasoning_open_ = false;
  const json item = reasoning_item(meta_, reasoning_);
  out.push_back(frame({{"type", "response.reasoning_text.done"}, {"item_id", item["id"]}, {"output_index", 0},
                       {"content_index", 0}, {"text", reasoning_}}));
  out.push_back(frame({{"type", "response.output_item.done"}, {"output_index", 0}, {"item", item}}));
}

void ResponsesStream::open_message(std::vector<std::string>& out) {
  if (message_open_) return;
  close_reasoning(out);
  message_open_ = true;
  json added = output_message(message_id(meta_), "", "in_progress");
  added["content"] = json::array();
  out.push_back(frame({{"type", "response.output_item.added"}, {"output_index", message_index()}, {"item", added}}));
  out.push_back(frame({{"type", "response.content_part.added"}, {"item_id", message_id(meta_)},
                       {"output_index", message_index()}, {"content_index", 0}, {"part", output_text_part("")}}));
}

std::string ResponsesStream::frame(json event) {
  event["sequence_number"] = sequence_++;
  return "event: " + event["type"].get<std::string>() + "\ndata: " + dump_json(event) + "\n\n";
}

std::vector<std::string> ResponsesStream::begin() {
  const json in_progress = envelope(req_, meta_, "in_progress", json::array(), nullptr);
  std::vector<std::string> out = {frame({{"type", "response.created"}, {"response", in_progress}}),
                                  frame({{"type", "response.in_progress"}, {"response", in_progress}})};
  // Plain text: its message is open from the start. Held items are known when the text has ended;
  // live thinking opens its items as they come.
  if (!held() && !thinking_) open_message(out);
  return out;
}

std::vector<std::string> ResponsesStream::delta(const std::string& text, const json& logprobs) {
  for (const json& t : logprobs) {
    pending_.push_back(t);
    logprobs_.push_back(t);
  }
  if (text.empty()) return {};  // its tokens' logprobs go with the next text
  text_ += text;
  if (held()) return {};  // see begin()
  std::vector<std::string> out;
  if (thinking_) live_piece(thinking_->push(text), out);
  else text_delta(text, out);
  return out;
}

std::vector<std::string> ResponsesStream::end(FinishReason finish, const RequestUsage& usage, const std::string& error) {
  if (finish == FinishReason::kError) {
    json failed = envelope(req_, meta_, "failed", json::array(), responses_usage(usage));
    failed["error"] = {{"code", "server_error"}, {"message", "generation failed: " + error}};
    return {frame({{"type", "response.failed"}, {"response", failed}})};
  }
  const json final_response = response_object(req_, meta_, text_, finish, usage, logprobs_);
  if (held()) return held_items(final_response);
  std::vector<std::string> out;
  if (thinking_) live_piece(thinking_->finish(), out);
  open_message(out);  // the answer always has its message, empty when the thinking was cut
  if (!pending_.empty()) text_delta("", out);  // tokens whose text never came out (a stop string's), as chat sends them
  const json& message = final_response["output"].back();
  const std::string id = message_id(meta_);
  out.push_back(frame({{"type", "response.output_text.done"}, {"item_id", id}, {"output_index", message_index()},
                       {"content_index", 0}, {"text", content_}, {"logprobs", logprobs_}}));
  out.push_back(frame({{"type", "response.content_part.done"}, {"item_id", id}, {"output_index", message_index()},
                       {"content_index", 0}, {"part", message["content"][0]}}));
  out.push_back(frame({{"type", "response.output_item.done"}, {"output_index", message_index()}, {"item", message}}));
  const bool cut = finish == FinishReason::kLength;
  out.push_back(frame({{"type", cut ? "response.incomplete" : "response.completed"}, {"response", final_response}}));
  return out;
}

std::vector<std::string> ResponsesStream::held_items(const json& final_response) {
  // Each output item whole: a message as added, its part, one text delta and the done events; a
  // function call as added (no arguments yet), one arguments delta, and the done events.
  std::vector<std::string> out;
  const json& items = final_response["output"];
  for (size_t i = 0; i < items.size(); ++i) {
    const json& item = items[i];
    const std::string id = item["id"].get<std::string>();
    json added = item;
    added["status"] = "in_progress";
    if (item["type"] == "reasoning") {
      const std::string text = item["content"][0]["text"].get<std::string>();
      added["content"] = json::array();
      out.push_back(frame({{"type", "response.output_item.added"}, {"output_index", i}, {"item", added}}));
      out.push_back(frame({{"type", "response.reasoning_text.delta"}, {"item_id", id}, {"output_index", i},
                           {"content_index", 0}, {"delta", text}}));
      out.push_back(frame({{"type", "response.reasoning_text.done"}, {"item_id", id}, {"output_index", i},
                           {"content_index", 0}, {"text", text}}));
    } else if (item["type"] == "message") {
      const json& part = item["content"][0];
      const std::string text = part["text"].get<std::string>();
      added["content"] = json::array();
      json empty_part = part;
      empty_part["text"] = "";
      out.push_back(frame({{"type", "response.output_item.added"}, {"output_index", i}, {"item", added}}));
      out.push_back(frame({{"type", "response.content_part.added"}, {"item_id", id}, {"output_index", i},
                           {"content_index", 0}, {"part", empty_part}}));
      if (!text.empty())
        out.push_back(frame({{"type", "response.output_text.delta"}, {"item_id", id}, {"output_index", i},
                             {"content_index", 0}, {"delta", text}, {"logprobs", json::array()}}));
      out.push_back(frame({{"type", "response.output_text.done"}, {"item_id", id}, {"output_index", i},
                           {"content_index", 0}, {"text", text}, {"logprobs", json::array()}}));
      out.push_back(frame({{"type", "response.content_part.done"}, {"item_id", id}, {"output_index", i},
                           {"content_index", 0}, {"part", part}}));
    } else {
      const std::string arguments = item["arguments"].get<std::string>();
      added["arguments"] = "";
      out.push_back(frame({{"type", "response.output_item.added"}, {"output_index", i}, {"item", added}}));
      out.push_back(frame({{"type", "response.function_call_arguments.delta"}, {"item_id", id}, {"output_index", i},
                           {"delta", arguments}}));
      out.push_back(frame({{"type", "response.function_call_arguments.done"}, {"item_id", id}, {"output_index", i},
                           {"name", item["name"]}, {"arguments", arguments}}));
    }
    out.push_back(frame({{"type", "response.output_item.done"}, {"output_index", i}, {"item", item}}));
  }
  const bool cut = final_response["status"] == "incomplete";
  out.push_back(frame({{"type", cut ? "response.incomplete" : "response.completed"}, {"response", final_response}}));
  return out;
}

}  // namespace fathom
