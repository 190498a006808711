#include "engine/scheduler.h"

#include <algorithm>
#include <climits>

#include "engine/attention/groups.h"
#include "engine/backend/backend.h"
#include "engine/engine_metrics.h"
#include "engine/kv_placement.h"
#include "engine/model/model.h"
#include "engine/output_processor.h"
#include "engine/prefill_budget.h"
#include "engine/speculative/speculator.h"

namespace fathom {
namespace {

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

Scheduler::Scheduler(const Model& model, Backend& backend, const SchedulerConfig& config, MetricsRegistry& metrics,
                     DraftModel* draft)
    : model_(model),
      backend_(backend),
      config_(config),
      metrics_(std::make_unique<EngineMetrics>(metrics)),
      kv_(std::make_unique<KvPlacement>(model, backend, config_, *metrics_)),
      out_(std::make_unique<OutputProcessor>(model, backend, *kv_, *metrics_)),
      spec_(std::make_unique<Speculator>(model, backend, *kv_, *out_, *metrics_, config_, draft)),
      step_cost_(attention_equivalent_positions(model.config())) {
  metrics_->export_series_at_zero();
  metrics_->export_break_evens(backend_.measured_break_evens());  // measured at start-up (Backend::prepare_break_even)
  update_gauges();
}

Scheduler::~Scheduler() { cancel_all(); }

void Scheduler::add(std::unique_ptr<RequestState> r) {
  r->draft_attention = spec_->draft_policy(r->request);
  out_->start(*r);
  requests_.push_back(std::move(r));
  update_gauges();
}

int32_t Scheduler::running_sequences() const {
  int32_t n = 0;
  for (const auto& r : requests_)
    for (const auto& s : r->seqs) n += s->state == SeqState::kRunning;
  return n;
}

std::vector<Sequence*> Scheduler::unfinished_sequences() {
  std::vector<Sequence*> seqs;
  for (auto& r : requests_)
    for (auto& s : r->seqs)
      if (s->state != SeqState::kFinished) seqs.push_back(s.get());
  return seqs;
}

Sequence* Scheduler::pick_victim(const Sequence* except, bool fitting) {
  // The last running sequence in (priority, arrival) order; nullptr when that is `except`.
  std::vector<Sequence*> running;
  for (auto& r : requests_)
    for (auto& s : r->seqs)
      if (s->state == SeqState::kRunning && (!fitting || (s.get() != except && kv_->fits_both_tiers(*s))))
        running.push_back(s.get());
  if (running.empty()) return nullptr;
  Sequence* last = *std::max_element(running.begin(), running.end(),
                                     [](Sequence* a, Sequence* b) { return served_before(*a, *b); });
  return last == except ? nullptr : last;
}

void Scheduler::admit(Sequence& seq) {
  RequestState& r = *seq.request;
  // A prompt being scored needs every position's logits, an embedding pooled over every position
  // (mean) or the first (CLS) every position's hidden state: those are computed in full.
  const bool all_positions = r.wants_prompt_logprobs() || (r.embeds() && r.request.embedding != Pooling::kLast);
  kv_->match_prefix(seq, !all_positions);
  if (seq.dropped > seq.n_computed) metrics_->recomputed.inc(seq.dropped - seq.n_computed);  // prefix hits excluded
  seq.dropped = 0;
  if (seq.choice == 0 && !r.first_token_seen) {
    r.usage.cached_prompt_tokens = seq.n_computed;
    r.admitted = Clock::now();
    metrics_->queue.observe(seconds_between(r.arrival, r.admitted));
    metrics_->prompt_tokens.inc(static_cast<double>(seq.tokens.size()));
  }
  seq.state = SeqState::kRunning;
}

void Scheduler::step() {
  reap_cancelled();
  if (requests_.empty()) return;
  BatchPlan plan;
  std::vector<Sequence*> planned;
  std::vector<int32_t> chunk_of;
  plan_step(plan, planned, chunk_of);
  update_gauges();
  if (plan.seqs.empty()) {
    remove_finished();
    return;
  }
  // Output constraints' masks for the positions about to be sampled, computed while the forward
  // runs where it leaves the host idle; joined before anything else happens, exception or not.
  OutputProcessor::MaskPrefetch masks = out_->prefetch_masks(plan, planned);
  // Run, inside the error boundary: a step that throws fails the requests in it, nothing else.
  StepStats stats;
  try {
    const auto t0 = Clock::now();
    kv_->make_resident(plan, planned, chunk_of);
    spec_->prepare(plan, planned, kv_->allocator().block_size());
    stats = backend_.forward(plan, logits_, &hidden_);
    double tokens = 0, positions = 0;
    for (const SeqStep& s : plan.seqs) {
      const double c = static_cast<double>(s.tokens.size());
      tokens += c;
      positions += chunk_attention_positions(s.pos0, c);
    }
    const double seconds = seconds_between(t0, Clock::now());
    step_cost_.observe(tokens, positions, seconds);
    metrics_->step_tokens.observe(tokens);
    metrics_->step_time.observe(seconds);
  } catch (const std::exception& e) {
    const std::string message = std::string("the forward step failed: ") + e.what();
    for (Sequence* s : planned)
      if (s->request->unfinished > 0) out_->fail_request(*s->request, message);
    remove_finished();
    update_gauges();
    return;
  }
  masks.join();
  metrics_->record_step(stats, backend_.measured_break_evens());
  update_step(plan, planned, chunk_of);
  remove_finished();
  update_gauges();
}

void Scheduler::plan_step(BatchPlan& plan, std::vector<Sequence*>& planned, std::vector<int32_t>& chunk_of) {
  std::vector<RequestState*> order;
  for (auto& r : requests_) order.push_back(r.get());
  std::stable_sort(order.begin(), order.end(), [](auto* a, auto* b) { return served_before(*a, *b); });
  std::vector<Sequence*> seqs;
  for (RequestState* r : order)
    for (auto& s : r->seqs)
      if (s->state != SeqState::kFinished) seqs.push_back(s.get());

  // 1. Room for every running sequence's pending tokens, preempting from the back if short.
  const int32_t bs = kv_->allocator().block_size();
  const std::vector<Sequence*> arrived = unfinished_sequences();  // cache-or-recompute's order
  for (Sequence* s : seqs) {
    if (s->state != SeqState::kRunning) continue;
    out_->guarded(*s->request, [&] {
      while (!kv_->ensure_room(*s, static_cast<int32_t>(s->tokens.size()))) {
        Sequence* victim = pick_victim(s);
        // Cache-or-recompute instead, where it recomputes fewer tokens than the preemption would —
        // or always, when the preempted sequence could not come back (it runs alone, or its tokens
        // outgrew both tiers: it would fail).
        const Sequence& loser = victim ? *victim : *s;
        const bool comes_back = (victim != nullptr || running_sequences() > 1) && kv_->fits_both_tiers(loser);
        if (kv_->drop_oldest_block(arrived, false, comes_back ? loser.n_computed : INT64_MAX)) continue;
        // Nothing may be dropped and the last sequence could not come back: preempt the last one
        // that can instead (one submit() admitted past both tiers counts on running to its end).
        if (!comes_back)
          if (Sequence* other = pick_victim(s, /*fitting=*/true)) victim = other;
        Sequence& v = victim ? *victim : *s;
        out_->guarded(*v.request, [&] { kv_->preempt(v); });
        if (!victim) break;
      }
    });
  }

  if (kv_->recompute_model().before_host)
    while (kv_->drop_oldest_block(arrived, true, INT64_MAX)) {
    }
  else
    kv_->restore_dropped(arrived);

  // 3. The step: decode tokens first, then prefill chunks, then admissions.
  kv_->begin_plan();
  int32_t budget = config_.max_batched_tokens;
  // Rows of every-position logits (prompts being scored) this step may return: a bounded
  // buffer (64 MiB of floats), so such a prompt may prefill in smaller chunks.
  int64_t scored_rows_left = std::max<int64_t>(1, (int64_t{16} << 20) / model_.vocab());
  auto add_to_plan = [&](Sequence* s, int32_t chunk) {
    // Positions before the prompt's last one predict prompt tokens: score them.
    const bool scores = s->request->wants_prompt_logprobs() &&
                        s->n_computed + 1 < static_cast<int32_t>(s->request->request.prompt.size());
    if (scores) {
      chunk = static_cast<int32_t>(std::min<int64_t>(chunk, scored_rows_left));
      if (chunk <= 0) return;
      scored_rows_left -= chunk;
    }
    // A sparse draft step computes the sequence's latest draft, past its own position.
    const int32_t pos0 = s->n_computed + (s->drafting > 0 ? s->drafted : 0);
    const bool last = pos0 + chunk == static_cast<int32_t>(s->tokens.size());
    plan.seqs.push_back(SeqStep{std::span<const int32_t>(s->tokens).subspan(pos0, chunk), pos0, &s->blocks,
                                scores ? LogitsWanted::kAll : last ? LogitsWanted::kLast : LogitsWanted::kNone});
    if (s->request->embeds()) {  // no logits: the hidden states its pooling reads
      SeqStep& step = plan.seqs.back();
      const Pooling how = s->request->request.embedding;
      step.logits = LogitsWanted::kNone;
      step.hidden = how == Pooling::kMean                      ? LogitsWanted::kAll
                    : how == Pooling::kCls && s->n_computed == 0 ? LogitsWanted::kFirst
                    : how == Pooling::kLast && last              ? LogitsWanted::kLast
                                                                 : LogitsWanted::kNone;
    }
    // A generated token's step decodes through the request's policy (dense when it speculates: its
    // output is the dense model's; a sparse draft step through the draft policy); prompt tokens
    // prefill densely. A token with drafts (and none still to draft) is a verify step.
    if (chunk == 1 && s->n_computed >= static_cast<int32_t>(s->request->request.prompt.size())) {
      const Request& r = s->request->request;
      plan.seqs.back().policy = s->drafting > 0                       ? &s->request->draft_attention
                                : r.speculative != Speculation::kOff ? &dense_
                                                                     : &r.attention;
      plan.seqs.back().policy_state = &s->policy_state;
    }
    if (s->drafted > 0 && s->drafting == 0) {
      plan.seqs.back().logits = LogitsWanted::kAll;
      plan.seqs.back().verify = true;
    }
    planned.push_back(s);
    chunk_of.push_back(chunk);
    budget -= chunk;
  };
  const int32_t max_seqs = config_.max_num_seqs;
  // A sequence with dropped blocks also computes them again (half a step's budget at most).
  std::vector<int32_t> recomputes;
  // Whether `s` decodes this step, with `planned_n` sequences planned before it and `left` of the budget.
  auto decodes_now = [&](const Sequence* s, size_t planned_n, int32_t left) {
    return s->state == SeqState::kRunning && s->pending() == 1 && static_cast<int32_t>(planned_n) < max_seqs &&
           left > s->dropped_blocks * bs;
  };
  int32_t decodes_left = static_cast<int32_t>(
      std::count_if(seqs.begin(), seqs.end(), [&](const Sequence* s) { return decodes_now(s, planned.size(), budget); }));
  const Speculator::StepCosts costs{step_cost_.fit(), decodes_left, step_cost_.equivalent_positions()};
  // The decoding sequences and their drafts first (the draft model's rounds of the step run
  // together once all are booked), then their steps. `left` is the budget their steps will leave,
  // a booked round counting its most drafts.
  std::vector<Sequence*> decoding;
  int32_t left = budget;
  for (Sequence* s : seqs) {
    if (!decodes_now(s, planned.size() + decoding.size(), left)) continue;
    // A sparse drafting round that lost blocks to cache-or-recompute ends: a plain step follows.
    if ((s->drafting > 0 || s->drafted > 0) && s->dropped_blocks > 0) s->drop_drafts();
    // Drafts take what the budget has beyond one token for every decode still to plan.
    const int32_t drafts = s->drafting == 0 && s->drafted == 0 ? spec_->draft(*s, left - decodes_left, costs) : s->drafted;
    --decodes_left;
    left -= (s->drafting > 0 ? 1 : 1 + drafts) + s->dropped_blocks * bs;
    decoding.push_back(s);
  }
  spec_->run_model_rounds();
  for (Sequence* s : decoding) {
    add_to_plan(s, s->drafting > 0 ? 1 : 1 + s->drafted);  // a sparse draft step, or its token (+ drafts)
    if (s->dropped_blocks > 0) {
      budget -= s->dropped_blocks * bs;
      recomputes.push_back(static_cast<int32_t>(planned.size()) - 1);
    }
  }
  // Prefill chunks — running sequences' rest of a prompt, then the waiting ones admitted now, in
  // order, while their whole prompt fits — share what the decode tokens left of the budget by cost
  // and fairly (engine/prefill_budget.h), so a short prompt behind a long one gets its first token
  // from a short step instead of after the whole long prefill.
  std::vector<Sequence*> prefill;
  const size_t slots = static_cast<size_t>(std::max<int64_t>(0, max_seqs - static_cast<int64_t>(planned.size())));
  for (Sequence* s : seqs)
    if (s->state == SeqState::kRunning && s->pending() > 1 && prefill.size() < slots) prefill.push_back(s);
  for (Sequence* s : seqs) {
    if (s->state != SeqState::kWaiting) continue;
    if (prefill.size() >= slots || budget <= static_cast<int32_t>(prefill.size())) break;
    // Running sequences recompute under pressure: their blocks come back first. (Blocks dropped
    // because recompute beats the host tier are the steady state, not pressure.)
    if (kv_->dropped_tokens() > 0 && !kv_->recompute_model().before_host) break;
    if (!kv_->fits_both_tiers(*s)) {  // submit() refuses these; a safety net, never parked
      out_->finish(*s, FinishReason::kError, {}, "the sequence outgrew the whole KV cache");
      continue;
    }
    bool fits = false;
    if (!out_->guarded(*s->request, [&] {
          admit(*s);
          fits = kv_->ensure_room(*s, static_cast<int32_t>(s->tokens.size())) && kv_->available_blocks() >= 1;
        }))
      continue;
    if (!fits) {
      kv_->release_blocks(*s);  // not enough room now: back to the queue, keep FCFS order
      s->n_computed = 0;
      s->state = SeqState::kWaiting;
      break;
    }
    prefill.push_back(s);
  }
  std::vector<PrefillWant> wants;
  for (Sequence* s : prefill) wants.push_back(PrefillWant{s->n_computed, s->pending(), s->generated() == 0});
  const std::vector<int64_t> shares =
      prefill_shares(wants, std::max(budget, 0), step_cost_.equivalent_positions());
  for (size_t i = 0; i < prefill.size(); ++i)
    if (shares[i] > 0) add_to_plan(prefill[i], static_cast<int32_t>(shares[i]));  // else: a share next step
  if (config_.bifurcated && backend_.implements_groups())
    plan.groups = find_attention_groups(plan, bs, GroupRule{config_.bifurcated_min_seqs, config_.bifurcated_min_prefix});
  for (int32_t owner : recomputes) kv_->plan_recompute(plan, *planned[owner], owner);  // after the groups: they index plan.seqs
}

void Scheduler::update_step(const BatchPlan& plan, const std::vector<Sequence*>& planned,
                            const std::vector<int32_t>& chunk_of) {
  const int32_t vocab = model_.vocab();
  std::vector<int64_t> rows(planned.size(), -1);  // the row each sequence samples from, -1: none
  std::vector<int64_t> hidden_rows(planned.size(), -1);  // an embedding's first row of hidden_, -1: none
  std::vector<int64_t> verify_rows(planned.size(), -1);  // a verify (or draft) step's first row, -1: none
  int64_t row = 0, hidden_row = 0;
  for (size_t i = 0; i < planned.size(); ++i) {
    const SeqStep& step = plan.seqs[i];
    if (step.hidden != LogitsWanted::kNone) {
      hidden_rows[i] = hidden_row;
      hidden_row += wanted_rows(step.hidden, static_cast<int64_t>(step.tokens.size()));
    }
    if (step.verify || planned[i]->drafting > 0) {  // a verify step's rows, or a sparse draft step's row
      verify_rows[i] = row;
      row += static_cast<int64_t>(step.tokens.size());
    } else if (step.logits == LogitsWanted::kAll) {
      const auto n = static_cast<int64_t>(step.tokens.size());
      out_->score_prompt(*planned[i], step.pos0, logits_.data() + row * vocab, n);
      row += n;
      if (step.pos0 + n == static_cast<int64_t>(planned[i]->tokens.size()))
        rows[i] = row - 1;  // the prompt's last position: its row also gives the first token
    } else if (step.logits == LogitsWanted::kLast) {
      rows[i] = row++;
    }
  }
  // 1. Each sequence's next token, drawn in parallel; errors are kept for step 2.
  const std::vector<OutputProcessor::Draw> draws = out_->draw(planned, rows, logits_);
  // 2. In plan order: advance, cache full blocks, hand each drawn token to its sequence.
  for (size_t i = 0; i < planned.size(); ++i) {
    Sequence& s = *planned[i];
    if (s.state == SeqState::kFinished) continue;  // its request failed earlier in this update
    out_->guarded(*s.request, [&] {
      const SeqStep& step = plan.seqs[i];
      if (s.drafting > 0) return spec_->drafted(s, logits_.data() + verify_rows[i] * vocab);
      if (verify_rows[i] >= 0) return spec_->verify(s, static_cast<int32_t>(i), logits_.data() + verify_rows[i] * vocab);
      kv_->computed(s, chunk_of[i], step.tokens.size() == 1);
      if (rows[i] >= 0) out_->hand_over(s, draws[i], logits_.data() + rows[i] * vocab);
      if (!s.request->embeds()) return;
      const auto n = static_cast<int64_t>(step.tokens.size());
      if (hidden_rows[i] >= 0)
        out_->pool(s, step.pos0 + first_wanted_row(step.hidden, n), hidden_.data() + hidden_rows[i] * model_.config().dim,
                   wanted_rows(step.hidden, n));
      if (s.pending() == 0) out_->finish(s, FinishReason::kStop);  // the whole prompt is pooled
    });
  }
}

void Scheduler::remove_finished() {
  for (auto& r : requests_)
    if (r->unfinished == 0)
      for (auto& s : r->seqs) spec_->forget(*s);
  requests_.erase(std::remove_if(requests_.begin(), requests_.end(), [](auto& r) { return r->unfinished == 0; }),
                  requests_.end());
}

void Scheduler::fail_all(const std::string& message) {
  for (auto& r : requests_) out_->fail_request(*r, message);
  remove_finished();
  update_gauges();
}

void Scheduler::reap_cancelled() {
  bool any = false;
  for (auto& r : requests_) {
    if (!r->handle->cancelled()) continue;
    any = true;
    for (size_t i = 0; i < r->seqs.size(); ++i)  // finish() may not add sequences, index is stable
      if (r->seqs[i]->state != SeqState::kFinished && r->unfinished > 0) out_->finish(*r->seqs[i], FinishReason::kCancelled);
  }
  remove_finished();
  if (any) update_gauges();  // an idle engine runs no further step to refresh them
}

void Scheduler::cancel_all() {
  for (auto& r : requests_) r->handle->cancel();
  reap_cancelled();
  update_gauges();
}

int32_t Scheduler::running_requests() const {
  int32_t n = 0;
  for (const auto& r : requests_)
    n += std::any_of(r->seqs.begin(), r->seqs.end(), [](auto& s) { return s->state != SeqState::kWaiting; });
  return n;
}

int32_t Scheduler::waiting_requests() const { return static_cast<int32_t>(requests_.size()) - running_requests(); }

void Scheduler::update_gauges() {
  const BlockAllocator& pool = kv_->allocator();
  metrics_->running.set(running_requests());
  metrics_->waiting.set(waiting_requests());
  metrics_->blocks_device.set(pool.used_slots(KvTier::kDevice));
  metrics_->usage_device.set(static_cast<double>(pool.used_slots(KvTier::kDevice)) / pool.device_blocks());
  metrics_->blocks_host.set(pool.used_slots(KvTier::kHost));
  metrics_->usage_host.set(pool.host_blocks() > 0 ? static_cast<double>(pool.used_slots(KvTier::kHost)) / pool.host_blocks() : 0.0);
  metrics_->dropped_now.set(kv_->dropped_tokens());
}

}  // namespace fathom
