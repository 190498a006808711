#include "server/harmony.h"

#include <algorithm>
#include <optional>

#include <nlohmann/json.hpp>

#include "server/bounded_json.h"

namespace fathom {
namespace {

using nlohmann::json;

constexpr std::string_view kChannel = "<|channel|>", kMessage = "<|message|>", kStart = "<|start|>",
                           kConstrain = "<|constrain|>", kRecipient = "to=", kFunctions = "functions.";
constexpr std::string_view kEnds[] = {"<|end|>", "<|call|>", "<|return|>"};
// How a header starts: the first one right after the prompt's "<|start|>assistant", a later one
// with its own <|start|>, a call's recipient before its channel.
constexpr std::string_view kOpenings[] = {"<|channel|>", "<|start|>", " to="};

bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

// The length of the longest suffix of `s` that is a proper prefix of `marker`.
size_t partial_tail(std::string_view s, std::string_view marker) {
  for (size_t n = std::min(s.size(), marker.size() - 1); n > 0; --n)
    if (s.substr(s.size() - n) == marker.substr(0, n)) return n;
  return 0;
}

// Whether `header` (text where a header goes, <|message|> not yet seen) can still become one: it
// starts like one (or is the start of an opening), fits kMaxHeader and holds no newline. True of
// every prefix of a text it is true of, so a stream cut anywhere decides as the whole text does.
bool may_be_header(std::string_view header) {
  if (header.size() > HarmonySplit::kMaxHeader || header.find('\n') != std::string_view::npos) return false;
  for (std::string_view opening : kOpenings)
    if (starts_with(header, opening) || starts_with(opening, header)) return true;
  return false;
}

bool word_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

struct Header {
  std::string channel;
  std::string recipient;  // "functions.get_weather"; "" for none
};

// [<|start|>assistant] then, in any order and separated by spaces where the model puts them,
// <|channel|>NAME, to=RECIPIENT and a content type (<|constrain|>json, or a bare word). nullopt
// for anything else, or for a header naming neither a channel nor a recipient.
std::optional<Header> read_header(std::string_view h) {
  Header out;
  if (starts_with(h, kStart)) {
    h.remove_prefix(kStart.size());
    if (!starts_with(h, "assistant")) return std::nullopt;
    h.remove_prefix(9);
  }
  bool typed = false;
  auto take = [&](bool (*ok)(char)) {
    size_t n = 0;
    while (n < h.size() && ok(h[n])) ++n;
    const std::string word(h.substr(0, n));
    h.remove_prefix(n);
    return word;
  };
  while (!h.empty()) {
    if (h[0] == ' ') {
      h.remove_prefix(1);
    } else if (starts_with(h, kChannel)) {
      h.remove_prefix(kChannel.size());
      if (!out.channel.empty()) return std::nullopt;
      out.channel = take(word_char);
      if (out.channel.empty()) return std::nullopt;
    } else if (starts_with(h, kRecipient)) {
      h.remove_prefix(kRecipient.size());
      if (!out.recipient.empty()) return std::nullopt;
      out.recipient = take([](char c) { return c != ' ' && c != '<'; });
      if (out.recipient.empty()) return std::nullopt;
    } else {
      if (starts_with(h, kConstrain)) h.remove_prefix(kConstrain.size());
      if (typed || take(word_char).empty()) return std::nullopt;
      typed = true;
    }
  }
  if (out.channel.empty() && out.recipient.empty()) return std::nullopt;
  return out;
}

std::string_view trim(std::string_view s) {
  const size_t b = s.find_first_not_of(" \n\t\r"), e = s.find_last_not_of(" \n\t\r");
  return b == std::string_view::npos ? std::string_view() : s.substr(b, e - b + 1);
}

// An optional analysis message, as a structural tag: its body is any text without <|end|>, and the
// next message's <|start|>assistant follows it.
json optional_analysis() {
  const json body = {{"type", "any_text"}, {"excludes", json::array({"<|end|>"})}};
  const json analysis = {{"type", "tag"},
                         {"begin", "<|channel|>analysis<|message|>"},
                         {"content", body},
                         {"end", "<|end|><|start|>assistant"}};
  return {{"type", "structural_tag"}, {"format", {{"type", "optional"}, {"content", analysis}}}};
}

}  // namespace

HarmonyPiece HarmonySplit::push(std::string_view text) {
  HarmonyPiece out;
  held_.append(text);
  for (;;) {
    switch (state_) {
      case State::kRaw:
        emit(Kind::kContent, held_, out);
        held_.clear();
        return out;
      case State::kHeader: {
        const size_t at = held_.find(kMessage);
        // What is surely header: all but a tail that may begin <|message|>.
        const size_t sure = at != std::string::npos ? at : held_.size() - partial_tail(held_, kMessage);
        if (!may_be_header(std::string_view(held_).substr(0, sure))) {
          state_ = State::kRaw;  // not harmony: the rest is content as written
          in_message_[0] = in_message_[1] = false;
          continue;
        }
        if (at == std::string::npos) return out;
        header_ = held_.substr(0, at);
        held_.erase(0, at + kMessage.size());
        state_ = State::kBody;
        open_message(out);
        continue;
      }
      case State::kBody: {
        size_t at = std::string::npos, length = 0;
        for (std::string_view end : kEnds)
          if (const size_t p = held_.find(end); p < at) at = p, length = end.size();
        if (at == std::string::npos) {
          size_t keep = 0;
          for (std::string_view end : kEnds) keep = std::max(keep, partial_tail(held_, end));
          emit(kind_, std::string_view(held_).substr(0, held_.size() - keep), out);
          held_.erase(0, held_.size() - keep);
          return out;
        }
        emit(kind_, std::string_view(held_).substr(0, at), out);
        held_.erase(0, at + length);
        close_message(/*complete=*/true, out);
        state_ = State::kHeader;
        continue;
      }
    }
  }
}

HarmonyPiece HarmonySplit::finish(FinishReason finish) {
  HarmonyPiece out;
  switch (state_) {
    case State::kRaw:
      emit(Kind::kContent, held_, out);
      break;
    case State::kHeader:  // a header the answer stopped in is content as written; one it was cut in, nothing
      in_message_[0] = in_message_[1] = false;
      if (finish == FinishReason::kStop) emit(Kind::kContent, held_, out);
      break;
    case State::kBody:  // the answer ended inside a message: stopping closes it
      emit(kind_, held_, out);
      close_message(finish == FinishReason::kStop, out);
      break;
  }
  held_.clear();
  state_ = State::kRaw;
  return out;
}

void HarmonySplit::open_message(HarmonyPiece& out) {
  in_message_[0] = in_message_[1] = false;
  call_body_.clear();
  const std::optional<Header> header = read_header(header_);
  if (header && !header->recipient.empty()) {
    kind_ = Kind::kCall;
    call_name_ = starts_with(header->recipient, kFunctions) ? header->recipient.substr(kFunctions.size()) : "";
  } else if (header && header->channel == "analysis") {
    kind_ = Kind::kReasoning;
  } else {
    kind_ = Kind::kContent;
    const bool known = header && (header->channel == "final" || header->channel == "commentary");
    if (!known) emit(Kind::kContent, header_ + std::string(kMessage), out);  // unreadable: as written
  }
}

void HarmonySplit::close_message(bool complete, HarmonyPiece& out) {
  if (kind_ != Kind::kCall) return;
  const std::string_view arguments = trim(call_body_);
  bool valid = complete && plan_.offered() && !call_name_.empty();
  if (valid) {
    valid = std::any_of(plan_.tools.begin(), plan_.tools.end(), [&](const ToolSpec& t) { return t.name == call_name_; });
  }
  if (valid) valid = parse_bounded_json(arguments).is_object();
  if (valid) {
    out.calls.push_back({tool_call_id(plan_, id_prefix_, calls_++), call_name_, std::string(arguments)});
  } else {  // not a call this answer can make: the message as written
    emit(Kind::kContent, header_ + std::string(kMessage) + call_body_, out);
  }
  call_body_.clear();
}

void HarmonySplit::emit(Kind kind, std::string_view text, HarmonyPiece& out) {
  if (text.empty()) return;
  if (kind == Kind::kCall) {
    call_body_.append(text);
    return;
  }
  const int k = kind == Kind::kReasoning ? 0 : 1;
  std::string& to = k == 0 ? out.reasoning : out.content;
  if (seen_[k] && !in_message_[k]) to += '\n';  // messages of one kind are joined by a newline
  seen_[k] = in_message_[k] = true;
  to.append(text);
}

HarmonyPiece split_harmony(std::string_view text, FinishReason finish, const ToolPlan& plan,
                           const std::string& id_prefix) {
  HarmonySplit split(plan, id_prefix);
  HarmonyPiece out = split.push(text);
  HarmonyPiece tail = split.finish(finish);
  out.reasoning += tail.reasoning;
  out.content += tail.content;
  out.calls.insert(out.calls.end(), tail.calls.begin(), tail.calls.end());
  return out;
}

bool harmony_template(const ChatTemplate& tmpl, bool with_tools) {
  if (!tmpl.is_jinja()) return false;
  const std::string& source = tmpl.source(with_tools);
  return source.find(kChannel) != std::string::npos && source.find(kMessage) != std::string::npos;
}

OutputConstraint harmony_tool_constraint(const ToolPlan& plan) {
  OutputConstraint c;
  if (plan.mode != ToolPlan::Mode::kNamed && plan.mode != ToolPlan::Mode::kRequired) return c;
  c.kind = OutputConstraint::Kind::kTagged;
  c.text = optional_analysis().dump();
  for (const ToolSpec& t : plan.tools) {
    if (plan.mode == ToolPlan::Mode::kNamed && t.name != plan.named) continue;
    // The header as OpenAI's harmony guide writes a call, and as the template writes past ones.
    for (const std::string& begin : {"<|channel|>commentary to=functions." + t.name + " <|constrain|>json<|message|>",
                                     " to=functions." + t.name + "<|channel|>commentary json<|message|>"})
      c.tagged.push_back({begin, t.parameters.dump(), t.strict});
  }
  return c;
}

OutputConstraint harmony_answer_constraint(const OutputConstraint& answer) {
  if (answer.kind != OutputConstraint::Kind::kJson && answer.kind != OutputConstraint::Kind::kJsonSchema) return answer;
  OutputConstraint c;
  c.kind = OutputConstraint::Kind::kTagged;
  c.text = optional_analysis().dump();
  const bool object = answer.kind == OutputConstraint::Kind::kJson;  // json_object: any object
  c.tagged.push_back({"<|channel|>final<|message|>", object ? R"({"type": "object"})" : answer.text,
                      object ? false : answer.strict});
  return c;
}

}  // namespace fathom
