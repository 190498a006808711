#include "engine/speculative/drafter.h"

#include <algorithm>

namespace fathom {

const char* speculation_name(Speculation s) {
  switch (s) {
    case Speculation::kOff: return "off";
    case Speculation::kNgram: return "ngram";
    case Speculation::kSparse: return "sparse";
    case Speculation::kModel: return "model";
    case Speculation::kAuto: return "auto";
  }
  return "off";
}

std::optional<Speculation> parse_speculation(std::string_view name) {
  for (const Speculation s :
       {Speculation::kOff, Speculation::kNgram, Speculation::kSparse, Speculation::kModel, Speculation::kAuto})
    if (name == speculation_name(s)) return s;
  return std::nullopt;
}

std::vector<int32_t> ngram_draft(std::span<const int32_t> tokens, int32_t max, int32_t n_max, int32_t n_min) {
  const auto len = static_cast<int64_t>(tokens.size());
  if (max <= 0) return {};
  for (int64_t n = std::min<int64_t>(n_max, len - 1); n >= std::max(n_min, 1); --n) {
    const std::span<const int32_t> suffix = tokens.subspan(static_cast<size_t>(len - n));
    // Latest first: the text just written predicts the next tokens best. Start i ends before the
    // suffix's last token, so at least one token follows the match.
    for (int64_t i = len - n - 1; i >= 0; --i) {
      if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + i)) continue;
      const int64_t from = i + n, to = std::min(len, from + max);
      return std::vector<int32_t>(tokens.begin() + from, tokens.begin() + to);
    }
  }
  return {};
}

}  // namespace fathom
