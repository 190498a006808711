#pragma once
// Speculative decoding inside continuous batching (docs/speculative.md). Per sequence and step:
// its drafter proposes up to k tokens (draft); the step computes the sequence's last token and the
// drafts as one dense verify step (SeqStep::verify: every row's logits, the KV cache read once for
// up to 8 rows); verify then draws each row's token exactly as a one-token step would (same
// logits bitwise: a row's attention and its 8-bit matmul rows do not depend on the batch; same
// sampler, mask and RNG draw) and keeps drafts while they equal the drawn tokens. Every token
// emitted is the one non-speculative decoding emits, greedy or sampled with a seed. The KV of the
// rows not kept is taken back (Backend::rollback_kv); none of it reaches the prefix cache.
//
// Drafters: prompt lookup (kNgram) drafts at once, in the step it is verified. The sparse drafter
// (kSparse) is the same model decoding through a sparse policy over the same KV cache: a round of
// k one-token draft steps (greedy: each draft the argmax of its sparse row), planned with the
// other sequences' steps like any decode token, then the verify step. The draft steps append K/V
// at the drafts' positions, which the verify step writes again; the running planes they changed
// are kept before the round's first draft step and put back before the verify step (prepare()).
// The draft model (kModel) proposes its k drafts in the step they are verified, like prompt
// lookup, by k passes of a smaller model over its own KV cache (engine/speculative/draft_model.h):
// draft() books the round, run_model_rounds() runs the step's rounds together.
#include <cstdint>
#include <optional>
#include <vector>

#include "engine/batch_plan.h"
#include "engine/prefill_budget.h"
#include "engine/sequence.h"

namespace fathom {

class Backend;
class DraftModel;
class KvPlacement;
class Model;
class OutputProcessor;
struct EngineMetrics;
struct SchedulerConfig;

// The number j ≤ k of drafts whose round gives the most tokens per cost, 0 when none beats plain
// decoding: a round of j drafts, each kept with chance α^i, emits Σ_{i≤j} α^i tokens on average
// (the verify step's own token and each kept draft) for j draft passes of `draft` each and a verify
// step of `dense` plus j rows of `extra_row`; a plain step emits one token for `dense`.
int32_t best_round(double alpha, int32_t k, double dense, double draft, double extra_row);
// best_round, or, when it says none, one draft on every 16th generated token (a probe keeps the
// sequence's record current) — unless drafts kept every time would not pay either (a model whose
// draft steps save little, as Gemma 3's with 5 of 6 layers local: its probes cost 6% at 32k).
int32_t round_or_probe(double alpha, int32_t k, double dense, double draft, double extra_row, int32_t generated);

class Speculator {
 public:
  // `draft`: the server's draft model (kModel), null when it has none.
  Speculator(const Model& model, Backend& backend, KvPlacement& kv, OutputProcessor& out, EngineMetrics& metrics,
             const SchedulerConfig& config, DraftModel* draft = nullptr);

  // What drafts cost in this step: the engine's fitted step costs (none yet: unknown) and the
  // step's decoding sequences.
  struct StepCosts {
    std::optional<StepCostModel::Fit> fit;
    int32_t decoding = 1;
    double equivalent_positions = 0;  // StepCostModel::equivalent_positions() (0: unknown)
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
  //
  // kSparse starts a round instead (returns 0): sets s.drafting to the k whose expected tokens per
  // cost is best and above a plain step's (draft i kept with chance α^i; a draft step costs a row
  // reading kv_read_ratio of the KV, the verify step about one dense row); none where the policy
  // runs densely at this length (below its break-even) or no k pays.
  //
  // kModel books a round of k drafts instead and returns k (s.drafted stays 0): the drafts, up to k,
  // come from run_model_rounds(), which the step calls once every decoding sequence had its turn.
  int32_t draft(Sequence& s, int32_t budget, const StepCosts& costs);
  // The booked draft-model rounds, computed together (the draft model's passes advance all of
  // them): their drafts appended as draft() appends prompt lookup's (if the KV has room). A
  // failing draft model leaves them without drafts (they decode plainly).
  void run_model_rounds();
  // The policy a sparse draft step of request `r` decodes through: the request's sparse policy (auto
  // when it decodes densely) at SchedulerConfig::draft_kv_read_ratio.
  AttentionPolicy draft_policy(const Request& r) const;
  // After the step's blocks are resident, before its forward: the first draft step of a round keeps
  // the running planes of the block it appends to (unless it opens that block), and a sequence's
  // next step at its own position puts them back.
  void prepare(const BatchPlan& plan, const std::vector<Sequence*>& planned, int32_t block_size);
  // `s`'s sparse draft step ran; `row` (vocab floats) proposes the next draft: its argmax. The round
  // ends early at an end-of-generation draft, at the sequence's limits or without KV room.
  void drafted(Sequence& s, const float* row);
  // `s`'s verify step ran as plan.seqs[seq], its 1 + drafted rows of logits at `rows` (vocab
  // floats each): emits the tokens drawn from the rows up to the first that differs from its
  // draft (or ends the sequence), then takes back the KV of the rows not kept.
  void verify(Sequence& s, int32_t seq, float* rows);
  // `s` finished: the draft model's cache of it goes.
  void forget(Sequence& s);

 private:
  const Model& model_;
  Backend& backend_;
  KvPlacement& kv_;
  OutputProcessor& out_;
  EngineMetrics& metrics_;
  const SchedulerConfig& config_;
  DraftModel* draft_;
  uint64_t next_draft_id_ = 1;
  // The draft model's record over every sequence (kept drafts, verify steps that rejected one;
  // recent ones weigh most): how well the pair agrees is the pair's, so a new sequence starts
  // from it, not from a fixed guess it could never revise (it gets no rounds while the guess says no).
  double pair_hits_ = 0, pair_misses_ = 0;
  struct ModelRound {
    Sequence* seq;
    int32_t k;
  };
  std::vector<ModelRound> model_rounds_;  // booked this step, run by run_model_rounds()
  // One drafter's round for `s` (k drafts at most): the drafts appended (sparse: 0, s.drafting set;
  // model: the drafts booked).
  int32_t ngram_round(Sequence& s, int32_t k, const StepCosts& costs);
  int32_t model_round(Sequence& s, int32_t k, const StepCosts& costs);
  int32_t sparse_round(Sequence& s, int32_t k, const StepCosts& costs);
  int32_t sparse_draft_tokens(const Sequence& s, int32_t k, const StepCosts& costs) const;
  // From the engine's fitted step costs, for a sequence of `len` tokens: a plain step's share
  // without its attention (o/T + a), with it (+ b·len), and what each extra verify row adds (a,
  // plus half a decode row's attention where the forward runs on the host: sparse_draft_tokens).
  // None before a fit with positive step and token costs.
  struct FittedRows {
    double fixed, position_s, dense, extra_row;
  };
  std::optional<FittedRows> fitted_rows(const StepCosts& costs, double len) const;
  int32_t model_draft_tokens(const Sequence& s, int32_t k, const StepCosts& costs) const;
  int32_t append_drafts(Sequence& s, const std::vector<int32_t>& drafts);  // into the sequence (if room)
};

}  // namespace fathom
