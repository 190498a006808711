#include "engine/kv_placement.h"

#include <algorithm>
#include <climits>

#include "base/error.h"
#include "engine/backend/backend.h"
#include "engine/model/model.h"
#include "engine/engine_metrics.h"

namespace fathom {
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

KvPlacement::KvPlacement(const Model& model, Backend& backend, SchedulerConfig& config, EngineMetrics& metrics)
    : backend_(backend),
      config_(config),
      metrics_(metrics),
      allocator_(make_allocator(backend, config, scratch_blocks_)),
      prefix_(allocator_) {
  // With a host tier every block a step writes must be in the device tier at once: a step's
  // prefill tokens over whole blocks plus two more blocks per sequence in it (a partial first
  // block, or the block before one the step opens, whose running V sum and K moments carry over).
  // A device tier too small for the configured step gets smaller steps.
  if (allocator_.host_blocks() > 0) {
    const int32_t bs = allocator_.block_size(), device = allocator_.device_blocks();
    if (device < 3) throw Error("the device KV tier holds " + std::to_string(device) + " blocks: raise kv_cache.device_mib");
    auto writes = [&] { return step_write_blocks(config, bs); };
    if (writes() > device) config.max_num_seqs = std::max(1, std::min(config.max_num_seqs, device / 6));
    if (writes() > device) config.max_batched_tokens = (device - 2 * config.max_num_seqs) * bs;
  }
  measure_recompute_cost(model);
}

KvPlacement::~KvPlacement() { prefix_.clear(); }

int32_t KvPlacement::available_blocks() const {
  return allocator_.free_blocks() + (config_.prefix_caching ? prefix_.evictable() : 0);
}

bool KvPlacement::fits_both_tiers(const Sequence& s) const {
  const int64_t bs = allocator_.block_size();
  return (static_cast<int64_t>(s.tokens.size()) + bs) / bs <= allocator_.num_blocks();  // its tokens + the next
}

int32_t KvPlacement::take_block() {
  const int32_t b = allocator_.allocate();
  return b >= 0 || prefix_.evict(1) == 0 ? b : allocator_.allocate();
}

bool KvPlacement::allocate_block(Sequence& s) {
  const int32_t b = take_block();
  if (b < 0) return false;
  s.blocks.push_back(b);
  return true;
}

bool KvPlacement::ensure_room(Sequence& s, int32_t tokens) {
  const int32_t bs = allocator_.block_size();
  while (static_cast<int32_t>(s.blocks.size()) * bs < tokens)
    if (!allocate_block(s)) return false;
  return true;
}

void KvPlacement::release_blocks(Sequence& s) {
  for (int32_t b : s.blocks)
    if (b != kDroppedBlock) allocator_.release(b);
  s.blocks.clear();
  dropped_tokens_ -= s.dropped_blocks * allocator_.block_size();
  s.dropped_blocks = 0;
  s.restoring = false;
}

void KvPlacement::preempt(Sequence& s) {
  release_blocks(s);
  s.dropped = s.n_computed;
  s.n_computed = 0;
  s.n_registered = 0;
  s.last_hash = 0;
  s.policy_state = {};
  s.drop_drafts();
  s.running_before_drafts.clear();  // its blocks are gone: the prefill writes every position again
  s.state = SeqState::kWaiting;
  s.request->pooled.clear();  // an embedding pools its positions again
  metrics_.preempt_recompute.inc();
}

void KvPlacement::trim_blocks(Sequence& s) {
  const int32_t bs = allocator_.block_size();
  const auto need = static_cast<size_t>((static_cast<int32_t>(s.tokens.size()) + bs - 1) / bs);
  while (s.blocks.size() > std::max(need, static_cast<size_t>(s.dropped_blocks))) {
    allocator_.release(s.blocks.back());
    s.blocks.pop_back();
  }
}

void KvPlacement::register_full_blocks(Sequence& s) {
  if (!config_.prefix_caching) return;
  const int32_t bs = allocator_.block_size();
  const int32_t full = s.n_computed / bs;
  for (int32_t i = s.n_registered; i < full; ++i)
    s.last_hash = prefix_.insert(s.last_hash, std::span<const int32_t>(s.tokens).subspan(i * bs, bs), s.blocks[i]);
  s.n_registered = std::max(s.n_registered, full);
}

void KvPlacement::match_prefix(Sequence& s, bool use_cache) {
  const int32_t bs = allocator_.block_size();
  const auto n_tokens = static_cast<int32_t>(s.tokens.size());
  // At least one token is always computed: its logits give the next token.
  if (config_.prefix_caching && use_cache) {
    s.blocks = prefix_.match(s.tokens, (n_tokens - 1) / bs);
    metrics_.prefix_queries.inc(n_tokens);
    metrics_.prefix_hits.inc(static_cast<double>(s.blocks.size()) * bs);
  }
  s.n_computed = static_cast<int32_t>(s.blocks.size()) * bs;
}

void KvPlacement::fork(const Sequence& parent, Sequence& child) {
  const int32_t bs = allocator_.block_size();
  const int32_t full = parent.n_computed / bs;
  for (int32_t i = 0; i < full; ++i) {
    allocator_.retain(parent.blocks[i]);
    child.blocks.push_back(parent.blocks[i]);
  }
  child.n_computed = parent.n_computed;
  child.n_registered = parent.n_registered;  // == full: the parent registered its full blocks
  child.last_hash = parent.last_hash;
  if (parent.n_computed % bs == 0) return;
  if (allocate_block(child)) {
    const int32_t src = parent.blocks[full], dst = child.blocks.back();
    copy_slot(allocator_.tier(src), allocator_.slot(src), allocator_.tier(dst), allocator_.slot(dst));
  } else {  // no room to copy: this choice recomputes its prompt later (the prefix cache helps)
    release_blocks(child);
    child.n_computed = 0;
    child.n_registered = 0;
    child.last_hash = 0;
  }
}

void KvPlacement::computed(Sequence& s, int32_t chunk, bool decoded) {
  s.n_computed += chunk;
  if (s.dropped_blocks > 0 && decoded) {  // its recompute ran in this step
    metrics_.dropped_recomputed.inc(s.dropped_blocks * allocator_.block_size());
    if (s.restoring) {  // the new blocks hold the prefix again
      metrics_.restored_blocks.inc(s.dropped_blocks);
      dropped_tokens_ -= s.dropped_blocks * allocator_.block_size();
      s.dropped_blocks = 0;
      s.restoring = false;
    }
  }
  register_full_blocks(s);
}

void KvPlacement::copy_slot(KvTier from, int32_t from_slot, KvTier to, int32_t to_slot) {
  backend_.copy_slot(from, from_slot, to, to_slot);
  const auto bytes = static_cast<double>(backend_.block_bytes());
  if (from == KvTier::kHost && to == KvTier::kDevice) metrics_.swap_in.inc(bytes);
  if (from == KvTier::kDevice && to == KvTier::kHost) metrics_.swap_out.inc(bytes);
}

int32_t KvPlacement::next_device_victim() {
  // A sequence's blocks are written in position order, so its oldest positions leave first and its
  // recent ones — what a sliding window and HiP's local window read every step — stay.
  int32_t best = -1;
  for (int32_t slot = 0; slot < allocator_.device_blocks(); ++slot) {
    const int32_t b = allocator_.block_at_device_slot(slot);
    if (b >= 0 && written_step_[b] != steps_ && (best < 0 || written_step_[b] < written_step_[best])) best = b;
  }
  return best;
}

void KvPlacement::make_resident(BatchPlan& plan, const std::vector<Sequence*>& planned, const std::vector<int32_t>& chunk_of) {
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
    // Its step writes from pos0: the sequence's own position, or past it for a sparse draft step.
    const int32_t pos0 = plan.seqs[i].pos0;
    // A step that opens a block also reads the block before it (the running V sum and K moments carry over).
    const int32_t first = pos0 % bs == 0 && pos0 > 0 ? pos0 / bs - 1 : pos0 / bs;
    const int32_t last = (pos0 + chunk_of[i] - 1) / bs;
    FATHOM_CHECK(last < static_cast<int32_t>(s.blocks.size()), "a planned step writes past its block table");
    for (int32_t b = first; b <= last; ++b) {
      writes.push_back({s.blocks[b], b * bs < pos0});
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
          copy_slot(KvTier::kHost, host_slot, KvTier::kDevice, allocator_.slot(w.block));
        } catch (...) {
          FATHOM_CHECK(allocator_.move_to_host(w.block));  // not moved: back where its bytes are
          throw;
        }
      }
      continue;
    }
    const int32_t victim = next_device_victim();
    FATHOM_CHECK(victim >= 0, "a step writes more blocks than the device tier holds");
    if (w.holds_data) {
      backend_.exchange_slots(allocator_.slot(victim), host_slot);
      metrics_.swap_in.inc(static_cast<double>(backend_.block_bytes()));
      metrics_.swap_out.inc(static_cast<double>(backend_.block_bytes()));
    } else {
      copy_slot(KvTier::kDevice, allocator_.slot(victim), KvTier::kHost, host_slot);
    }
    allocator_.exchange(victim, w.block);
    metrics_.demoted.inc();
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

}  // namespace fathom
