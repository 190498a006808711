// ALISA's cache-or-recompute in KvPlacement (docs/tiered_kv.md, "Cache or recompute"): when
// both KV tiers are full, a running sequence's oldest blocks are dropped instead of preempting a
// sequence, and every step that runs it computes them again — a prefill of its first positions
// whose K/V go to the backend's recompute scratch, one layer at a time (each layer's append
// overwrites the previous layer's), read by the same layer's attention. On the CPU backend the
// output is the one a resident cache gives: its forward is batch invariant, so recomputed K/V are
// the stored ones (a GPU's GEMM over another number of rows may round differently).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "base/error.h"
#include "engine/backend/backend.h"
#include "engine/kv_placement.h"
#include "engine/model/model.h"
#include "engine/engine_metrics.h"

namespace fathom {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

void KvPlacement::measure_recompute_cost(const Model& model) {
  if (scratch_blocks_ == 0) return;
  const int32_t bs = allocator_.block_size();
  // What the scratch and half a step hold, and no more than leaves every decode token a place in
  // the step: all running sequences' recomputes and decode tokens fit one step, so none waits.
  const int32_t room = std::min(config_.max_batched_tokens / 2, config_.max_batched_tokens - config_.max_num_seqs);
  recompute_.capacity_tokens = std::min(scratch_blocks_, std::max(room, 0) / bs) * bs;
  if (recompute_.capacity_tokens == 0) return;
  // Recompute: a forward of up to 64 positions into the scratch (what a step adds per dropped
  // token), best of 2. Transfer: host-to-device block copies (what reading a host block costs a
  // step that stages it), best of 3. Both slots are free before the first request.
  const int32_t n = std::min(recompute_.capacity_tokens, 64);
  std::vector<int32_t> tokens(n), table((n + bs - 1) / bs);
  for (int32_t i = 0; i < n; ++i) tokens[i] = i % model.vocab();
  for (int32_t i = 0; i < static_cast<int32_t>(table.size()); ++i) table[i] = backend_.recompute_slot(i);
  BatchPlan probe;
  probe.seqs.push_back(SeqStep{tokens, 0, &table, LogitsWanted::kNone});
  double recompute = 1e30, transfer = 1e30;
  std::vector<float> logits;  // none are asked for
  try {
    for (int rep = 0; rep < 2; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      backend_.forward(probe, logits);  // its stats are not traffic
      recompute = std::min(recompute, seconds_since(t0) / n);
    }
    const int32_t copies = std::min({8, allocator_.host_blocks(), allocator_.device_blocks()});
    if (copies == 0) transfer = 0;  // nothing to time: unmeasured, never "recompute is cheaper"
    for (int rep = 0; rep < 3 && copies > 0; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int32_t i = 0; i < copies; ++i) backend_.copy_slot(KvTier::kHost, i, KvTier::kDevice, i);
      backend_.finish_moves();
      transfer = std::min(transfer, seconds_since(t0) / (copies * bs));
    }
  } catch (const std::exception&) {  // a failing probe (a failpoint) leaves the model unmeasured
    recompute = transfer = 0;
  }
  metrics_.recompute_cost.set(recompute);
  metrics_.transfer_cost.set(transfer);
  recompute_.recompute_s_per_token = recompute;
  recompute_.transfer_s_per_token = transfer;
  recompute_.before_host = config_.recompute == SchedulerConfig::Recompute::kAlways ||
                           (config_.recompute == SchedulerConfig::Recompute::kAuto && recompute > 0 && recompute < transfer);
}

bool KvPlacement::drop_oldest_block(const std::vector<Sequence*>& seqs, bool host_only, int64_t preempt_cost) {
  if (recompute_.capacity_tokens == 0 || dropped_tokens_ + allocator_.block_size() > recompute_.capacity_tokens) return false;
  const int32_t bs = allocator_.block_size();
  // Steps until room comes back: when the soonest running sequence ends (its max_tokens; a stop
  // ends it sooner). The two smallest, so each candidate can leave itself out.
  auto remaining = [](const Sequence& s) { return int64_t{s.request->request.max_tokens} - s.generated(); };
  int64_t first = INT64_MAX, second = INT64_MAX;
  for (const Sequence* s : seqs)
    if (s->state == SeqState::kRunning) {
      const int64_t left = remaining(*s);
      if (left < first) second = std::exchange(first, left);
      else second = std::min(second, left);
    }
  Sequence* best = nullptr;
  int64_t best_cost = 0;
  for (Sequence* sp : seqs) {
    Sequence& s = *sp;
    // Decoding, not restoring, not about to fork (its prompt blocks are about to be shared).
    if (s.state != SeqState::kRunning || s.pending() != 1 || s.restoring) continue;
    if (s.request->request.n > 1 && !s.request->forked) continue;
    const int32_t d = s.dropped_blocks;
    // Keep the last two full blocks: a step that opens a block reads the running sums of the one before.
    if (d + 2 >= s.n_computed / bs) continue;
    const int32_t b = s.blocks[d];
    // Only a block no other sequence holds frees memory (the prefix cache's reference is
    // evictable); one the cache has not taken yet would lose its chain hash.
    if (allocator_.ref_count(b) != 1 + prefix_.holds(b) || (config_.prefix_caching && d >= s.n_registered)) continue;
    if (host_only && allocator_.tier(b) != KvTier::kHost) continue;
    // Its cost in recomputed tokens: the block's tokens every step until room comes back.
    const int64_t left = remaining(s), others = left == first ? second : first;
    const int64_t cost = int64_t{bs} * std::min(left, others);
    if (cost >= preempt_cost) continue;
    // The cheapest; among equals the last in (priority, arrival) order, as preemption picks.
    if (best == nullptr || cost < best_cost || (cost == best_cost && served_before(*best, s))) {
      best = &s;
      best_cost = cost;
    }
  }
  if (best == nullptr) return false;
  allocator_.release(best->blocks[best->dropped_blocks]);
  best->blocks[best->dropped_blocks++] = kDroppedBlock;
  dropped_tokens_ += bs;
  metrics_.dropped_blocks.inc();
  return true;
}

void KvPlacement::restore_dropped(const std::vector<Sequence*>& seqs) {
  if (dropped_tokens_ == 0) return;
  const auto running = static_cast<int32_t>(
      std::count_if(seqs.begin(), seqs.end(), [](const Sequence* s) { return s->state == SeqState::kRunning; }));
  for (Sequence* sp : seqs) {
    Sequence& s = *sp;
    if (s.state != SeqState::kRunning || s.dropped_blocks == 0 || s.restoring) continue;
    // Room for its prefix and one more block per running sequence (the next step's growth), so a
    // restore is not dropped again at once.
    if (available_blocks() < s.dropped_blocks + running) continue;
    for (int32_t i = 0; i < s.dropped_blocks; ++i) {
      s.blocks[i] = take_block();
      FATHOM_CHECK(s.blocks[i] >= 0);
    }
    s.restoring = true;
  }
}

void KvPlacement::plan_recompute(BatchPlan& plan, const Sequence& s, int32_t owner) {
  // Positions [0, dropped): no logits, dense prefill attention; make_resident points its table
  // at the owner's physical one (scratch blocks, or the new blocks of a restore).
  const int32_t n = s.dropped_blocks * allocator_.block_size();
  plan.seqs.push_back(SeqStep{std::span<const int32_t>(s.tokens).first(n), 0, &s.blocks, LogitsWanted::kNone});
  recompute_owner_.push_back(owner);
}

}  // namespace fathom
