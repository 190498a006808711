#include "server/tool_stream.h"

#include <algorithm>

#include "server/openai_response.h"

namespace fathom {
namespace {

using json = nlohmann::json;
constexpr std::string_view kPythonTag = "<|python_tag|>";

json content_delta(const std::string& text) { return {{"content", text}}; }

// The length of the longest suffix of `s` that is a proper prefix of `marker`.
size_t open_prefix_tail(const std::string& s, std::string_view marker) {
  for (size_t n = std::min(s.size(), marker.size() - 1); n > 0; --n)
    if (s.compare(s.size() - n, n, marker.substr(0, n)) == 0) return n;
  return 0;
}

}  // namespace

std::vector<json> ToolCallStream::push(const std::string& text) {
  if (text.empty()) return {};
  if (plan_.mode == ToolPlan::Mode::kNamed) {
    json call = {{"index", 0}, {"function", {{"arguments", text}}}};
    if (!header_sent_) {
      call["id"] = tool_call_id(plan_, id_prefix_, 0);
      call["type"] = "function";
      call["function"]["name"] = plan_.named;
      header_sent_ = true;
    }
    return {{{"tool_calls", json::array({std::move(call)})}}};
  }
  if (plan_.mode != ToolPlan::Mode::kAuto || !held_.empty()) {
    held_ += text;
    return {};
  }
  if (plan_.format == ToolPlan::Format::kLlamaJson) return push_llama(text);
  const std::string_view marker = call_marker(plan_.format);
  pending_ += text;
  if (const size_t open = pending_.find(marker); open != std::string::npos) {
    held_ = pending_.substr(open);
    const std::string before = pending_.substr(0, open);
    pending_.clear();
    if (before.empty()) return {};
    return {content_delta(before)};
  }
  const size_t keep = open_prefix_tail(pending_, marker);
  if (keep == pending_.size()) return {};
  std::string out = pending_.substr(0, pending_.size() - keep);
  pending_.erase(0, pending_.size() - keep);
  return {content_delta(out)};
}

// Llama 3.x writes a call as the whole answer: one that starts with '{' or <|python_tag|> is held
// and parsed at the end; any other streams as content from its first non-space character.
std::vector<json> ToolCallStream::push_llama(const std::string& text) {
  if (plain_) return {content_delta(text)};
  pending_ += text;
  const size_t b = pending_.find_first_not_of(" \n\t");
  if (b == std::string::npos) return {};
  const std::string_view rest = std::string_view(pending_).substr(b);
  if (rest[0] == '{' || rest.substr(0, kPythonTag.size()) == kPythonTag) {
    held_ = std::move(pending_);
    pending_.clear();
    return {};
  }
  if (rest.size() < kPythonTag.size() && kPythonTag.substr(0, rest.size()) == rest) return {};
  plain_ = true;
  std::string out = std::move(pending_);
  pending_.clear();
  return {content_delta(out)};
}

std::vector<json> ToolCallStream::finish(FinishReason finish, json& reason) {
  reason = finish == FinishReason::kNone ? json(nullptr) : json(api_finish_reason(finish));
  std::vector<json> out;
  if (plan_.mode == ToolPlan::Mode::kNamed) {
    if (!header_sent_)  // no text at all: the call still exists, with empty arguments
      out.push_back({{"tool_calls", json::array({{{"index", 0}, {"id", tool_call_id(plan_, id_prefix_, 0)}, {"type", "function"},
                                                   {"function", {{"name", plan_.named}, {"arguments", ""}}}}})}});
    if (finish == FinishReason::kStop) reason = "tool_calls";
    return out;
  }
  if (!pending_.empty()) out.push_back(content_delta(pending_));
  pending_.clear();
  if (held_.empty()) return out;
  std::string content;
  const std::vector<ToolCall> calls = answer_tool_calls(plan_, held_, finish, content, id_prefix_);
  if (calls.empty()) {
    out.push_back(content_delta(held_));
  } else {
    if (!content.empty()) out.push_back(content_delta(content));
    out.push_back({{"tool_calls", tool_calls_json(calls, true)}});
    reason = "tool_calls";
  }
  held_.clear();
  return out;
}

}  // namespace fathom
