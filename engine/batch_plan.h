#pragma once
// What one forward pass computes: for each sequence, a run of new tokens at consecutive
// positions whose K/V are appended to the sequence's paged cache, and which logits to return.
#include <cstdint>
#include <span>
#include <vector>

namespace fathom {

enum class LogitsWanted { kNone, kLast, kAll };

struct SeqStep {
  std::span<const int32_t> tokens;          // new tokens (prefill chunk or one decode token)
  int32_t pos0 = 0;                         // position of tokens[0]; positions < pos0 are cached
  const std::vector<int32_t>* blocks = nullptr;  // block table; covers pos0 + tokens.size()
  LogitsWanted logits = LogitsWanted::kLast;
};

struct BatchPlan {
  std::vector<SeqStep> seqs;
  // Rows of logits the forward pass returns, in sequence order.
  int64_t logits_rows() const {
    int64_t n = 0;
    for (const SeqStep& s : seqs)
      n += s.logits == LogitsWanted::kAll ? static_cast<int64_t>(s.tokens.size()) : s.logits == LogitsWanted::kLast;
    return n;
  }
};

}  // namespace fathom
