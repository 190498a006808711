#pragma once
// What a step's logits become for each sequence: its next token (sampled under its output
// constraint's mask), the text that became final (detokenized, stop strings held back), logprobs
// and prompt logprobs, the n > 1 choices forked at the first sample, and every event and finish
// sent to the request's handle, with the latency and token metrics. The Scheduler decides which
// sequences run and where their blocks go (engine/kv_placement.h); this object turns what ran into
// what the client sees.
#include <cstdint>
#include <future>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "engine/batch_plan.h"
#include "engine/sequence.h"

namespace fathom {

class Backend;
class KvPlacement;
class Model;
struct EngineMetrics;

class OutputProcessor {
 public:
  // `backend`: for host_parallel_for; `kv`: a finished choice's blocks go back there.
  OutputProcessor(const Model& model, Backend& backend, KvPlacement& kv, EngineMetrics& metrics);

  // A new request's first choice (its sampler, detokenizer, constraint matcher), waiting.
  void start(RequestState& r);

  // The output constraints' masks for the positions `plan` samples depend only on the tokens
  // accepted so far: prefetch_masks computes them on another thread while the forward runs — when
  // the forward leaves the host idle (a device backend). The CPU backend's forward keeps every core
  // busy, so there a mask is computed where it is applied (a second thread measured +6% per step at
  // batch 16, bench/results/structured_overhead.md). A failure leaves a mask unprepared; draw()
  // computes it again inside the request's guard. The thread is joined by join() or on destruction.
  class MaskPrefetch {
   public:
    MaskPrefetch() = default;
    explicit MaskPrefetch(std::future<void> done) : done_(std::move(done)) {}
    MaskPrefetch(MaskPrefetch&&) = default;
    MaskPrefetch& operator=(MaskPrefetch&&) = delete;
    ~MaskPrefetch() { join(); }
    void join() {
      if (done_.valid()) done_.wait();
    }

   private:
    std::future<void> done_;
  };
  // `planned[i]` runs as plan.seqs[i]. The plan and sequences must outlive the returned object.
  MaskPrefetch prefetch_masks(const BatchPlan& plan, const std::vector<Sequence*>& planned);

  // One sequence's next token, drawn from its logits row.
  struct Draw {
    bool drawn = false;  // false: no row, finished, or the first sample of n > 1 choices (forked in hand_over)
    SampledToken token;
    std::optional<bool> constraint_done;  // the constraint's verdict after accepting the token
    std::string error;                    // hand_over fails the request with it
  };
  // In parallel, each sequence with a row (rows[i] >= 0, into `logits` of vocab floats a row):
  // masks what its output constraint cannot take, samples, advances the constraint. Sampling a
  // 49k-entry row costs ~40 µs, a constraint's accept 10-40 µs: at batch 16 a serial loop would be
  // ~1 ms of every step.
  std::vector<Draw> draw(const std::vector<Sequence*>& seqs, const std::vector<int64_t>& rows, std::vector<float>& logits);
  // The same for one sequence and its logits row `row` (vocab floats), on this thread.
  Draw draw_one(Sequence& s, float* row);
  // Gives `s` its drawn token: an event, or its finish. For the first sample of n > 1 choices (not
  // drawn), masks `row` (its logits), forks the other choices from it and samples each.
  void hand_over(Sequence& s, const Draw& d, float* row);
  // `rows` rows of every-position logits from `logits` (position pos0 first): appends the prompt
  // tokens they score to the request's prompt logprobs.
  void score_prompt(Sequence& s, int64_t pos0, const float* logits, int64_t rows);
  // An embedding request's final hidden states of positions [pos0, pos0 + rows) (dim floats a
  // row), pooled into the request as its Request::embedding says.
  void pool(Sequence& s, int64_t pos0, const float* hidden, int64_t rows);

  // Ends a choice: releases its blocks and sends its last event (`tail`: text still to emit).
  void finish(Sequence& s, FinishReason reason, std::string tail = {}, const std::string& error = {});
  // Ends every unfinished choice of `r` with FinishReason::kError and `message`.
  void fail_request(RequestState& r, const std::string& message);
  // Runs f(); an exception from it fails request `r` (the error boundary). False when it threw.
  template <typename F>
  bool guarded(RequestState& r, F&& f) {
    try {
      f();
      return true;
    } catch (const std::exception& e) {
      fail_request(r, e.what());
      return false;
    }
  }

 private:
  // `constraint_done`: the constraint's verdict when the caller already advanced it past `tok`.
  void accept_token(Sequence& s, const SampledToken& tok, std::optional<bool> constraint_done = std::nullopt);
  void fork_choices(RequestState& r, const float* logits);
  // Counts `token` (just appended to `s`, its text `text`) to the request's reasoning tokens while
  // `s` is inside its thinking span (Request::thinking), its markers included.
  void count_reasoning(Sequence& s, int32_t token, std::string_view text);
  // The first event of a choice carries the request's prompt logprobs once they are complete.
  void attach_prompt_logprobs(Sequence& s, StreamEvent& ev);

  const Model& model_;
  Backend& backend_;
  KvPlacement& kv_;
  EngineMetrics& metrics_;
  std::mt19937_64 seed_rng_{0x5eed};  // a seed per choice when the request sets none
};

}  // namespace fathom
