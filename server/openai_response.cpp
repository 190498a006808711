#include "server/openai_response.h"

#include <cmath>
#include <cstdio>

#include "base/utf8.h"
#include "engine/model/tokenizer.h"
#include "server/answer.h"

namespace fathom {

namespace {

using nlohmann::json;

json nullable(const std::string& s) { return s.empty() ? json(nullptr) : json(s); }

const char* error_type(int status) {
  switch (status) {
    case 400: case 404: case 413: return "invalid_request_error";
    case 401: return "authentication_error";
    case 429: return "rate_limit_error";
    case 503: return "service_unavailable_error";
    default: return "server_error";
  }
}

json finish_json(FinishReason r) { return r == FinishReason::kNone ? json(nullptr) : json(api_finish_reason(r)); }

// A token as the completions API names it: its text when that is valid UTF-8 on its own, else
// OpenAI's "bytes:\xe2\x80" spelling, so tokens that are parts of one character stay distinct
// instead of all becoming U+FFFD.
std::string token_name(const std::string& bytes) {
  if (is_valid_utf8(bytes)) return bytes;
  std::string name = "bytes:";
  for (const unsigned char c : bytes) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "\\x%02x", c);
    name += hex;
  }
  return name;
}

// Completions shape: parallel arrays over the tokens, top alternatives as {name: logprob} (two
// alternatives with the same name — possible only in odd vocabularies — are told apart by
// "token_id:N", never merged). text_offset counts characters, as OpenAI's does.
// `prompt`: echoed prompt tokens scored before `tokens` (a prompt's first token has no logprob:
// NaN, written as null with null alternatives, as OpenAI does).
json completion_logprobs(const std::vector<SampledToken>& prompt, const std::vector<SampledToken>& tokens,
                         Utf8Offset& text_offset, const Tokenizer& tok) {
  json out = {{"tokens", json::array()}, {"token_logprobs", json::array()}, {"top_logprobs", json::array()},
              {"text_offset", json::array()}};
  for (size_t i = 0; i < prompt.size() + tokens.size(); ++i) {
    const SampledToken& t = i < prompt.size() ? prompt[i] : tokens[i - prompt.size()];
    const std::string bytes = tok.token_bytes(t.id);
    out["tokens"].push_back(token_name(bytes));
    if (std::isnan(t.logprob)) {
      out["token_logprobs"].push_back(nullptr);
      out["top_logprobs"].push_back(nullptr);
      out["text_offset"].push_back(text_offset.chars());
      text_offset.feed(bytes);
      continue;
    }
    out["token_logprobs"].push_back(t.logprob);
    json top = json::object();
    for (const auto& [id, lp] : t.top) {
      std::string key = token_name(tok.token_bytes(id));
      if (top.contains(key)) key = "token_id:" + std::to_string(id);
      top[key] = lp;
    }
    out["top_logprobs"].push_back(std::move(top));
    out["text_offset"].push_back(text_offset.chars());
    text_offset.feed(bytes);
  }
  return out;
}

json token_bytes_json(const std::string& bytes) {
  json out = json::array();
  for (const unsigned char c : bytes) out.push_back(static_cast<int>(c));
  return out;
}

// Chat shape: {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}.
json chat_logprobs(const std::vector<SampledToken>& tokens, const Tokenizer& tok) {
  json content = json::array();
  for (const SampledToken& t : tokens) {
    const std::string text = tok.token_bytes(t.id);
    json top = json::array();
    for (const auto& [id, lp] : t.top) {
      const std::string alt = tok.token_bytes(id);
      top.push_back({{"token", alt}, {"logprob", lp}, {"bytes", token_bytes_json(alt)}});
    }
    content.push_back({{"token", text}, {"logprob", t.logprob}, {"bytes", token_bytes_json(text)}, {"top_logprobs", top}});
  }
  return {{"content", std::move(content)}, {"refusal", nullptr}};
}

json envelope(const ApiRequest& req, const ResponseMeta& meta, bool chunk) {
  const char* object = req.kind == ApiKind::kChat ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                                  : "text_completion";
  return {{"id", meta.id}, {"object", object}, {"created", meta.created}, {"model", meta.model},
          {"system_fingerprint", "fathom"}};
}

}  // namespace

std::string dump_json(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

const char* api_finish_reason(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    // Neither reaches a client as a finish_reason (OpenAI has no such values): an error, or a
    // request cut short by a drain, ends a stream with an error event and a collected answer
    // with an error status (server/sse.cpp).
    case FinishReason::kCancelled: return "length";
    case FinishReason::kError: return "stop";
    case FinishReason::kNone: return "";
  }
  return "";
}

json error_body(int status, const std::string& message, const std::string& param, const std::string& code) {
  return {{"error", {{"message", message}, {"type", error_type(status)}, {"param", nullable(param)}, {"code", nullable(code)}}}};
}

