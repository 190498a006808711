#pragma once
// Per-choice output text: incremental detokenization plus stop strings. Text that could be the
// start of a stop string is held back until it is known not to be one, so a stop string that
// spans several tokens is never leaked to the client.
#include <cstdint>
#include <string>
#include <vector>

#include "engine/model/tokenizer.h"

namespace fathom {

class TextStream {
 public:
  // `shown`: control tokens whose vocabulary text is emitted (Request::shown_tokens).
  TextStream(const Tokenizer& tokenizer, std::vector<std::string> stops, std::vector<int32_t> shown = {})
      : tokenizer_(tokenizer), detok_(tokenizer), stops_(std::move(stops)), shown_(std::move(shown)) {}

  struct Piece {
    std::string text;      // safe to emit now
    bool stopped = false;  // a stop string appeared; `text` ends right before it
    std::string added;     // the token's own text, before stop strings hold any back
  };
  Piece push(int32_t token);
  std::string finish();  // everything still held back (call when the choice ends without a stop)

 private:
  size_t held_suffix() const;  // bytes at the end of pending_ that begin some stop string

  const Tokenizer& tokenizer_;
  IncrementalDetokenizer detok_;
  std::vector<std::string> stops_;
  std::vector<int32_t> shown_;
  std::string pending_;
};

}  // namespace fathom
