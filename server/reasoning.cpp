#include "server/reasoning.h"

#include <algorithm>

#include "engine/model/tokenizer.h"
#include "server/harmony.h"

namespace fathom {
namespace {

constexpr std::string_view kOpen = "<think>";
constexpr std::string_view kClose = "</think>";

// The length of the longest suffix of `s` that is a proper prefix of `tag`.
size_t partial_tag_tail(std::string_view s, std::string_view tag) {
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n)
    if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
  return 0;
}

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

}  // namespace

ReasoningPiece ReasoningSplit::push(std::string_view text) {
  ReasoningPiece out;
  held_.append(text);
  while (!held_.empty()) {
    switch (state_) {
      case State::kStart: {
        // Leading white space, then either "<think>" or the answer.
        const size_t first = held_.find_first_not_of(" \n\t\r");
        if (first == std::string::npos) return out;
        const std::string_view rest = std::string_view(held_).substr(first);
        if (rest.size() < kOpen.size() && kOpen.substr(0, rest.size()) == rest) return out;  // maybe "<think>"
        if (rest.substr(0, kOpen.size()) == kOpen) {
          held_.erase(0, first + kOpen.size());
          state_ = State::kInside;
        } else {
          state_ = State::kAnswer;
        }
        break;
      }
      case State::kInside: {
        const size_t close = held_.find(kClose);
        if (close == std::string::npos) {
          const size_t keep = partial_tag_tail(held_, kClose);
          out.reasoning += held_.substr(0, held_.size() - keep);
          held_.erase(0, held_.size() - keep);
          return out;
        }
        out.reasoning += held_.substr(0, close);
        held_.erase(0, close + kClose.size());
        state_ = State::kAnswerStart;
        break;
      }
      case State::kAnswerStart: {
        // The answer starts at its first non-space character (the templates put "\n\n" after </think>).
        size_t n = 0;
        while (n < held_.size() && is_space(held_[n])) ++n;
        held_.erase(0, n);
        if (held_.empty()) return out;
        state_ = State::kAnswer;
        break;
      }
      case State::kAnswer:
        out.content += held_;
        held_.clear();
        return out;
    }
  }
  return out;
}

ReasoningPiece ReasoningSplit::finish() {
  ReasoningPiece out;
  if (state_ == State::kInside) out.reasoning = std::move(held_);  // cut short while thinking
  else if (state_ == State::kStart || state_ == State::kAnswer) out.content = std::move(held_);
  held_.clear();
  return out;
}

ReasoningPiece split_reasoning(std::string_view text, bool starts_inside) {
  ReasoningSplit split(starts_inside);
  ReasoningPiece out = split.push(text);
  ReasoningPiece tail = split.finish();
  out.reasoning += tail.reasoning;
  out.content += tail.content;
  return out;
}

bool prompt_opens_thinking(std::string_view prompt_text) {
  const size_t open = prompt_text.rfind(kOpen);
  if (open == std::string_view::npos) return false;
  const size_t close = prompt_text.rfind(kClose);
  return close == std::string_view::npos || close < open;
}

ReasoningPiece split_answer(std::string_view text, const ReasoningMode& mode) {
  return mode.on ? split_reasoning(text, mode.open) : ReasoningPiece{"", std::string(text)};
}

ReasoningMode reasoning_mode(const ChatTemplate& tmpl, bool with_tools, std::string_view prompt_text) {
  ReasoningMode m;
  if (harmony_template(tmpl, with_tools)) {
    m.on = m.harmony = true;
    return m;
  }
  m.on = tmpl.is_jinja() && tmpl.source(with_tools).find(kClose) != std::string::npos;
  m.open = m.on && prompt_opens_thinking(prompt_text);
  return m;
}

ThinkingSpan thinking_span(const ReasoningMode& mode, const Tokenizer& tokenizer) {
  ThinkingSpan span;
  if (mode.harmony) {
    span.open_text = kHarmonyAnalysis;
    span.close_text = kHarmonyEnd;
  }
  if (!mode.on || mode.harmony) return span;
  span.end = tokenizer.token_id(kClose);
  if (span.end < 0) return span;
  span.open = mode.open;
  if (!span.open) span.start = tokenizer.token_id(kOpen);
  return span;
}

}  // namespace fathom
