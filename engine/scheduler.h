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
// A speculating sequence's decode token comes with its drafts as one verify step
// (engine/speculative/speculator.h), planned with the decode tokens.
// The Scheduler plans and runs steps; two parts it drives own the rest: KvPlacement
// (engine/kv_placement.h) every move of KV blocks, OutputProcessor (engine/output_processor.h)
// what logits become for the client.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/batch_plan.h"
#include "engine/engine.h"
#include "engine/kv/block_allocator.h"
#include "engine/kv_placement.h"
#include "engine/prefill_budget.h"
#include "engine/sequence.h"

namespace fathom {

class Backend;
class DraftModel;
class Model;
class OutputProcessor;
class Speculator;
struct EngineMetrics;

class Scheduler {
 public:
  // The KV placement gets backend.kv_blocks() blocks of the backend's block size.
  // `draft`: the draft model of Speculation::kModel (not owned), null without one.
  Scheduler(const Model& model, Backend& backend, const SchedulerConfig& config, MetricsRegistry& metrics,
            DraftModel* draft = nullptr);
  ~Scheduler();

  void add(std::unique_ptr<RequestState> request);
  bool has_work() const { return !requests_.empty(); }
  void step();
  void cancel_all();  // finishes every request as cancelled
  void fail_all(const std::string& message);  // finishes every request with an error

  const BlockAllocator& allocator() const { return kv_->allocator(); }
  // The cache-or-recompute model measured at construction: a request up to both tiers plus its
  // capacity_tokens can finish.
  const RecomputeModel& recompute_model() const { return kv_->recompute_model(); }
  // The limits it runs with: the configured ones, or smaller steps when the device tier could
  // not hold every block a configured step writes.
  const SchedulerConfig& config() const { return config_; }
  int32_t running_requests() const;
  int32_t waiting_requests() const;

 private:
  // The last running sequence in (priority, arrival) order, nullptr when that is `except`; with
  // `fitting`, the last one other than `except` that fits both tiers (nullptr: none).
  Sequence* pick_victim(const Sequence* except, bool fitting = false);
  int32_t running_sequences() const;
  std::vector<Sequence*> unfinished_sequences();  // in the order requests arrived
  void admit(Sequence& seq);  // prefix lookup; the caller takes blocks for the whole prompt
  void plan_step(BatchPlan& plan, std::vector<Sequence*>& planned, std::vector<int32_t>& chunk_of);
  void update_step(const BatchPlan& plan, const std::vector<Sequence*>& planned, const std::vector<int32_t>& chunk_of);
  void remove_finished();
  void reap_cancelled();
  void update_gauges();

  const Model& model_;
  Backend& backend_;
  SchedulerConfig config_;
  std::unique_ptr<EngineMetrics> metrics_;
  std::unique_ptr<KvPlacement> kv_;       // where blocks live: tiers, prefix cache, cache-or-recompute
  std::unique_ptr<OutputProcessor> out_;  // sampling, detokenizing, stops, events
  std::unique_ptr<Speculator> spec_;      // drafts and their verification (speculative decoding)
  const AttentionPolicy dense_;           // the decode policy of requests that speculate (exact output)
  std::vector<std::unique_ptr<RequestState>> requests_;
  std::vector<float> logits_;
  std::vector<float> hidden_;  // the step's final hidden states of embedding requests (rows, dim)
  StepCostModel step_cost_;  // what a prefill chunk costs, learned from step times
};

}  // namespace fathom
