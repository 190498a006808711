#pragma once
// Iteration-level continuous batching. Every step():
//   1. finishes cancelled requests (their blocks are released in this step);
//   2. gives every running sequence room for its next token — a block in the device tier, else
//      in the host tier; when both are full, first by dropping running sequences' oldest blocks
//      (ALISA's cache-or-recompute: every step computes them again, in a scratch one layer
//      large), then by preempting the lowest-priority, latest-arrived sequences by recompute
//      (blocks dropped, sequence re-queued for prefill); dropped blocks come back when room does;
//   3. admits waiting sequences in (priority, arrival) order while the step has token and
//      sequence budget and their whole prompt fits in free + evictable blocks, reusing the
//      longest cached prefix;
//   4. moves the blocks the step writes into the device tier (trading slots with the blocks
//      written longest ago) and runs one forward pass over decode tokens (one each) and prefill
//      chunks, samples, detokenizes, checks stops and streams events. Prefill chunks share what the decode tokens
//      leave of max_batched_tokens by water-filling (each gets min(what it wants, an equal share
//      of the rest)), so a short prompt is not queued behind a long one's whole prefill.
// Steps 1-3 plan, 4 runs and then updates. Error boundary: an exception while planning or
// updating a request fails that request; an exception in the forward pass fails every request
// in the step (FinishReason::kError with the message: HTTP 500, gRPC INTERNAL, an SSE error
// event); their blocks are freed and every other request goes on.
// n > 1 requests prefill once; at the first sample the other choices fork off, sharing the full
// prompt blocks and copying the partial last one (copy-on-write).
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "engine/batch_plan.h"
#include "engine/engine.h"
#include "engine/kv/block_allocator.h"
#include "engine/prefill_budget.h"
#include "engine/kv/prefix_index.h"
#include "engine/sequence.h"

namespace fathom {

class Backend;
class Model;

class Scheduler {
 public:
  // The allocator gets backend.kv_blocks() blocks of the backend's block size.
  Scheduler(const Model& model, Backend& backend, const SchedulerConfig& config, MetricsRegistry& metrics);
  ~Scheduler();

  void add(std::unique_ptr<RequestState> request);
  bool has_work() const { return !requests_.empty(); }
  void step();
  void cancel_all();  // finishes every request as cancelled
  void fail_all(const std::string& message);  // finishes every request with an error

  const BlockAllocator& allocator() const { return allocator_; }
  // The cache-or-recompute model measured at construction: a request up to both tiers plus its
  // capacity_tokens can finish.
  const RecomputeModel& recompute_model() const { return recompute_; }
  // The limits it runs with: the configured ones, or smaller steps when the device tier could
  // not hold every block a configured step writes.
  const SchedulerConfig& config() const { return config_; }
  int32_t running_requests() const;
  int32_t waiting_requests() const;

 private:
  struct Metrics;

