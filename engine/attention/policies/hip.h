#pragma once
// HiP (ALGORITHMS.md; kernels/ref/hip.h): a hierarchically estimated top-k block mask, refreshed
// every `refresh` steps and attended block-sparsely in between. Its options: "hip": {"mask_k",
// "block_size_k", "sink", "window", "refresh", "dense_layers", "per_kv_head"}.
#include <cstdint>

#include "engine/attention/policy.h"
#include "engine/attention/policy_registry.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/paged_kv.h"
#include "kernels/ref/hip.h"

namespace fathom::hip {

// mask_k, sink, window: derived from the ratio at S unless set (resolve). The mask is re-estimated
// every `refresh` steps; the first `dense_layers` layers stay dense (the paper's default 3). One
// mask per kv head (ref::HipParams::per_kv_head) and a refresh every 4 steps instead of the
// paper's per query head and 8: per kv head estimates G× fewer keys, which pays for refreshing
// twice as often, and the mask 8 steps old is what lost the pass keys (SmolLM2 at 1k-4k, 1/8: 4-12
// of 20 at R = 8, 15-18 of 20 at R = 4 per kv head; one layer at 8k keys 127 µs against 185 µs per
// head at R = 8 and 166 µs dense; eval/results/sparse_quality_findings.md, "Third step").
inline constexpr ParamSpec kParams[] = {
    {"mask_k", ParamType::kInt, kDerived, 1},
    {"sink", ParamType::kInt, kDerived, 0},
    {"window", ParamType::kInt, kDerived, 0},
    {"block_size_k", ParamType::kInt, 2, 1},
    {"refresh", ParamType::kInt, 4, 1},
    {"dense_layers", ParamType::kInt, 3, 0},
    {"per_kv_head", ParamType::kBool, 1},
};
inline constexpr Param kMaskK{kParams, 0}, kSink{kParams, 1}, kWindow{kParams, 2}, kBlockSizeK{kParams, 3},
    kRefresh{kParams, 4}, kDenseLayers{kParams, 5}, kPerKvHead{kParams, 6};

// HiP at S keys: budget B = ratio·S tokens split as sink = min(16, B/16), window = min(256, B/4)
// and mask_k = the rest (a multiple of block_size_k, at least one block); with B ≥ S the mask
// covers everything (dense).
ref::HipParams resolve(const AttentionPolicy& p, int32_t S);

// One layer's mask of one sequence.
struct LayerState : PolicyLayerState {
  ref::HipMask mask;
  ref::HipParams params;  // the parameters the cached mask was estimated with
  int32_t age = -1;       // steps counted toward the next refresh (refresh_due); −1: no mask yet
  std::unique_ptr<PolicyLayerState> clone() const override { return std::make_unique<LayerState>(*this); }
};

// The mask refresh. Each layer re-estimates its mask every `refresh` decode steps, but the layers
// take turns: a sequence's first estimate (in every layer at once: there is no mask yet) starts a
// layer's count at its rank mod R (LayerPolicyState::rank: how many layers below it HiP reads),
// so its next estimate comes R − (rank mod R) steps later, and from then on each step
// re-estimates ~1/R of the layers. Refreshing every layer at the same step made that step slower
// than a dense one (SmolLM2 at 8k, R = 4: 13-14 ms every 4th token against dense's 12, the other
// three ~7); each mask still lives R steps. (The layer index itself would not do: Gemma 3's
// global layers are 5, 11, 17, ... — all odd, so with R = 2 every one of them would refresh at
// the same step.)
bool refresh_due(const AttentionPolicy& p, const LayerState& state);
// After a step: `estimated` tells whether it estimated the mask; `rank` is the layer's.
void count_step(const AttentionPolicy& p, bool estimated, int32_t rank, LayerState& state);

// The CPU step (estimating the mask when due), and whether it reads host-tier rows through the
// hot-row cache (always: it gathers rows).
int64_t cpu_step(ThreadPool& pool, const PagedKvView& kv, const DecodeArgs& args, const AttentionPolicy& p,
                 LayerPolicyState& state);
bool cpu_reads_host_tier(const PagedKvView& kv, const AttentionPolicy& p);

extern const PolicyDef kDef;

}  // namespace fathom::hip
