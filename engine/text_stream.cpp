#include "engine/text_stream.h"

#include <algorithm>

#include "base/failpoints.h"

namespace fathom {

size_t TextStream::held_suffix() const {
  size_t held = 0;
  for (const std::string& stop : stops_) {
    const size_t max_len = std::min(stop.size() - 1, pending_.size());
    for (size_t len = max_len; len > held; --len)
      if (pending_.compare(pending_.size() - len, len, stop, 0, len) == 0) {
        held = len;
        break;
      }
  }
  return held;
}

TextStream::Piece TextStream::push(int32_t token) {
  failpoints::hit("detokenize");
  // A shown control token's text goes after whatever the detokenizer completed (a character it
  // still holds unfinished is cut by it: an invalid sequence either way).
  Piece out;
  if (std::find(shown_.begin(), shown_.end(), token) != shown_.end()) out.added = detok_.flush() + tokenizer_.piece(token);
  else out.added = detok_.push(token);
  pending_ += out.added;
  size_t first_stop = std::string::npos;
  for (const std::string& stop : stops_)
    if (!stop.empty()) first_stop = std::min(first_stop, pending_.find(stop));
  if (first_stop != std::string::npos) {
    out.text = pending_.substr(0, first_stop);
    out.stopped = true;
    pending_.clear();
    return out;
  }
  const size_t keep = held_suffix();
  out.text = pending_.substr(0, pending_.size() - keep);
  pending_.erase(0, pending_.size() - keep);
  return out;
}

std::string TextStream::finish() {
  std::string out = pending_ + detok_.flush();
  pending_.clear();
  return out;
}

}  // namespace fathom
