#pragma once
// Where every sequence's KV blocks live. The Scheduler decides which sequences run a step; this
// object owns every move of their blocks (docs/tiered_kv.md): the page table over the device and
// host tiers, the prefix cache, sharing a prompt's blocks between the choices of one request, the
// moves that make a step's blocks device-resident (demoting the blocks written longest ago), and
// ALISA's cache-or-recompute: dropping running sequences' oldest blocks when both tiers are full,
// recomputing them every step into the backend's scratch, restoring them when room comes back.
#include <cstdint>
#include <vector>

#include "engine/batch_plan.h"
#include "engine/engine.h"
#include "engine/kv/block_allocator.h"
#include "engine/kv/prefix_index.h"
#include "engine/sequence.h"

namespace fathom {

class Backend;
class Model;
struct EngineMetrics;

class KvPlacement {
 public:
  // Reserves the host tier and recompute scratch `config` asks of the backend, shrinks `config`'s
  // steps when the device tier could not hold every block a configured step writes (the server
  // logs the limits it runs with), and measures the cache-or-recompute cost model (forward passes
  // on the backend). `config` must outlive this object.
  KvPlacement(const Model& model, Backend& backend, SchedulerConfig& config, EngineMetrics& metrics);
  ~KvPlacement();

  const BlockAllocator& allocator() const { return allocator_; }
  // A request up to both tiers plus its capacity_tokens can finish.
  const RecomputeModel& recompute_model() const { return recompute_; }
  int32_t dropped_tokens() const { return dropped_tokens_; }  // dropped now (restoring ones included)
  int32_t available_blocks() const;                            // free + evictable
  // Its tokens and the next one fit both tiers: preempted, it can be admitted again.
  bool fits_both_tiers(const Sequence& s) const;

  // Blocks for the first `tokens` positions of `s`, evicting cached prefixes if needed; false when
  // there is no room (the blocks it took stay with `s`).
  bool ensure_room(Sequence& s, int32_t tokens);
  void release_blocks(Sequence& s);
  // Preemption by recompute: `s`'s blocks go back (their full ones stay in the prefix cache when it
  // has them) and it waits to prefill again. With a host tier this happens only when both tiers are
  // full; a sequence whose blocks do not fit the device tier keeps running from both tiers.
  void preempt(Sequence& s);
  // Gives back `s`'s blocks past those its tokens need (a verify step's dropped drafts).
  void trim_blocks(Sequence& s);
  // Offers `s`'s newly full blocks to the prefix cache.
  void register_full_blocks(Sequence& s);
  // Gives `s` its longest cached prefix (`use_cache`: the request may use it) and sets n_computed.
  void match_prefix(Sequence& s, bool use_cache);
  // A choice forked from `parent` after its prefill: shares the full blocks and copies the partial
  // last one (copy-on-write at fork time); without room for the copy it starts over (n_computed 0).
  void fork(const Sequence& parent, Sequence& child);
  // The step computed `chunk` more tokens of `s` (`decoded`: one generated token, whose step also
  // recomputed its dropped blocks): a restore is complete; full blocks go to the prefix cache.
  void computed(Sequence& s, int32_t chunk, bool decoded);

  // Cache-or-recompute over `seqs` (every unfinished sequence, in the order requests arrived).
  // Drops the oldest droppable block of the running sequence where that costs the fewest
  // recomputed tokens — the block's tokens every step until the soonest running sequence ends —
  // if fewer than `preempt_cost` (what the preemption it replaces would recompute); `host_only`:
  // only a block in the host tier. False when none may be dropped.
  bool drop_oldest_block(const std::vector<Sequence*>& seqs, bool host_only, int64_t preempt_cost);
  // Gives sequences with dropped blocks new blocks when the tiers have room for them and more:
  // their next step recomputes into those (Sequence::restoring).
  void restore_dropped(const std::vector<Sequence*>& seqs);

  // A new plan: no recompute entries yet.
  void begin_plan() { recompute_owner_.clear(); }
  // Adds to `plan` the recompute of `s`'s dropped blocks (`s` is at plan index `owner`).
  void plan_recompute(BatchPlan& plan, const Sequence& s, int32_t owner);
  // Host tier: the blocks `plan` writes move into device slots (demoting the blocks written
  // longest ago that it does not write), and the plan's block tables become physical ones.
  void make_resident(BatchPlan& plan, const std::vector<Sequence*>& planned, const std::vector<int32_t>& chunk_of);

 private:
  int32_t take_block();  // a free block, evicting a cached prefix if needed; -1: none
  bool allocate_block(Sequence& s);
  int32_t next_device_victim();
  // The backend's copy, its bytes counted as swapped in or out when it crosses the tiers.
  void copy_slot(KvTier from, int32_t from_slot, KvTier to, int32_t to_slot);  // the device block written longest ago that this step does not write, or -1
  void measure_recompute_cost(const Model& model);

  Backend& backend_;
  const SchedulerConfig& config_;
  EngineMetrics& metrics_;
  int32_t scratch_blocks_ = 0;  // the backend's recompute scratch (set while allocator_ is made)
  BlockAllocator allocator_;
  PrefixIndex prefix_;
  std::vector<std::vector<int32_t>> physical_;  // this step's physical block tables, by plan index
  std::vector<int64_t> written_step_;            // per block id: the last step that wrote it (steps_: this one)
  int64_t steps_ = 0;                            // steps that went through make_resident
  RecomputeModel recompute_;                     // capacity_tokens: what all running sequences may have dropped at once
  int32_t dropped_tokens_ = 0;
  std::vector<int32_t> recompute_owner_;  // plan.seqs past `planned`: the plan index each recomputes for
};

}  // namespace fathom
