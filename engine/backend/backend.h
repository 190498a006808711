#pragma once
// A backend is the device a model runs on: it takes the weights it needs from the Model (uploads
// or repacks them), owns the KV cache's storage (num_blocks blocks of its KvLayout, addressed by
// the block ids of the engine's BlockAllocator), implements the forward ops (engine/forward_ops.h)
// and the attention policies it registers. The layer schedule is not here: forward() runs the one
// in engine/forward.cpp over this backend's ops.
//
// Threading: one backend is driven by one thread (the engine thread).
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/error.h"
#include "engine/backend/backend_options.h"
#include "engine/forward.h"
#include "engine/forward_ops.h"
#include "engine/kv/block_allocator.h"
#include "engine/kv/kv_layout.h"

namespace fathom {

class Model;

// Sparse decode over host-tier rows (the hot-row cache), per policy of the reading request:
// rows found in the cache, rows copied in, and layer steps that fell back to dense because one
// attention call needed more rows than the cache holds.
struct HotRowCounts {
  std::array<int64_t, kMaxPolicies> hits{}, misses{}, fallbacks{};
};

// What one forward pass did, for the engine's metrics: host-tier KV bytes attention staged into
// the device (the CPU's staging area, the CUDA kernels' reads of mapped host memory), hot-row
// cache lookups, KV bytes decode attention read by the requesting policy (indexed by PolicyKind),
// and decode layer steps by requested policy and kernel that ran.
struct StepStats {
  int64_t staged_bytes = 0;
  HotRowCounts hot_rows;
  KvReadBytes kv_read{};
  AttentionSteps attention_steps{};
  // Expert weight bytes the MoE layers read (stored form): Σ over layers and distinct active
  // experts of their three matrices' bytes (the CPU; CUDA: once per run of an expert's pairs its
  // kernel takes, ForwardOps::expert_matmul).
  int64_t expert_bytes = 0;
  StepStats& operator+=(const StepStats& o);  // summing passes
};

// A sparse policy's measured break-even (ForwardOps::sparse_break_even): decode steps with fewer
// keys run densely; INT32_MAX when the policy was not faster than dense at any measured length.
struct MeasuredBreakEven {
  AttentionPolicy probe;  // break_even_probe(request's policy)
  int32_t min_keys;
};

class Backend : protected ForwardOps {
 public:
  ~Backend() override;

  // "cpu", "cuda": for logs, errors and /metrics.
  virtual std::string name() const = 0;

  // ---- Attention policies (the table: PolicyKind -> implemented here or not) ----
  virtual bool implements(PolicyKind kind) const = 0;
  // Bifurcated attention (ForwardOps::attend_group); without it the scheduler forms no groups.
  virtual bool implements_groups() const = 0;
  // Throws fathom::Error naming the policy, the backend and what it does implement.
  void check_policy(const AttentionPolicy& policy) const;

  // ---- KV storage ----
  const KvLayout& kv_layout() const { return kv_layout_; }
  int32_t kv_blocks() const { return kv_blocks_; }  // blocks the storage holds
  // Bytes of one block's host image across every layer and plane (what read_block writes and
  // write_block reads: the backend's own layout, not necessarily the CPU's).
  virtual size_t block_bytes() const = 0;
  // Whole-block moves (copy-on-write of a forked sequence's partial block, swap to the host
  // tier and back). Failpoint "kv_copy".
  void copy_block(int32_t src, int32_t dst);
  void read_block(int32_t block, std::byte* dst);
  void write_block(int32_t block, const std::byte* src);

