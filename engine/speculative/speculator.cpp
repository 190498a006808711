#include "engine/speculative/speculator.h"

#include <algorithm>

#include "engine/backend/backend.h"
#include "engine/engine_metrics.h"
#include "engine/kv_placement.h"
#include "engine/model/model.h"
#include "engine/output_processor.h"

namespace fathom {

Speculator::Speculator(const Model& model, Backend& backend, KvPlacement& kv, OutputProcessor& out,
                       EngineMetrics& metrics, const SchedulerConfig& config)
    : model_(model), backend_(backend), kv_(kv), out_(out), metrics_(metrics), config_(config) {}

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
  k = std::min(k, worth);
  if (k <= 0) return 0;
  const std::vector<int32_t> drafts = ngram_draft(s.tokens, k);
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

void Speculator::verify(Sequence& s, int32_t seq, float* rows) {
  const Speculation drafter = s.request->request.speculative;
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
  if (s.state == SeqState::kFinished) return;  // its blocks are gone
  if (kept <= k) backend_.rollback_kv(seq, kept);
  kv_.trim_blocks(s);
}

}  // namespace fathom
