#pragma once
// Speculative decoding inside continuous batching (docs/speculative.md). Per sequence and step:
// its drafter proposes up to k tokens (draft); the step computes the sequence's last token and the
// drafts as one dense verify step (SeqStep::verify: every row's logits, the KV cache read once for
// up to 8 rows); verify then draws each row's token exactly as a one-token step would (same
// logits bitwise: a row's attention and its 8-bit matmul rows do not depend on the batch; same
// sampler, mask and RNG draw) and keeps drafts while they equal the drawn tokens. Every token
// emitted is the one non-speculative decoding emits, greedy or sampled with a seed. The KV of the
// rows not kept is taken back (Backend::rollback_kv); none of it reaches the prefix cache.
#include <cstdint>

#include "engine/prefill_budget.h"
#include "engine/sequence.h"

namespace fathom {

class Backend;
class KvPlacement;
class Model;
class OutputProcessor;
struct EngineMetrics;
struct SchedulerConfig;

class Speculator {
 public:
  Speculator(const Model& model, Backend& backend, KvPlacement& kv, OutputProcessor& out, EngineMetrics& metrics,
             const SchedulerConfig& config);

  // What drafts cost in this step: the engine's fitted step costs (none yet: unknown) and the
  // step's decoding sequences.
  struct StepCosts {
    std::optional<StepCostModel::Fit> fit;
    int32_t decoding = 1;
  };
  // Appends up to min(max_draft_tokens, `budget`) draft tokens to running sequence `s` (its
  // last token pending) when its request speculates, its drafter proposes any, they are worth
  // their cost (below) and the KV has room for them; returns how many (Sequence::drafted).
  // Draft i is kept with chance α^i (α: the sequence's record) and then saves one token of plain
  // decoding, worth o/T + c (o: a step's fixed cost, T: the sequences decoding, c = a + b·len: one
  // row's matmuls and attention); its row costs c. So drafts go on while α^i > c / (o/T + c):
  // at batch 1, where o (reading the weights) dominates, at a modest α; at large batches, where
  // rows dominate, only for a sequence whose drafts are nearly always kept. Without a fit yet the
  // threshold is 1/2. Below it, one draft every 16th token keeps the record current.
  int32_t draft(Sequence& s, int32_t budget, const StepCosts& costs);
  // `s`'s verify step ran as plan.seqs[seq], its 1 + drafted rows of logits at `rows` (vocab
  // floats each): emits the tokens drawn from the rows up to the first that differs from its
  // draft (or ends the sequence), then takes back the KV of the rows not kept.
  void verify(Sequence& s, int32_t seq, float* rows);

 private:
  const Model& model_;
  Backend& backend_;
  KvPlacement& kv_;
  OutputProcessor& out_;
  EngineMetrics& metrics_;
  const SchedulerConfig& config_;
};

}  // namespace fathom