  // ---- Host tier (blocks placed by engine/kv/block_allocator.h; docs/tiered_kv.md) ----
  // Makes room for `blocks` KV blocks in host memory and returns how many the backend holds
  // there (0: no host tier; every block then stays in device storage). Called once, before the
  // first forward. With a host tier, a plan's block tables are physical (BlockAllocator::
  // physical): negative entries are host slots, which attention reads as the backend
  // arranges (the CPU backend through a bounded staging area and a hot-row cache, the CUDA kernels in
  // place from mapped pinned memory); the blocks a step writes are always device slots.
  // `keep_device_blocks`: the device blocks the page table needs at least (every block one step
  // writes); a backend may turn the rest of its budget into device-side caches of the host tier.
  virtual int32_t reserve_host_tier(int32_t blocks, int32_t keep_device_blocks);
  // Recompute scratch (ALISA's cache-or-recompute, docs/tiered_kv.md): `blocks` blocks whose
  // memory is one layer's, shared by all layers. A step that recomputes a sequence's dropped
  // blocks names them in its block tables: each layer's append writes that layer's K/V there, the
  // layer's attention reads them, the next layer overwrites them. Called once, after
  // reserve_host_tier and before the first forward; returns how many the backend gives (0: it
  // cannot, and the scheduler preempts instead). Their bytes may come out of the device budget
  // (kv_blocks() may shrink).
  virtual int32_t reserve_recompute_scratch(int32_t /*blocks*/) { return 0; }
  // The physical block table entry of scratch block i (i < what reserve_recompute_scratch gave).
  virtual int32_t recompute_slot(int32_t /*i*/) const {
    FATHOM_CHECK(false, "no recompute scratch");
    return -1;
  }
  // Whole-block copies between tiers and slots (every layer and plane); failpoint "kv_copy".
  // Device to device is copy_block's copy, so it serves backends without a host tier too. The
  // caller counts the bytes it moves (engine/kv_placement.h).
  void copy_slot(KvTier from, int32_t from_slot, KvTier to, int32_t to_slot);
  // Device slot `device_slot` and host slot `host_slot` trade their bytes.
  void exchange_slots(int32_t device_slot, int32_t host_slot);
  // Waits until the moves queued so far are done (a backend whose moves are asynchronous): the
  // end of a measurement of them.
  virtual void finish_moves() {}

  // ---- Speculative decoding (docs/speculative.md) ----
  // A verify step (SeqStep::verify) may keep only its first rows. The dropped rows' K and V (and
  // their transposed-K slots and INT8 row parameters) are read by nothing before the sequence
  // writes those positions again; the running planes (V sums, K moments: over every position so
  // far) would be, so the backend keeps each verify row's running planes as its append left them
  // and rollback_kv puts back those of the last row kept. False: it keeps none, and no request
  // speculates on it.
  virtual bool implements_rollback() const { return false; }
  // After forward(plan): plan.seqs[seq] (a verify step) keeps its first `kept_rows` rows (>= 1).
  // Valid until the next forward.
  virtual void rollback_kv(int32_t /*seq*/, int32_t /*kept_rows*/) { FATHOM_CHECK(false, "no KV rollback on this backend"); }
  // The running planes of device slot `slot`, every layer: n_layers x running_floats() floats
  // (per layer and KV head: V sum, K mean, K M2, head_dim each), copied out, and put back. Sparse
  // drafting's steps append at positions a verify step writes again; these keep and restore
  // what they changed. Every backend that implements_rollback() has them.
  virtual void read_running(int32_t /*slot*/, std::vector<float>& /*out*/) { FATHOM_CHECK(false, "no KV rollback on this backend"); }
  virtual void write_running(int32_t /*slot*/, const std::vector<float>& /*in*/) {
    FATHOM_CHECK(false, "no KV rollback on this backend");
  }

