#include "engine/scheduler.h"

#include <algorithm>
#include <cstdio>
#include <future>
#include <limits>
#include <numeric>

#include "base/error.h"
#include "engine/attention/groups.h"
#include "engine/backend/backend.h"
#include "engine/model.h"
#include "engine/prefill_budget.h"
#include "engine/scheduler_metrics.h"

namespace fathom {
namespace {

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace


namespace {
// Blocks one step may write (or read the V sum of): its prefill tokens over whole blocks plus two
// per sequence (a partial first block, or the block before one it opens).
int32_t step_write_blocks(const SchedulerConfig& c, int32_t block_size) {
  return (c.max_batched_tokens + block_size - 1) / block_size + 2 * c.max_num_seqs;
}

// The page table over the backend's device blocks and the host tier the config's budget asks for
// (as many blocks as the backend gives; reserving may shrink the device blocks it offers). With a
// host tier, also the recompute scratch: half a step's tokens (`scratch`: the blocks given).
BlockAllocator make_allocator(Backend& backend, const SchedulerConfig& config, int32_t& scratch) {
  const int64_t asked = config.host_kv_bytes / static_cast<int64_t>(backend.block_bytes());
  const int32_t bs = backend.kv_layout().block_size;
  // The blocks to keep: one step's writes, and one sequence's sliding window (what its
  // sliding-window layers read every step, Gemma 3's 512 positions) so those layers stage nothing.
  int32_t window = 0;
  for (const LayerConfig& l : backend.model().config().layers) window = std::max(window, l.sliding ? l.window : 0);
  const int32_t keep = step_write_blocks(config, bs) + (window + bs - 1) / bs;
  const int32_t host =
      asked > 0 ? backend.reserve_host_tier(static_cast<int32_t>(std::min<int64_t>(asked, INT32_MAX / 2)), keep) : 0;
  scratch = host > 0 && config.recompute != SchedulerConfig::Recompute::kOff
                ? backend.reserve_recompute_scratch(config.max_batched_tokens / 2 / bs)
                : 0;
  return BlockAllocator(backend.kv_blocks(), bs, host);
}
}  // namespace

Scheduler::Scheduler(const Model& model, Backend& backend, const SchedulerConfig& config, MetricsRegistry& metrics)
    : model_(model),
      backend_(backend),
      config_(config),
      allocator_(make_allocator(backend, config, scratch_blocks_)),
      metrics_(std::make_unique<Metrics>(metrics)),
      prefix_(allocator_),
      step_cost_(attention_equivalent_positions(model.config())) {
  // With a host tier every block a step writes must be in the device tier at once: a step's
  // prefill tokens over whole blocks plus two more blocks per sequence in it (a partial first
  // block, or the block before one the step opens, whose running V sum and K moments carry over). A device tier too
  // small for the configured step gets smaller steps (the server logs the limits it runs with).
  if (allocator_.host_blocks() > 0) {
    const int32_t bs = allocator_.block_size(), device = allocator_.device_blocks();
    if (device < 3) throw Error("the device KV tier holds " + std::to_string(device) + " blocks: raise kv_cache.device_mib");
    auto writes = [&] { return step_write_blocks(config_, bs); };
    if (writes() > device) config_.max_num_seqs = std::max(1, std::min(config_.max_num_seqs, device / 6));
    if (writes() > device) config_.max_batched_tokens = (device - 2 * config_.max_num_seqs) * bs;
  }
  measure_recompute_cost();
  for (FinishReason r : {FinishReason::kStop, FinishReason::kLength, FinishReason::kCancelled, FinishReason::kError})
    metrics_->finished(r);  // export every reason from the start, at 0
  for (int k = 0; k < kPolicyKinds; ++k) {
    metrics_->kv_read(static_cast<PolicyKind>(k));
    metrics_->attention_steps(static_cast<PolicyKind>(k), PolicyKind::kDense);  // the family, at 0
  }
  for (PolicyKind k : {PolicyKind::kHip, PolicyKind::kSwa}) {
    metrics_->hot_rows(k, "hit");
    metrics_->hot_rows(k, "miss");
  }
  export_break_evens();  // those measured at start-up (Backend::prepare_break_even)
  update_gauges();
}

Scheduler::~Scheduler() {
  cancel_all();
  prefix_.clear();
}

void Scheduler::add(std::unique_ptr<RequestState> r) {
  auto seq = std::make_unique<Sequence>();
  seq->request = r.get();
  seq->choice = 0;
  seq->tokens = r->request.prompt;
  const SamplingParams& p = r->request.sampling;
  seq->sampler = std::make_unique<Sampler>(p, seed_rng_());
  seq->text = std::make_unique<TextStream>(model_.tokenizer(), r->request.stop.strings);
  if (r->constraint) seq->matcher = std::make_unique<ConstraintMatcher>(r->constraint);
  if (r->request.prompt_logprobs >= 0)  // the first prompt token has nothing before it to score it
    r->prompt_logprobs.push_back(SampledToken{r->request.prompt[0], std::numeric_limits<float>::quiet_NaN(), {}});
  r->unfinished = r->request.n;
  r->usage.prompt_tokens = static_cast<int32_t>(r->request.prompt.size());
  r->seqs.push_back(std::move(seq));
  requests_.push_back(std::move(r));
  update_gauges();
}

int32_t Scheduler::available_blocks() const {
  return allocator_.free_blocks() + (config_.prefix_caching ? prefix_.evictable() : 0);
}

int32_t Scheduler::take_block() {
  const int32_t b = allocator_.allocate();
  return b >= 0 || prefix_.evict(1) == 0 ? b : allocator_.allocate();
}

bool Scheduler::allocate_block(Sequence& seq) {
  const int32_t b = take_block();
  if (b < 0) return false;
  seq.blocks.push_back(b);
  return true;
}

bool Scheduler::ensure_room(Sequence& seq, int32_t tokens) {
  const int32_t bs = allocator_.block_size();
  while (static_cast<int32_t>(seq.blocks.size()) * bs < tokens)
    if (!allocate_block(seq)) return false;
  return true;
}

void Scheduler::release_blocks(Sequence& seq) {
  for (int32_t b : seq.blocks)
    if (b != kDroppedBlock) allocator_.release(b);
  seq.blocks.clear();
  dropped_tokens_ -= seq.dropped_blocks * allocator_.block_size();
  seq.dropped_blocks = 0;
  seq.restoring = false;
}

void Scheduler::register_full_blocks(Sequence& seq) {
  if (!config_.prefix_caching) return;
  const int32_t bs = allocator_.block_size();
  const int32_t full = seq.n_computed / bs;
  for (int32_t i = seq.n_registered; i < full; ++i)
    seq.last_hash = prefix_.insert(seq.last_hash, std::span<const int32_t>(seq.tokens).subspan(i * bs, bs), seq.blocks[i]);
  seq.n_registered = std::max(seq.n_registered, full);
}

int32_t Scheduler::running_sequences() const {
  int32_t n = 0;
  for (const auto& r : requests_)
    for (const auto& s : r->seqs) n += s->state == SeqState::kRunning;
  return n;
}

bool Scheduler::fits_both_tiers(const Sequence& s) const {
  const int64_t bs = allocator_.block_size();
  return (static_cast<int64_t>(s.tokens.size()) + bs) / bs <= allocator_.num_blocks();  // its tokens + the next
}

Sequence* Scheduler::pick_victim(const Sequence* except, bool fitting) {
  // The last running sequence in (priority, arrival) order; nullptr when that is `except`.
  std::vector<Sequence*> running;
  for (auto& r : requests_)
    for (auto& s : r->seqs)
      if (s->state == SeqState::kRunning && (!fitting || (s.get() != except && fits_both_tiers(*s))))
        running.push_back(s.get());
  if (running.empty()) return nullptr;
  Sequence* last = *std::max_element(running.begin(), running.end(),
                                     [](Sequence* a, Sequence* b) { return served_before(*a, *b); });
  return last == except ? nullptr : last;
}

void Scheduler::preempt(Sequence& seq) {
  // Recompute: the blocks go back (their full ones stay in the prefix cache when it has them), the
  // sequence is queued for prefill again. With a host tier this happens only when both tiers are
  // full; a sequence whose blocks do not fit the device tier keeps running from both tiers.
  release_blocks(seq);
  seq.dropped = seq.n_computed;
  seq.n_computed = 0;
  seq.n_registered = 0;
  seq.last_hash = 0;
  seq.policy_state = {};
  seq.state = SeqState::kWaiting;
  metrics_->preempt_recompute.inc();
}

int32_t Scheduler::next_device_victim() {
  // The device block written longest ago that this step does not write: a sequence's blocks are
  // written in position order, so its oldest positions leave first and its recent ones — what a
  // sliding window and HiP's local window read every step — stay.
  int32_t best = -1;
  for (int32_t slot = 0; slot < allocator_.device_blocks(); ++slot) {
    const int32_t b = allocator_.block_at_device_slot(slot);
    if (b >= 0 && written_step_[b] != steps_ && (best < 0 || written_step_[b] < written_step_[best])) best = b;
  }
  return best;
}

void Scheduler::make_resident(BatchPlan& plan, const std::vector<Sequence*>& planned, const std::vector<int32_t>& chunk_of) {
  if (allocator_.host_blocks() == 0) return;  // one tier: block ids are device slots
  const int32_t bs = allocator_.block_size();
  struct Write {
    int32_t block;
    bool holds_data;  // some position before the step's first is already in it
  };
  std::vector<Write> writes;
  written_step_.resize(allocator_.num_blocks(), 0);
  ++steps_;
  for (size_t i = 0; i < planned.size(); ++i) {
    const Sequence& s = *planned[i];
    // A step that opens a block also reads the block before it (the running V sum and K moments carry over).
    const int32_t first = s.n_computed % bs == 0 && s.n_computed > 0 ? s.n_computed / bs - 1 : s.n_computed / bs;
    for (int32_t b = first; b <= (s.n_computed + chunk_of[i] - 1) / bs; ++b) {
      writes.push_back({s.blocks[b], b * bs < s.n_computed});
      written_step_[s.blocks[b]] = steps_;
    }
    if (s.restoring)  // its recompute writes the new blocks of its dropped prefix
      for (int32_t b = 0; b < s.dropped_blocks; ++b) {
        writes.push_back({s.blocks[b], false});
        written_step_[s.blocks[b]] = steps_;
      }
  }
  for (const Write& w : writes) {
    if (allocator_.tier(w.block) == KvTier::kDevice) continue;
    const int32_t host_slot = allocator_.slot(w.block);
    if (allocator_.move_to_device(w.block)) {
      if (w.holds_data) {
        try {
          backend_.copy_slot(KvTier::kHost, host_slot, KvTier::kDevice, allocator_.slot(w.block));
        } catch (...) {
          FATHOM_CHECK(allocator_.move_to_host(w.block));  // not moved: back where its bytes are
          throw;
        }
      }
      continue;
    }
    const int32_t victim = next_device_victim();
    FATHOM_CHECK(victim >= 0, "a step writes more blocks than the device tier holds");
    if (w.holds_data)
      backend_.exchange_slots(allocator_.slot(victim), host_slot);
    else
      backend_.copy_slot(KvTier::kDevice, allocator_.slot(victim), KvTier::kHost, host_slot);
    allocator_.exchange(victim, w.block);
    metrics_->demoted.inc();
  }
  // The kernels read physical slots (negative: host tier, staged by the backend); a dropped block
  // is a scratch block, which its sequence's recompute (a plan entry past `planned`) writes.
  physical_.resize(planned.size());
  int32_t scratch = 0;
  for (size_t i = 0; i < planned.size(); ++i) {
    physical_[i].clear();
    for (int32_t b : planned[i]->blocks)
      physical_[i].push_back(b == kDroppedBlock ? backend_.recompute_slot(scratch++) : allocator_.physical(b));
    plan.seqs[i].blocks = &physical_[i];
  }
  FATHOM_CHECK(scratch <= scratch_blocks_, "a step recomputes more blocks than the scratch holds");
  for (size_t j = 0; j < recompute_owner_.size(); ++j) plan.seqs[planned.size() + j].blocks = &physical_[recompute_owner_[j]];
}

void Scheduler::admit(Sequence& seq) {
  RequestState& r = *seq.request;
  const int32_t bs = allocator_.block_size();
  const int32_t n_tokens = static_cast<int32_t>(seq.tokens.size());
  // At least one token is always computed: its logits give the next token.
  // A prompt being scored needs every position's logits: it is computed in full.
  if (config_.prefix_caching && !r.wants_prompt_logprobs()) {
    seq.blocks = prefix_.match(seq.tokens, (n_tokens - 1) / bs);
    metrics_->prefix_queries.inc(n_tokens);
    metrics_->prefix_hits.inc(static_cast<double>(seq.blocks.size()) * bs);
  }
  seq.n_computed = static_cast<int32_t>(seq.blocks.size()) * bs;
  if (seq.dropped > seq.n_computed) metrics_->recomputed.inc(seq.dropped - seq.n_computed);  // prefix hits excluded
  seq.dropped = 0;
  if (seq.choice == 0 && !r.first_token_seen) {
    r.usage.cached_prompt_tokens = seq.n_computed;
    r.admitted = Clock::now();
    metrics_->queue.observe(seconds_between(r.arrival, r.admitted));
    metrics_->prompt_tokens.inc(n_tokens);
  }
  seq.state = SeqState::kRunning;
}

template <typename F>
bool Scheduler::guarded(RequestState& r, F&& f) {
  try {
    f();
    return true;
  } catch (const std::exception& e) {
    fail_request(r, e.what());
    return false;
  }
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
  // Output constraints' masks for the positions about to be sampled depend only on the tokens
  // accepted so far: compute them on another thread while the forward pass runs — when the
  // forward leaves the host idle (a device backend). The CPU backend's forward keeps every core
  // busy, so there a mask is computed where it is applied (a second thread measured +6% per step
  // at batch 16, bench/results/structured_overhead.md). A failure here leaves a mask
  // unprepared; update_step computes it again inside the request's guard.
  std::vector<ConstraintMatcher*> to_mask;
  for (size_t i = 0; i < planned.size(); ++i)
    if (planned[i]->matcher && plan.seqs[i].logits == LogitsWanted::kLast) to_mask.push_back(planned[i]->matcher.get());
  std::future<void> masks;
  if (!to_mask.empty() && !backend_.forward_occupies_host())
    masks = std::async(std::launch::async, [&to_mask, vocab = model_.vocab()] {
      for (ConstraintMatcher* m : to_mask) {
        try {
          m->prepare_mask(vocab);
        } catch (...) {
        }
      }
    });
  struct JoinMasks {  // the masks are joined before anything else happens, exception or not
    std::future<void>& f;
    ~JoinMasks() {
      if (f.valid()) f.wait();
    }
  } join_masks{masks};
  // Run, inside the error boundary: a step that throws fails the requests in it, nothing else.
  try {
    const auto t0 = Clock::now();
    make_resident(plan, planned, chunk_of);
    backend_.forward(plan, logits_);
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
      if (s->request->unfinished > 0) fail_request(*s->request, message);
    remove_finished();
    update_gauges();
    return;
  }
  if (masks.valid()) masks.wait();
  const TierBytes moved = backend_.take_tier_bytes();
  metrics_->swap_in.inc(static_cast<double>(moved.host_to_device));
  metrics_->swap_out.inc(static_cast<double>(moved.device_to_host));
  const HotRowCounts hot = backend_.take_hot_row_counts();
  for (int k = 0; k < kPolicyKinds; ++k) {
    if (hot.hits[k] > 0) metrics_->hot_rows(static_cast<PolicyKind>(k), "hit").inc(static_cast<double>(hot.hits[k]));
    if (hot.misses[k] > 0) metrics_->hot_rows(static_cast<PolicyKind>(k), "miss").inc(static_cast<double>(hot.misses[k]));
    if (hot.fallbacks[k] > 0) metrics_->hot_fallback.inc(static_cast<double>(hot.fallbacks[k]));
  }
  const KvReadBytes kv_read = backend_.take_kv_read_bytes();
  for (int k = 0; k < kPolicyKinds; ++k)
    if (kv_read[k] > 0) metrics_->kv_read(static_cast<PolicyKind>(k)).inc(static_cast<double>(kv_read[k]));
  export_break_evens();
  const AttentionSteps steps = backend_.take_attention_steps();
  for (int k = 0; k < kPolicyKinds; ++k)
    for (int ran = 0; ran < kPolicyKinds; ++ran)
      if (steps[k][ran] > 0)
        metrics_->attention_steps(static_cast<PolicyKind>(k), static_cast<PolicyKind>(ran))
            .inc(static_cast<double>(steps[k][ran]));
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
  const int32_t bs = allocator_.block_size();
  for (Sequence* s : seqs) {
    if (s->state != SeqState::kRunning) continue;
    guarded(*s->request, [&] {
      while (!ensure_room(*s, static_cast<int32_t>(s->tokens.size()))) {
        Sequence* victim = pick_victim(s);
        // Cache-or-recompute instead, where it recomputes fewer tokens than the preemption would —
        // or always, when the preempted sequence could not come back (it runs alone, or its tokens
        // outgrew both tiers: it would fail).
        const Sequence& loser = victim ? *victim : *s;
        const bool comes_back = (victim != nullptr || running_sequences() > 1) && fits_both_tiers(loser);
        if (drop_oldest_block(false, comes_back ? loser.n_computed : INT64_MAX)) continue;
        // Nothing may be dropped and the last sequence could not come back: preempt the last one
        // that can instead (one submit() admitted past both tiers counts on running to its end).
        if (!comes_back)
          if (Sequence* other = pick_victim(s, /*fitting=*/true)) victim = other;
        Sequence& v = victim ? *victim : *s;
        guarded(*v.request, [&] { preempt(v); });
        if (!victim) break;
      }
    });
  }

  if (recompute_.before_host)
    while (drop_oldest_block(true, INT64_MAX)) {
    }
  else
    restore_dropped();

  // 3. The step: decode tokens first, then prefill chunks, then admissions.
  recompute_owner_.clear();
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
    const bool last = s->n_computed + chunk == static_cast<int32_t>(s->tokens.size());
    plan.seqs.push_back(SeqStep{std::span<const int32_t>(s->tokens).subspan(s->n_computed, chunk), s->n_computed,
                                &s->blocks, scores ? LogitsWanted::kAll : last ? LogitsWanted::kLast : LogitsWanted::kNone});
    // A generated token's step decodes through the request's policy; prompt tokens prefill densely.
    if (chunk == 1 && s->n_computed >= static_cast<int32_t>(s->request->request.prompt.size())) {
      plan.seqs.back().policy = &s->request->request.attention;
      plan.seqs.back().policy_state = &s->policy_state;
    }
    planned.push_back(s);
    chunk_of.push_back(chunk);
    budget -= chunk;
  };
  const int32_t max_seqs = config_.max_num_seqs;
  // A sequence with dropped blocks also computes them again (half a step's budget at most).
  std::vector<int32_t> recomputes;
  for (Sequence* s : seqs)
    if (s->state == SeqState::kRunning && s->pending() == 1 && static_cast<int32_t>(planned.size()) < max_seqs &&
        budget > s->dropped_blocks * bs) {
      add_to_plan(s, 1);
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
    if (dropped_tokens_ > 0 && !recompute_.before_host) break;
    if (!fits_both_tiers(*s)) {  // submit() refuses these; a safety net, never parked
      finish(*s, FinishReason::kError, {}, "the sequence outgrew the whole KV cache");
      continue;
    }
    bool fits = false;
    if (!guarded(*s->request, [&] {
          admit(*s);
          fits = ensure_room(*s, static_cast<int32_t>(s->tokens.size())) && available_blocks() >= 1;
        }))
      continue;
    if (!fits) {
      release_blocks(*s);  // not enough room now: back to the queue, keep FCFS order
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
  for (int32_t owner : recomputes) plan_recompute(plan, *planned[owner], owner);  // after the groups: they index plan.seqs
}

void Scheduler::update_step(const BatchPlan& plan, const std::vector<Sequence*>& planned,
                            const std::vector<int32_t>& chunk_of) {
  const int32_t vocab = model_.vocab();
  std::vector<int64_t> rows(planned.size(), -1);  // the row each sequence samples from, -1: none
  int64_t row = 0;
  for (size_t i = 0; i < planned.size(); ++i) {
    const SeqStep& step = plan.seqs[i];
    if (step.logits == LogitsWanted::kAll) {
      score_prompt(*planned[i], step.pos0, row, static_cast<int64_t>(step.tokens.size()));
      row += static_cast<int64_t>(step.tokens.size());
      if (step.pos0 + static_cast<int64_t>(step.tokens.size()) == static_cast<int64_t>(planned[i]->tokens.size()))
        rows[i] = row - 1;  // the prompt's last position: its row also gives the first token
    } else if (step.logits == LogitsWanted::kLast) {
      rows[i] = row++;
    }
  }
  auto forks_now = [](const Sequence& s) {  // its first sample also samples the other choices
    const RequestState& r = *s.request;
    return s.choice == 0 && !r.forked && r.request.n > 1 && s.generated() == 0;
  };
  // 1. Draw each sequence's next token in parallel (its own sampler, matcher and logits row):
  // mask the tokens its output constraint cannot take, sample, advance the constraint. Sampling
  // a 49k-entry row costs ~40 µs, the constraint's accept 10-40 µs: at batch 16 a serial loop
  // is ~1 ms of every step. Errors are kept for step 2, which fails their request.
  struct Draw {
    bool drawn = false;
    SampledToken token;
    std::optional<bool> constraint_done;
    std::string error;
  };
  std::vector<Draw> draws(planned.size());
  backend_.host_parallel_for(static_cast<int64_t>(planned.size()), [&](int64_t i) {
    Sequence& s = *planned[i];
    if (rows[i] < 0 || s.state == SeqState::kFinished || forks_now(s)) return;
    Draw& d = draws[i];
    try {
      float* logits = logits_.data() + rows[i] * vocab;
      if (s.matcher) s.matcher->mask_logits(logits, vocab);
      const std::vector<int32_t>& prompt = s.request->request.prompt;
      const std::vector<int32_t> generated(s.tokens.begin() + static_cast<std::ptrdiff_t>(prompt.size()), s.tokens.end());
      d.token = s.sampler->sample(logits, vocab, prompt, generated);
      if (s.matcher) d.constraint_done = s.matcher->accept(d.token.id) && s.matcher->complete();
      d.drawn = true;
    } catch (const std::exception& e) {
      d.error = e.what();
    }
  });
  // 2. In plan order: advance, cache full blocks, hand each drawn token to its sequence.
  for (size_t i = 0; i < planned.size(); ++i) {
    Sequence& s = *planned[i];
    RequestState& r = *s.request;
    if (s.state == SeqState::kFinished) continue;  // its request failed earlier in this update
    guarded(r, [&] {
      s.n_computed += chunk_of[i];
      if (s.dropped_blocks > 0 && plan.seqs[i].tokens.size() == 1) {  // its recompute ran in this step
        metrics_->dropped_recomputed.inc(s.dropped_blocks * allocator_.block_size());
        if (s.restoring) {  // the new blocks hold the prefix again
          metrics_->restored_blocks.inc(s.dropped_blocks);
          dropped_tokens_ -= s.dropped_blocks * allocator_.block_size();
          s.dropped_blocks = 0;
          s.restoring = false;
        }
      }
      register_full_blocks(s);
      if (rows[i] < 0) return;
      const Draw& d = draws[i];
      if (!d.error.empty()) throw Error(d.error);
      if (d.drawn) return accept_token(s, d.token, d.constraint_done);
      // The first sample of n > 1 choices: they fork from the masked row (a fork's choices
      // start from the same constraint state).
      float* logits = logits_.data() + rows[i] * vocab;
      if (s.matcher) s.matcher->mask_logits(logits, vocab);
      fork_choices(r, logits);
      accept_token(s, s.sampler->sample(logits, vocab, r.request.prompt, {}));
    });
  }
}

void Scheduler::score_prompt(Sequence& seq, int64_t pos0, int64_t first_row, int64_t rows) {
  // Row j holds the logits at position pos0 + j, which predict prompt token pos0 + j + 1.
  RequestState& r = *seq.request;
  const std::vector<int32_t>& prompt = r.request.prompt;
  const int64_t begin = static_cast<int64_t>(r.prompt_logprobs.size()) - 1;  // the next position to score
  const int64_t end = std::min<int64_t>(pos0 + rows, static_cast<int64_t>(prompt.size()) - 1);
  if (begin < pos0 || begin >= end) return;  // not in these rows (or scored already)
  const int32_t vocab = model_.vocab();
  std::vector<SampledToken> scored(static_cast<size_t>(end - begin));
  guarded(r, [&] {
    backend_.host_parallel_for(end - begin, [&](int64_t k) {
      thread_local std::vector<float> scratch;
      const int64_t p = begin + k;
      scored[k] = score_token(logits_.data() + (first_row + p - pos0) * vocab, vocab, prompt[p + 1],
                              r.request.prompt_logprobs, scratch);
    });
    r.prompt_logprobs.insert(r.prompt_logprobs.end(), scored.begin(), scored.end());
  });
}

void Scheduler::attach_prompt_logprobs(Sequence& seq, StreamEvent& ev) {
  const RequestState& r = *seq.request;
  if (r.request.prompt_logprobs < 0 || seq.prompt_logprobs_sent || r.wants_prompt_logprobs()) return;
  ev.prompt_logprobs = r.prompt_logprobs;
  seq.prompt_logprobs_sent = true;
}

void Scheduler::remove_finished() {
  requests_.erase(std::remove_if(requests_.begin(), requests_.end(), [](auto& r) { return r->unfinished == 0; }),
                  requests_.end());
}

void Scheduler::fork_choices(RequestState& r, const float* logits) {
  Sequence& parent = *r.seqs[0];
  const int32_t bs = allocator_.block_size();
  const SamplingParams& p = r.request.sampling;
  r.forked = true;
  for (int32_t c = 1; c < r.request.n; ++c) {
    auto child = std::make_unique<Sequence>();
    child->request = &r;
    child->choice = c;
    child->tokens = parent.tokens;
    child->policy_state = parent.policy_state;
    SamplingParams cp = p;
    if (p.seed) cp.seed = *p.seed + static_cast<uint64_t>(c);  // choices differ, yet reproducibly
    child->sampler = std::make_unique<Sampler>(cp, seed_rng_());
    child->text = std::make_unique<TextStream>(model_.tokenizer(), r.request.stop.strings);
    if (r.constraint) child->matcher = std::make_unique<ConstraintMatcher>(r.constraint);
    // Share the full prompt blocks; copy the partial last block (copy-on-write at fork time).
    const int32_t full = parent.n_computed / bs;
    for (int32_t i = 0; i < full; ++i) {
      allocator_.retain(parent.blocks[i]);
      child->blocks.push_back(parent.blocks[i]);
    }
    child->n_computed = parent.n_computed;
    child->n_registered = parent.n_registered;  // == full: the parent registered its full blocks
    child->last_hash = parent.last_hash;
    if (parent.n_computed % bs != 0) {
      if (allocate_block(*child)) {
        const int32_t src = parent.blocks[full], dst = child->blocks.back();
        backend_.copy_slot(allocator_.tier(src), allocator_.slot(src), allocator_.tier(dst), allocator_.slot(dst));
      } else {  // no room to copy: this choice recomputes its prompt later (prefix cache helps)
        release_blocks(*child);
        child->n_computed = 0;
        child->n_registered = 0;
        child->last_hash = 0;
      }
    }
    child->state = child->n_computed > 0 ? SeqState::kRunning : SeqState::kWaiting;
    Sequence& ref = *child;
    r.seqs.push_back(std::move(child));
    if (ref.state == SeqState::kRunning)
      accept_token(ref, ref.sampler->sample(logits, model_.vocab(), r.request.prompt, {}));
  }
}

void Scheduler::accept_token(Sequence& seq, const SampledToken& tok, std::optional<bool> constraint_done) {
  RequestState& r = *seq.request;
  const auto now = Clock::now();
  if (!r.first_token_seen) {
    r.first_token_seen = true;
    r.first_token = now;
    metrics_->ttft.observe(seconds_between(r.arrival, now));
    metrics_->prefill_time.observe(seconds_between(r.admitted, now));
  } else if (seq.generated() > 0) {
    metrics_->itl.observe(seconds_between(seq.last_token_time, now));
  }
  seq.last_token_time = now;
  const StopConditions& stop = r.request.stop;
  // A constrained output that its grammar has completed ends here, ignore_eos or not (the mask
  // allowed only a stop token).
  if (!constraint_done) constraint_done = seq.matcher && seq.matcher->accept(tok.id) && seq.matcher->complete();
  const bool stop_token = *constraint_done || (!stop.ignore_eos && model_.tokenizer().is_end_of_generation(tok.id)) ||
                          std::find(stop.token_ids.begin(), stop.token_ids.end(), tok.id) != stop.token_ids.end();
  if (stop_token) {
    finish(seq, FinishReason::kStop, seq.text->finish());  // held-back text was not a stop string
    return;
  }
  seq.tokens.push_back(tok.id);
  ++r.usage.completion_tokens;
  metrics_->generation_tokens.inc();
  StreamEvent ev;
  ev.choice = seq.choice;
  ev.token_ids.push_back(tok.id);
  TextStream::Piece piece = seq.text->push(tok.id);
  ev.text = std::move(piece.text);
  if (r.request.sampling.logprobs >= 0) ev.logprobs.push_back(tok);
  attach_prompt_logprobs(seq, ev);
  if (piece.stopped) {
    ev.finish = FinishReason::kStop;
  } else if (seq.generated() >= r.request.max_tokens ||
             static_cast<int32_t>(seq.tokens.size()) >= model_.config().context_length) {
    ev.text += seq.text->finish();
    ev.finish = FinishReason::kLength;
  }
  if (ev.finish == FinishReason::kNone) {
    r.handle->push(std::move(ev));
    return;
  }
  const FinishReason reason = ev.finish;
  ev.finish = FinishReason::kNone;  // finish() sends the final event with the reason
  r.handle->push(std::move(ev));
  finish(seq, reason);
}

void Scheduler::finish(Sequence& seq, FinishReason reason, std::string tail, const std::string& error) {
  RequestState& r = *seq.request;
  if (seq.state == SeqState::kFinished) return;
  if (reason != FinishReason::kError) register_full_blocks(seq);  // a failed step's blocks are not trusted
  release_blocks(seq);
  seq.state = SeqState::kFinished;
  std::vector<StreamEvent> events(1);
  events[0].choice = seq.choice;
  events[0].text = std::move(tail);
  events[0].finish = reason;
  events[0].error = error;
  attach_prompt_logprobs(seq, events[0]);
  --r.unfinished;
  if (!r.forked && seq.choice == 0) {
    // n > 1 and the request ended before its first sample: the other choices never started.
    for (int32_t c = 1; c < r.request.n; ++c) {
      StreamEvent other;
      other.choice = c;
      other.finish = reason;
      other.error = error;
      events.push_back(std::move(other));
    }
    r.unfinished = 0;
  }
  if (r.unfinished == 0) {  // usage is final before the stream's last event
    r.handle->set_usage(r.usage);
    metrics_->finished(reason).inc();
    const auto now = Clock::now();
    metrics_->e2e.observe(seconds_between(r.arrival, now));
    if (r.first_token_seen) metrics_->decode_time.observe(seconds_between(r.first_token, now));
  }
  for (StreamEvent& ev : events) r.handle->push(std::move(ev));
}

void Scheduler::fail_request(RequestState& r, const std::string& message) {
  for (size_t i = 0; i < r.seqs.size(); ++i)  // finish() adds no sequences: the index is stable
    if (r.seqs[i]->state != SeqState::kFinished && r.unfinished > 0)
      finish(*r.seqs[i], FinishReason::kError, {}, message);
}

void Scheduler::fail_all(const std::string& message) {
  for (auto& r : requests_) fail_request(*r, message);
  remove_finished();
  update_gauges();
}

void Scheduler::reap_cancelled() {
  bool any = false;
  for (auto& r : requests_) {
    if (!r->handle->cancelled()) continue;
    any = true;
    for (size_t i = 0; i < r->seqs.size(); ++i)  // finish() may not add sequences, index is stable
      if (r->seqs[i]->state != SeqState::kFinished && r->unfinished > 0) finish(*r->seqs[i], FinishReason::kCancelled);
  }
  requests_.erase(std::remove_if(requests_.begin(), requests_.end(), [](auto& r) { return r->unfinished == 0; }),
                  requests_.end());
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

void Scheduler::export_break_evens() {
  const std::vector<MeasuredBreakEven>& measured = backend_.measured_break_evens();
  for (; break_evens_exported_ < measured.size(); ++break_evens_exported_) {  // measured once each, on first use
    const MeasuredBreakEven& m = measured[break_evens_exported_];
    // One series per (policy, ratio): HiP's non-default variants (per query head, a shorter
    // refresh) are measured and used but not exported, so they cannot overwrite the default's.
    const AttentionPolicy defaults;
    if (m.probe.hip_per_kv_head != defaults.hip_per_kv_head || m.probe.hip_refresh != defaults.hip_refresh) continue;
    char ratio[32];
    std::snprintf(ratio, sizeof ratio, "%g", m.probe.kv_read_ratio);
    metrics_->registry
        .gauge("fathom_attention_break_even_keys",
               "Decode length (keys) from which a sparse policy is measured faster than dense; shorter steps run "
               "densely (+Inf: never faster)",
               {{"policy", policy_name(m.probe.kind)}, {"kv_read_ratio", ratio}})
        .set(m.min_keys == INT32_MAX ? std::numeric_limits<double>::infinity() : m.min_keys);
  }
}

void Scheduler::update_gauges() {
  const BlockAllocator& pool = allocator_;
  metrics_->running.set(running_requests());
  metrics_->waiting.set(waiting_requests());
  metrics_->blocks_device.set(pool.used_slots(KvTier::kDevice));
  metrics_->usage_device.set(static_cast<double>(pool.used_slots(KvTier::kDevice)) / pool.device_blocks());
  metrics_->blocks_host.set(pool.used_slots(KvTier::kHost));
  metrics_->usage_host.set(pool.host_blocks() > 0 ? static_cast<double>(pool.used_slots(KvTier::kHost)) / pool.host_blocks() : 0.0);
  metrics_->dropped_now.set(dropped_tokens_);
}

}  // namespace fathom
