#pragma once
// What one forward pass computes: for each sequence, a run of new tokens at consecutive
// positions whose K/V are appended to the sequence's paged cache, and which rows of logits (and
// of final hidden states, for embeddings) to return.
#include <cstdint>
#include <span>
#include <vector>

#include "engine/attention/decode_attention.h"

namespace fathom {

// Which of a step's token rows an output is wanted for: none, the last, all, or the first (an
// embedding's CLS position).
enum class LogitsWanted { kNone, kLast, kAll, kFirst };

// How many of a step's n rows `w` wants, and the first of them.
inline int64_t wanted_rows(LogitsWanted w, int64_t n) {
  return w == LogitsWanted::kAll ? n : w == LogitsWanted::kNone || n == 0 ? 0 : 1;
}
inline int64_t first_wanted_row(LogitsWanted w, int64_t n) { return w == LogitsWanted::kLast ? n - 1 : 0; }

struct SeqStep {
  std::span<const int32_t> tokens;          // new tokens (prefill chunk or one decode token)
  int32_t pos0 = 0;                         // position of tokens[0]; positions < pos0 are cached
  const std::vector<int32_t>* blocks = nullptr;  // block table; covers pos0 + tokens.size()
  LogitsWanted logits = LogitsWanted::kLast;
  // Decode attention of a one-token step (nullptr: dense). `policy_state` is the sequence's own
  // (HiP mask, SWA mass); the model sizes it to the layer count.
  const AttentionPolicy* policy = nullptr;
  SeqPolicyState* policy_state = nullptr;
  // Rows of final hidden states (after the final norm: what an embedding pools), none by default.
  LogitsWanted hidden = LogitsWanted::kNone;
  // Speculative decoding's verify step (the sequence's last token, then its drafts; dense, every
  // row's logits): the sequence may keep only its first rows, and the backend keeps what
  // Backend::rollback_kv needs to take the others back.
  bool verify = false;
};

// One-token dense decode steps whose sequences hold the same physical blocks for leading
// positions: attention reads each shared segment once for all its members (bifurcated attention,
// DESIGN.md) and every member's own suffix separately. Segments nest (a system prompt shared by
// all, a document shared by some); a member's segments tile [0, end of its deepest segment).
struct SharedSpan {
  int32_t begin = 0, end = 0;    // positions, whole blocks, before every member's current token
  std::vector<int32_t> members;  // indices into BatchPlan::seqs
};
struct AttentionGroup {
  std::vector<SharedSpan> segments;  // outermost first
  std::vector<int32_t> members;      // every sequence in some segment
};

struct BatchPlan {
  std::vector<SeqStep> seqs;
  std::vector<AttentionGroup> groups;
  // Rows of logits the forward pass returns, in sequence order.
  int64_t logits_rows() const {
    int64_t n = 0;
    for (const SeqStep& s : seqs) n += wanted_rows(s.logits, static_cast<int64_t>(s.tokens.size()));
    return n;
  }
};

}  // namespace fathom