  // ---- The forward pass ----
  // True when forward() keeps the host's cores busy (the CPU backend's thread pool): host-side
  // work overlapped with it (constraint masks) would only compete for the same cores. A device
  // backend leaves the host idle while its kernels run, so that work overlaps for free.
  virtual bool forward_occupies_host() const { return false; }
  // Runs fn(i) for every i in [0, n) on the host, in parallel where the backend has host
  // threads to lend between forwards (the CPU backend's pool); serially otherwise. Each i's work
  // must touch only its own state. An exception from fn reaches the caller (the first one; the
  // other indices still run). Used for per-sequence sampling after a step.
  virtual void host_parallel_for(int64_t n, const std::function<void(int64_t)>& fn) {
    for (int64_t i = 0; i < n; ++i) fn(i);
  }
  // Runs the plan (run_forward over this backend's ops): appends every step's K/V at its
  // positions, attends, and writes plan.logits_rows() rows of vocab floats to `logits` (host
  // memory), and the wanted final hidden states (SeqStep::hidden) to `hidden` if given. Throws fathom::Error (or std::logic_error for a broken invariant) on failure; the
  // KV blocks of the plan's sequences are then in an unknown state. Returns what the pass did.
  StepStats forward(const BatchPlan& plan, std::vector<float>& logits, std::vector<float>* hidden = nullptr);
  // Measures now what `policy` (auto resolved) would measure on its first sparse step: the keys
  // it runs densely below (0 where the backend does not measure). -1 for dense or an explicit
  // min_keys. The server calls it at start-up for its default policy, so no request waits for it.
  int32_t prepare_break_even(const AttentionPolicy& policy);
  // The break-evens measured so far, in the order measured (none on a backend that does not
  // measure), for /metrics: a caller that saw n of them need only look at those past n.
  const std::vector<MeasuredBreakEven>& measured_break_evens() const { return break_evens_; }

  const Model& model() const { return model_; }

 protected:
  // `layout` describes the stored planes; `num_blocks` >= 1.
  Backend(const Model& model, const KvLayout& layout, int32_t num_blocks);
  virtual void copy_block_impl(int32_t src, int32_t dst) = 0;
  virtual void read_block_impl(int32_t block, std::byte* dst) = 0;
  virtual void write_block_impl(int32_t block, const std::byte* src) = 0;
  // Only backends whose reserve_host_tier() returns > 0 get these calls (copy_slot_impl: with a
  // host tier at one end at least).
  virtual void copy_slot_impl(KvTier, int32_t, KvTier, int32_t) { FATHOM_CHECK(false, "no host tier"); }
  virtual void exchange_slots_impl(int32_t, int32_t) { FATHOM_CHECK(false, "no host tier"); }
  // The pass under way: backends add attention's staging and hot-row lookups here; forward()
  // starts it at zero and returns it.
  StepStats step_;
  // Appended by a backend that measures (its sparse_break_even), one per probe.
  std::vector<MeasuredBreakEven> break_evens_;
  // A backend that carves its own device areas (a hot-row cache) out of the budget shrinks the
  // blocks it offers the page table; only inside reserve_host_tier() and
  // reserve_recompute_scratch().
  void set_kv_blocks(int32_t blocks) {
    FATHOM_CHECK(blocks >= 1 && blocks <= kv_blocks_);
    kv_blocks_ = blocks;
  }

  const Model& model_;

 private:
  KvLayout kv_layout_;
  int32_t kv_blocks_;
};

// Blocks a KV budget holds: `bytes` (0: room for the model's whole context plus 64 blocks) over
// `block_bytes`. Throws fathom::Error when the budget holds no block.
int32_t kv_blocks_for_budget(const Model& model, const ModelOptions& options, size_t block_bytes);

// The backend `options.backend` names ("cpu" or "cuda"). Throws fathom::Error for an unknown
// name, a build without CUDA, no visible GPU, or a model the backend cannot run.
std::unique_ptr<Backend> make_backend(const Model& model, const ModelOptions& options);

// How "cuda" backends are made: the fathom executable registers engine/backend/cuda's factory
// when built with CUDA; without one, "cuda" is a load error.
using BackendFactory = std::function<std::unique_ptr<Backend>(const Model&, const ModelOptions&)>;
void register_cuda_backend(BackendFactory factory);

}  // namespace fathom