json usage_json(const RequestUsage& usage) {
  json u = {{"prompt_tokens", usage.prompt_tokens},
            {"completion_tokens", usage.completion_tokens},
            {"total_tokens", usage.prompt_tokens + usage.completion_tokens}};
  u["prompt_tokens_details"] = {{"cached_tokens", usage.cached_prompt_tokens}};  // served from the prefix cache
  u["completion_tokens_details"] = {{"reasoning_tokens", usage.reasoning_tokens}};  // inside <think>…</think>
  return u;
}

json completion_response(const ApiRequest& req, const ResponseMeta& meta, const std::vector<ChoiceOutput>& choices,
                         const RequestUsage& usage, const Tokenizer& tokenizer) {
  json out = envelope(req, meta, false);
  json list = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    Utf8Offset offset;
    list.push_back({{"index", i},
                    {"text", choices[i].text},
                    {"logprobs", req.logprobs ? completion_logprobs(choices[i].prompt_logprobs, choices[i].logprobs, offset, tokenizer)
                                              : json(nullptr)},
                    {"finish_reason", finish_json(choices[i].finish)}});
  }
  out["choices"] = std::move(list);
  out["usage"] = usage_json(usage);
  return out;
}

json chat_response(const ApiRequest& req, const ResponseMeta& meta, const std::vector<ChoiceOutput>& choices,
                   const RequestUsage& usage, const Tokenizer& tokenizer) {
  json out = envelope(req, meta, false);
  json list = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    // A reasoning model's thinking comes back beside the answer, and tool calls apart from its text.
    const AnswerParts answer =
        answer_parts(req.reasoning, req.tools, choices[i].text, choices[i].finish, tool_call_id_prefix(meta, i));
    json message = {{"role", "assistant"}, {"content", answer.content}};
    if (req.reasoning.on) message["reasoning_content"] = answer.reasoning.empty() ? json(nullptr) : json(answer.reasoning);
    json finish = finish_json(choices[i].finish);
    if (!answer.calls.empty()) {
      message["content"] = answer.content.empty() ? json(nullptr) : json(answer.content);
      message["tool_calls"] = tool_calls_json(answer.calls, false);
      if (choices[i].finish == FinishReason::kStop) finish = "tool_calls";
    }
    list.push_back({{"index", i},
                    {"message", std::move(message)},
                    {"logprobs", req.logprobs ? chat_logprobs(choices[i].logprobs, tokenizer) : json(nullptr)},
                    {"finish_reason", std::move(finish)}});
  }
  out["choices"] = std::move(list);
  out["usage"] = usage_json(usage);
  return out;
}

std::string tool_call_id_prefix(const ResponseMeta& meta, size_t choice) {
  return "call_" + meta.id.substr(meta.id.rfind('-') + 1) + "_" + std::to_string(choice) + "_";
}

json stream_chunk(const ApiRequest& req, const ResponseMeta& meta, const StreamEvent& event, bool first,
                  Utf8Offset& text_offset, const Tokenizer& tokenizer) {
  json out = envelope(req, meta, true);
  json choice = {{"index", event.choice}};
  if (req.kind == ApiKind::kChat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!event.text.empty() || first) delta["content"] = event.text;
    choice["delta"] = std::move(delta);
    choice["logprobs"] = req.logprobs && !event.logprobs.empty() ? chat_logprobs(event.logprobs, tokenizer) : json(nullptr);
  } else {
    choice["text"] = event.text;
    const bool any = !event.logprobs.empty() || !event.prompt_logprobs.empty();
    choice["logprobs"] = req.logprobs && any
                             ? completion_logprobs(event.prompt_logprobs, event.logprobs, text_offset, tokenizer)
                             : json(nullptr);
  }
  choice["finish_reason"] = finish_json(event.finish);
  out["choices"] = json::array({std::move(choice)});
  if (req.include_usage) out["usage"] = nullptr;
  return out;
}

json chat_logprobs_json(const std::vector<SampledToken>& tokens, const Tokenizer& tokenizer) {
  return chat_logprobs(tokens, tokenizer);
}

json chat_delta_chunk(const ApiRequest& req, const ResponseMeta& meta, int32_t choice, json delta, bool first,
                      const json& finish_reason, json logprobs) {
  if (first) {
    delta["role"] = "assistant";
    if (!delta.contains("content")) delta["content"] = nullptr;
  }
  json out = envelope(req, meta, true);
  out["choices"] = json::array(
      {{{"index", choice}, {"delta", std::move(delta)}, {"logprobs", std::move(logprobs)}, {"finish_reason", finish_reason}}});
  if (req.include_usage) out["usage"] = nullptr;
  return out;
}

json usage_chunk(const ApiRequest& req, const ResponseMeta& meta, const RequestUsage& usage) {
  json out = envelope(req, meta, true);
  out["choices"] = json::array();
  out["usage"] = usage_json(usage);
  return out;
}

std::string sse_frame(const json& j) { return "data: " + dump_json(j) + "\n\n"; }

}  // namespace fathom