  int32_t take_block();                      // a free block, evicting a cached prefix if needed; -1: none
  bool allocate_block(Sequence& seq);        // appends take_block()
  bool ensure_room(Sequence& seq, int32_t tokens);
  int32_t available_blocks() const;          // free + evictable
  void preempt(Sequence& victim);             // by recompute
  // ALISA's cache-or-recompute (engine/scheduler_recompute.cpp, docs/tiered_kv.md).
  // The cost model: recompute and transfer time per token, measured now (recompute_).
  void measure_recompute_cost();
  // Drops the oldest droppable block of the running sequence where that costs the fewest
  // recomputed tokens — the block's tokens every step until the soonest running sequence ends —
  // if fewer than `preempt_cost` (what the preemption it replaces would recompute);
  // `host_only`: only a block in the host tier. False when none may be dropped.
  bool drop_oldest_block(bool host_only, int64_t preempt_cost);
  // Gives sequences with dropped blocks new blocks when the tiers have room for them and more:
  // their next step recomputes into those (Sequence::restoring).
  void restore_dropped();
  // Adds to the plan the recompute of `s`'s dropped blocks (`s` is at plan index `owner`).
  void plan_recompute(BatchPlan& plan, const Sequence& s, int32_t owner);
  // Host tier: the blocks `plan` writes move into device slots (demoting the blocks written
  // longest ago that it does not write) and the plan's block tables become physical ones.
  void make_resident(BatchPlan& plan, const std::vector<Sequence*>& planned, const std::vector<int32_t>& chunk_of);
  // The device block written longest ago that this step does not write, or -1.
  int32_t next_device_victim();
  // The last running sequence in (priority, arrival) order, nullptr when that is `except`; with
  // `fitting`, the last one other than `except` that fits_both_tiers (nullptr: none).
  Sequence* pick_victim(const Sequence* except, bool fitting = false);
  // Its tokens and the next one fit both tiers: preempted, it can be admitted again.
  bool fits_both_tiers(const Sequence& s) const;
  int32_t running_sequences() const;
  void admit(Sequence& seq);                 // prefix lookup, blocks for the whole prompt
  void release_blocks(Sequence& seq);
  void register_full_blocks(Sequence& seq);
  void fork_choices(RequestState& r, const float* logits);
  // A step returned every-position logits for `rows` positions from pos0 (logits_ rows
  // first_row...): appends the prompt tokens they score to the request's prompt logprobs.
  void score_prompt(Sequence& seq, int64_t pos0, int64_t first_row, int64_t rows);
  // The first event of a choice carries the request's prompt logprobs once they are complete.
  void attach_prompt_logprobs(Sequence& seq, StreamEvent& ev);
  // `constraint_done`: the output constraint's verdict when the caller already advanced it past
  // `tok` (update_step does, in parallel); computed here otherwise.
  void accept_token(Sequence& seq, const SampledToken& tok, std::optional<bool> constraint_done = std::nullopt);
  // Ends a choice: releases its blocks and sends its last event (`tail`: text still to emit).
  void finish(Sequence& seq, FinishReason reason, std::string tail = {}, const std::string& error = {});
  // Ends every unfinished choice of `r` with FinishReason::kError and `message`.
  void fail_request(RequestState& r, const std::string& message);
  // Runs f(); an exception from it fails request `r` (the error boundary). False when it threw.
  template <typename F>
  bool guarded(RequestState& r, F&& f);
  void plan_step(BatchPlan& plan, std::vector<Sequence*>& planned, std::vector<int32_t>& chunk_of);
  void update_step(const BatchPlan& plan, const std::vector<Sequence*>& planned, const std::vector<int32_t>& chunk_of);
  void remove_finished();
  void reap_cancelled();
  void update_gauges();
  // fathom_attention_break_even_keys for every break-even the backend has measured.
  void export_break_evens();

  const Model& model_;
  Backend& backend_;
  SchedulerConfig config_;
  int32_t scratch_blocks_ = 0;  // the backend's recompute scratch (set while allocator_ is made)
  BlockAllocator allocator_;
  std::unique_ptr<Metrics> metrics_;
  size_t break_evens_exported_ = 0;
  PrefixIndex prefix_;
  std::vector<std::vector<int32_t>> physical_;  // this step's physical block tables, by plan index
  std::vector<int64_t> written_step_;            // per block id: the last step that wrote it (steps_: this one)
  int64_t steps_ = 0;                            // steps that went through make_resident
  std::vector<std::unique_ptr<RequestState>> requests_;
  std::mt19937_64 seed_rng_{0x5eed};
  std::vector<float> logits_;
  StepCostModel step_cost_;  // what a prefill chunk costs, learned from step times
  RecomputeModel recompute_;   // capacity_tokens: what all running sequences may have dropped at once
  int32_t dropped_tokens_ = 0;  // dropped now (restoring ones included)
  std::vector<int32_t> recompute_owner_;  // plan.seqs past `planned`: the plan index each recomputes for
};

}  // namespace fathom
