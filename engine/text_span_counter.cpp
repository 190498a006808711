#include "engine/text_span_counter.h"

#include <stdexcept>
#include <utility>

namespace fathom {

TextSpanCounter::TextSpanCounter(std::string open, std::string close) : open_(std::move(open)), close_(std::move(close)) {
  if (open_.empty() || close_.empty()) throw std::invalid_argument("a text span needs an opening and a closing marker");
}

void TextSpanCounter::trim(size_t keep) {
  while (tokens_.size() > 1 && window_.size() - tokens_.front().bytes >= keep) {
    window_.erase(0, tokens_.front().bytes);
    tokens_.pop_front();
  }
}

int32_t TextSpanCounter::push(std::string_view text) {
  window_.append(text);
  tokens_.push_back(Token{text.size(), false});
  int32_t counted = 0;
  auto count = [&](Token& t) {
    if (!t.counted) ++counted;
    t.counted = true;
  };
  if (inside_) count(tokens_.back());
  for (;;) {
    const std::string& marker = inside_ ? close_ : open_;
    const size_t at = window_.find(marker);
    if (at == std::string::npos) {
      trim(marker.size() - 1);
      return counted;
    }
    if (!inside_) {  // every token with text at or after the marker's first byte is in the span
      size_t end = window_.size();
      for (auto t = tokens_.rbegin(); t != tokens_.rend() && end > at; ++t) {
        count(*t);
        end -= t->bytes;
      }
    }
    inside_ = !inside_;
    // What follows the marker is where the next one is looked for: all of it this token's text
    // (a marker ends in the newest token), and this token is counted already.
    window_.erase(0, at + marker.size());
    tokens_.assign(1, Token{window_.size(), true});
  }
}

}  // namespace fathom
