#pragma once
// Counts the generated tokens inside spans of text that open and close with marker strings — the
// thinking of a reasoning format whose markers are text, not single tokens: gpt-oss's analysis
// channel, "<|channel|>analysis" … "<|end|>" (control tokens in gpt-oss's own vocabulary, several
// text tokens each in another's). Markers are counted with their span, as <think> and </think>
// are; a token counts when any of its text lies inside a span. Holds the bytes a marker could still
// complete, no more.
#include <cstdint>
#include <deque>
#include <string>
#include <string_view>

namespace fathom {

class TextSpanCounter {
 public:
  TextSpanCounter(std::string open, std::string close);  // both non-empty

  // One generated token's text (possibly empty: a character still incomplete). Returns how many
  // tokens become counted: this one if inside a span, plus the earlier tokens an opening marker it
  // completes spans.
  int32_t push(std::string_view text);
  bool inside() const { return inside_; }

 private:
  struct Token {
    size_t bytes;   // of window_
    bool counted;
  };
  // Drops whole tokens from the front of the window while it keeps at least `keep` bytes.
  void trim(size_t keep);

  std::string open_, close_;
  bool inside_ = false;
  std::string window_;         // the latest text, where the next marker is looked for
  std::deque<Token> tokens_;   // the tokens window_ holds text of, oldest first
};

}  // namespace fathom
