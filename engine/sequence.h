#pragma once
// Engine-internal state of one request and of each of its choices (sequences).
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/attention/decode_attention.h"
#include "engine/constraint/grammar.h"
#include "engine/engine.h"
#include "engine/text_span_counter.h"
#include "engine/text_stream.h"

namespace fathom {

using Clock = std::chrono::steady_clock;

struct RequestState;

enum class SeqState {
  kWaiting,   // needs (re)prefill before it holds blocks: new, or preempted by recompute
  kRunning,   // holds its blocks (in the device tier, the host tier, or both)
  kFinished,
};

// A block table entry whose K/V neither tier holds (ALISA's cache-or-recompute, docs/tiered_kv.md):
// a sequence's first `dropped_blocks` entries, which every step it runs in computes again.
inline constexpr int32_t kDroppedBlock = -1;

struct Sequence {
  RequestState* request = nullptr;
  int32_t choice = 0;
  SeqState state = SeqState::kWaiting;
  std::vector<int32_t> tokens;  // prompt + generated; the last one may not be computed yet
  int32_t n_computed = 0;       // tokens whose K/V are in the cache
  int32_t dropped = 0;          // tokens whose K/V the last recompute preemption dropped
  std::vector<int32_t> blocks;  // block table (one reference held per entry but kDroppedBlock ones)
  int32_t dropped_blocks = 0;   // leading entries that are kDroppedBlock
  bool restoring = false;       // this step recomputes the dropped blocks into new ones of its own
  int32_t n_registered = 0;     // leading full blocks offered to the prefix index
  uint64_t last_hash = 0;       // chain hash of block n_registered - 1
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<TextStream> text;
  std::unique_ptr<ConstraintMatcher> matcher;  // set when the request carries an output constraint
  SeqPolicyState policy_state;  // the decode attention policy's state (HiP mask, SWA mass)
  Clock::time_point last_token_time;
  bool prompt_logprobs_sent = false;  // its first event carried the request's prompt logprobs
  bool thinking = false;              // inside the request's thinking span (reasoning tokens counted)
  std::unique_ptr<TextSpanCounter> thinking_text;  // a thinking span of text markers (ThinkingSpan::open_text)
  // Speculative decoding: draft tokens at the end of `tokens` that the next verify step verifies
  // (they are never computed as the sequence's own: the verify step keeps or drops them).
  int32_t drafted = 0;
  // Sparse drafting (Speculation::kSparse): drafts still to propose in this round, one sparse
  // one-token step each; the verify step follows the last. Those steps append K/V at the drafts'
  // positions, which the verify step writes again, and change the running planes (V sum, K
  // moments) of the block holding its last own position: `running_before_drafts` keeps them as
  // they were (Backend::read_running; empty: nothing to put back) for the next step at its own
  // position to put back first.
  int32_t drafting = 0;
  std::vector<float> running_before_drafts;
  // Its drafts' record, for the chance that the next draft is kept (hits / (hits + misses)): kept
  // drafts, and verify steps that rejected one; recent steps weigh most. Starts at 2/3.
  double draft_hits = 2, draft_misses = 1;
  uint64_t draft_id = 0;  // the draft model's name for it (Speculation::kModel); 0: none yet
  Speculation round_drafter = Speculation::kOff;  // what drafted the round under way (kAuto picks per round)

  int32_t generated() const;
  // Tokens of its own not computed yet (drafts excluded).
  int32_t pending() const { return static_cast<int32_t>(tokens.size()) - drafted - n_computed; }
  // Forgets its drafts (a preemption, or drafting that ran out of room); the running planes they
  // changed are still put back by its next step.
  void drop_drafts() {
    tokens.resize(tokens.size() - static_cast<size_t>(drafted));
    drafted = 0;
    drafting = 0;
  }
};

struct RequestState {
  Request request;
  std::shared_ptr<RequestHandle> handle;
  uint64_t order = 0;  // arrival order (FCFS within a priority)
  Clock::time_point arrival;
  Clock::time_point admitted;     // first admission (prefill starts)
  Clock::time_point first_token;  // valid once first_token_seen
  bool first_token_seen = false;
  bool forked = false;  // n > 1: the choices beyond 0 exist
  int32_t unfinished = 0;
  RequestUsage usage;
  std::shared_ptr<const CompiledConstraint> constraint;  // compiled Request::constraint, or null
  AttentionPolicy draft_attention;  // Speculation::kSparse: the policy its draft steps decode through
  std::vector<std::unique_ptr<Sequence>> seqs;
  // Request::prompt_logprobs >= 0: the prompt tokens scored so far (entry 0 has no logprob);
  // complete when it has prompt.size() entries.
  std::vector<SampledToken> prompt_logprobs;
  bool wants_prompt_logprobs() const {
    return request.prompt_logprobs >= 0 && prompt_logprobs.size() < request.prompt.size();
  }
  // An embedding request (Request::embedding): the sum (mean pooling) or the pooled row so far,
  // dim values.
  std::vector<double> pooled;
  bool embeds() const { return request.embedding != Pooling::kNone; }
};

// Scheduling order: higher priority first, then arrival (FCFS).
inline bool served_before(const RequestState& a, const RequestState& b) {
  if (a.request.priority != b.request.priority) return a.request.priority > b.request.priority;
  return a.order < b.order;
}

// Between sequences: their requests' order, then choice order within a request.
inline bool served_before(const Sequence& a, const Sequence& b) {
  return a.request == b.request ? a.choice < b.choice : served_before(*a.request, *b.request);
}

inline int32_t Sequence::generated() const {
  return static_cast<int32_t>(tokens.size()) - static_cast<int32_t>(request->request.prompt.size());
}

}  // namespace fathom
