#include "engine/speculative/speculator.h"

#include <algorithm>

#include "engine/backend/backend.h"
#include "engine/engine_metrics.h"
#include "engine/kv_placement.h"
#include "engine/model/model.h"
#include "engine/output_processor.h"
#include "engine/model/tokenizer.h"
#include "engine/speculative/draft_model.h"

namespace fathom {

int32_t best_round(double alpha, int32_t k, double dense, double draft, double extra_row) {
  int32_t best = 0;
  double best_gain = 1, tokens = 1, kept = 1;
  for (int32_t j = 1; j <= k; ++j) {
    kept *= alpha;
    tokens += kept;
    const double gain = tokens * dense / (j * draft + dense + j * extra_row);
    if (gain > best_gain) best = j, best_gain = gain;
  }
  return best;
}

int32_t round_or_probe(double alpha, int32_t k, double dense, double draft, double extra_row, int32_t generated) {
  const int32_t best = best_round(alpha, k, dense, draft, extra_row);
  if (best > 0 || generated % 16 != 0) return best;
  return best_round(1.0, k, dense, draft, extra_row) > 0 ? 1 : 0;
}

Speculator::Speculator(const Model& model, Backend& backend, KvPlacement& kv, OutputProcessor& out,
                       EngineMetrics& metrics, const SchedulerConfig& config, DraftModel* draft)
    : model_(model), backend_(backend), kv_(kv), out_(out), metrics_(metrics), config_(config), draft_(draft) {}

int32_t Speculator::draft(Sequence& s, int32_t budget, const StepCosts& costs) {
  const Request& r = s.request->request;
  s.drafted = 0;
  if (r.speculative == Speculation::kOff || !backend_.implements_rollback() || s.pending() != 1 ||
      s.generated() < 1 || s.dropped_blocks > 0 || s.request->embeds())
    return 0;
  // The step emits at most drafts + 1 tokens: none past max_tokens or the context.
  const auto len = static_cast<int32_t>(s.tokens.size());
  int32_t k = std::min({config_.max_draft_tokens, budget, r.max_tokens - s.generated() - 1,
                        model_.config().context_length - len - 1});
  if (k <= 0) return 0;
  switch (r.speculative) {
    case Speculation::kSparse: return sparse_round(s, k, costs);
    case Speculation::kModel: return model_round(s, k, costs);
    case Speculation::kNgram: return ngram_round(s, k, costs);
    case Speculation::kAuto:
      // The cheapest proposal first: prompt lookup scans the tokens, the draft model runs k
      // passes of a smaller model, sparse k steps of this one. The latter two only once the
      // engine's step costs are fitted: their priors assume a step of one sequence (16 clients:
      // 0.92-0.94× of plain without this wait).
      if (const int32_t n = ngram_round(s, k, costs)) return n;
      if (!costs.fit) return 0;
      if (const int32_t n = model_round(s, k, costs)) return n;
      return sparse_round(s, k, costs);
    case Speculation::kOff: break;
  }
  return 0;
}

int32_t Speculator::sparse_round(Sequence& s, int32_t k, const StepCosts& costs) {
  s.drafting = sparse_draft_tokens(s, k, costs);
  if (s.drafting > 0) s.round_drafter = Speculation::kSparse;
  return 0;
}

int32_t Speculator::model_round(Sequence& s, int32_t k, const StepCosts& costs) {
  if (draft_ == nullptr) return 0;
  if (s.draft_id == 0) s.draft_id = next_draft_id_++;
  // Steps without a round leave the draft model's cache behind; the next round catches it up
  // with the tokens it missed, as one chunk.
  k = model_draft_tokens(s, k, costs);
  if (k == 0) return 0;
  s.round_drafter = Speculation::kModel;
  model_rounds_.push_back(ModelRound{&s, k});
  return k;
}

void Speculator::run_model_rounds() {
  std::vector<ModelRound> booked;
  booked.swap(model_rounds_);
  if (booked.empty()) return;
  std::vector<DraftModel::Round> rounds;
  for (const ModelRound& m : booked) rounds.push_back(DraftModel::Round{m.seq->draft_id, m.seq->tokens, m.k, {}});
  try {
    draft_->propose(rounds);
  } catch (const std::exception&) {  // the draft model failed: these sequences decode plainly
    return;
  }
  for (size_t i = 0; i < rounds.size(); ++i) append_drafts(*booked[i].seq, rounds[i].drafts);
}

int32_t Speculator::ngram_round(Sequence& s, int32_t k, const StepCosts& costs) {
  s.round_drafter = Speculation::kNgram;
  const auto len = static_cast<int32_t>(s.tokens.size());
  if (!config_.adaptive_drafts) return append_drafts(s, ngram_draft(s.tokens, k));
  double threshold = 0.5;
  if (costs.fit && costs.fit->step_s > 0 && costs.fit->token_s > 0) {
    const double row = costs.fit->token_s + std::max(0.0, costs.fit->position_s) * len;
    threshold = row / (costs.fit->step_s / std::max(1, costs.decoding) + row);
  }
  const double alpha = s.draft_hits / (s.draft_hits + s.draft_misses);
  int32_t worth = 0;
  for (double p = alpha; worth < k && p > threshold; p *= alpha) ++worth;
  // A sequence whose record says no still tries one draft every 16th token: text that starts to
  // repeat itself (an answer quoting its prompt after an introduction) gets its drafts back.
  if (worth == 0 && s.generated() % 16 == 0) worth = 1;
  return worth > 0 ? append_drafts(s, ngram_draft(s.tokens, std::min(k, worth))) : 0;
}

int32_t Speculator::append_drafts(Sequence& s, const std::vector<int32_t>& drafts) {
  const auto len = static_cast<int32_t>(s.tokens.size());
  if (drafts.empty()) return 0;
  s.tokens.insert(s.tokens.end(), drafts.begin(), drafts.end());
  if (!kv_.ensure_room(s, static_cast<int32_t>(s.tokens.size()))) {  // no room now: one token this step
    s.tokens.resize(len);
    kv_.trim_blocks(s);
    return 0;
  }
  s.drafted = static_cast<int32_t>(drafts.size());
  return s.drafted;
}

AttentionPolicy Speculator::draft_policy(const Request& r) const {
  AttentionPolicy p = r.attention;
  if (p.kind == kDensePolicy) p.kind = policy_kind("auto");
  p.kv_read_ratio = config_.draft_kv_read_ratio;
  return p;
}

int32_t Speculator::sparse_draft_tokens(const Sequence& s, int32_t k, const StepCosts& costs) const {
  const AttentionPolicy& p = s.request->draft_attention;
  const double len = static_cast<double>(s.tokens.size());
  const int32_t min_keys = p.min_keys == AttentionPolicy::kMeasuredBreakEven ? backend_.prepare_break_even(p) : p.min_keys;
  if (len < min_keys) return 0;  // the draft steps would read the whole KV: nothing to gain
  if (!config_.adaptive_drafts) return k;
  // A row's cost: dense (one plain step of this sequence), sparse (a draft step) and each row a
  // verify step adds to the dense one. From the fitted step costs (o/T + a + b·positions); before a
  // fit, in units of a token's matmuls with E positions of attention costing as much, and a verify
  // row's matmuls a fifth of a step's (at batch 1 the weights are read once for all rows). A verify
  // row's attention is nearly free where attention is bound by reading the KV (a GPU: the rows
  // share the read), but on a CPU its FLOPs show: SmolLM2 at 7.4k keys on 2 cores, a 5-row verify
  // step took 53 ms against 21 ms for a one-token step (9 ms for a 1/16 sparse one), i.e. each row
  // adds about half a decode row's attention.
  const double e = costs.equivalent_positions > 0 ? costs.equivalent_positions : 1e30;  // unknown: no gain
  const double row_attention = backend_.forward_occupies_host() ? 0.5 : 0.0;
  double dense = 1 + len / e, sparse = 1 + len * p.kv_read_ratio / e, extra_row = 0.2 + row_attention * len / e;
  if (const std::optional<FittedRows> f = fitted_rows(costs, len); f && f->position_s > 0) {
    dense = f->dense;
    sparse = f->fixed + f->position_s * len * p.kv_read_ratio;
    extra_row = f->extra_row;
  }
  const double alpha = s.draft_hits / (s.draft_hits + s.draft_misses);
  return round_or_probe(alpha, k, dense, sparse, extra_row, s.generated());
}

int32_t Speculator::model_draft_tokens(const Sequence& s, int32_t k, const StepCosts& costs) const {
  if (!config_.adaptive_drafts) return k;
  // A draft pass costs what the draft model measured; a plain step and a verify row what the
  // engine's fit says (o/T + a + b·len; a verify row a + half a row's attention on a CPU, as for
  // the sparse drafter). Until both are known, in units of a plain step: a draft pass the share
  // of the weight bytes it reads (at batch 1 a pass is bound by reading its weights), a verify
  // row a fifth of a step (its matmuls; the weights are read once for all rows).
  const double draft_s = draft_->seconds_per_draft();
  double dense = 1.0, draft = static_cast<double>(draft_->model().weights().matrix_bytes) /
                              std::max(1.0, static_cast<double>(model_.weights().matrix_bytes)),
         extra_row = 0.2;
  if (const std::optional<FittedRows> f = fitted_rows(costs, static_cast<double>(s.tokens.size())); f && draft_s > 0) {
    dense = f->dense;
    draft = draft_s;
    extra_row = f->extra_row;
  }
  // No round every 16th token for a sequence whose record says no (as prompt lookup has): the
  // draft model would first compute the tokens it missed since its last round, a prefill costing
  // about as much per token as the rounds could save (SmolLM2's Q4_1 drafting for its Q8_0, 2 CPU
  // cores: 12-20% slower than plain with those rounds, docs/speculative.md).
  const double alpha = (s.draft_hits + pair_hits_) / (s.draft_hits + s.draft_misses + pair_hits_ + pair_misses_);
  return best_round(alpha, k, dense, draft, extra_row);
}

std::optional<Speculator::FittedRows> Speculator::fitted_rows(const StepCosts& costs, double len) const {
  if (!costs.fit || !(costs.fit->step_s > 0) || !(costs.fit->token_s > 0)) return std::nullopt;
  const double position_s = std::max(0.0, costs.fit->position_s);
  const double row_attention = backend_.forward_occupies_host() ? 0.5 : 0.0;
  const double fixed = costs.fit->step_s / std::max(1, costs.decoding) + costs.fit->token_s;
  return FittedRows{fixed, position_s, fixed + position_s * len, costs.fit->token_s + row_attention * position_s * len};
}

void Speculator::forget(Sequence& s) {
  if (draft_ != nullptr && s.draft_id != 0) draft_->forget(s.draft_id);
  s.draft_id = 0;
}

void Speculator::prepare(const BatchPlan& plan, const std::vector<Sequence*>& planned, int32_t block_size) {
  for (size_t i = 0; i < planned.size(); ++i) {
    Sequence& s = *planned[i];
    const SeqStep& step = plan.seqs[i];
    // Only a step at the sequence's own position, inside a block (one that opens a block carries
    // the block before it, which no draft step changed).
    if (step.pos0 != s.n_computed || step.pos0 % block_size == 0) continue;
    const int32_t slot = (*step.blocks)[static_cast<size_t>(step.pos0 / block_size)];
    const bool first_draft_step = s.drafting > 0 && s.drafted == 0;
    if (!s.running_before_drafts.empty()) {  // an earlier round's steps changed them
      backend_.write_running(slot, s.running_before_drafts);
      if (!first_draft_step) s.running_before_drafts.clear();
    } else if (first_draft_step) {
      backend_.read_running(slot, s.running_before_drafts);
    }
  }
}

void Speculator::drafted(Sequence& s, const float* row) {
  const int32_t vocab = model_.vocab();
  const auto token = static_cast<int32_t>(std::max_element(row, row + vocab) - row);
  s.tokens.push_back(token);
  ++s.drafted;
  --s.drafting;
  const std::vector<int32_t>& eog = model_.tokenizer().end_of_generation_ids();
  if (std::find(eog.begin(), eog.end(), token) != eog.end()) s.drafting = 0;  // the text would end: verify now
  if (!kv_.ensure_room(s, static_cast<int32_t>(s.tokens.size()))) {  // no room: verify what there is
    s.tokens.pop_back();
    --s.drafted;
    s.drafting = 0;
    kv_.trim_blocks(s);
  }
}

void Speculator::verify(Sequence& s, int32_t seq, float* rows) {
  const Speculation drafter = s.round_drafter;
  const int32_t k = s.drafted, vocab = model_.vocab();
  const std::vector<int32_t> drafts(s.tokens.end() - k, s.tokens.end());
  s.tokens.resize(s.tokens.size() - k);
  s.drafted = 0;
  // Row r's input is the sequence's last token (r = 0) or draft r - 1: it is the sequence's own
  // once every draft before it was kept. Its row then gives the next token.
  int32_t kept = 0;
  for (int32_t r = 0; r <= k; ++r) {
    float* row = rows + static_cast<int64_t>(r) * vocab;
    const OutputProcessor::Draw d = out_.draw_one(s, row);
    kv_.computed(s, 1, r == 0);
    ++kept;
    const bool same = r < k && d.drawn && d.token.id == drafts[r];
    out_.hand_over(s, d, row);
    if (s.state == SeqState::kFinished || !same) break;
  }
  const int32_t accepted = kept - 1;
  metrics_.spec_drafted(drafter).inc(k);
  metrics_.spec_accepted(drafter).inc(accepted);
  metrics_.spec_verify_steps(drafter).inc();
  metrics_.spec_accepted_length(drafter).observe(accepted);
  // The record: each kept draft a hit, a rejected one a miss (a step that kept all has none).
  constexpr double kForget = 0.9;  // a verify step 7 steps ago weighs 1/2
  s.draft_hits = kForget * s.draft_hits + accepted;
  s.draft_misses = kForget * s.draft_misses + (accepted < k ? 1 : 0);
  if (drafter == Speculation::kModel) {
    pair_hits_ = kForget * pair_hits_ + accepted;
    pair_misses_ = kForget * pair_misses_ + (accepted < k ? 1 : 0);
  }
  if (s.state == SeqState::kFinished) return;  // its blocks are gone
  if (kept <= k) backend_.rollback_kv(seq, kept);
  kv_.trim_blocks(s);
}

}  // namespace fathom
