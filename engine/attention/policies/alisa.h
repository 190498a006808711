#pragma once
// ALISA's sparse window attention (ALGORITHMS.md; kernels/ref/swa.h): each step attends the
// local window and the heavy hitters of the attention mass accumulated over past steps. Its
// options: "alisa": {"ratio", "pool"} ("swa" accepted as the old name). Not to be confused with
// the sliding-window layers of Gemma-style models (LayerConfig::window), which stay dense.
#include <cstdint>
#include <span>
#include <vector>

#include "engine/attention/policy.h"
#include "engine/attention/policy_registry.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/paged_kv.h"
#include "kernels/ref/swa.h"

namespace fathom::alisa {

// ratio: the caching ratio (derived: kv_read_ratio). Its heavy hitters are chosen by the mass
// max-pooled over `pool` neighbouring positions (SnapKV's pooling, kernel 7: a multi-token span
// such as a number is kept whole, and filler tokens next to nothing heavy are not; 1: the raw
// mass, as the paper). Measured in eval/results/sparse_quality_findings.md.
inline constexpr ParamSpec kParams[] = {
    {"ratio", ParamType::kRatio, kDerived},
    {"pool", ParamType::kOddInt, 7, 1},
};
inline constexpr Param kRatio{kParams, 0}, kPool{kParams, 1};

// At S keys: the caching ratio as given, else kv_read_ratio but keeping at least kMinKept keys
// (1 at S <= kMinKept: dense). Below that the local half of the kept set is too short to hold
// the question and a needle's digits at once (SmolLM2 at 1k keys, 1/8: 16/20 pass keys against
// 20/20 at 1/4; eval/results/sparse_quality_findings.md), and the bytes saved are a few KiB per
// layer anyway.
inline constexpr int32_t kMinKept = 256;
ref::SwaParams resolve(const AttentionPolicy& p, int32_t S);

// One layer's attention mass of one sequence.
struct LayerState : PolicyLayerState {
  std::vector<float> mass;    // [positions] decayed attention weight summed over heads
  std::vector<float> pooled;  // [positions] scratch: mass max-pooled (selection_mass)
  std::unique_ptr<PolicyLayerState> clone() const override { return std::make_unique<LayerState>(*this); }
};

// The parameters for a step at S keys: the request's caching ratio, or 1 (dense) on the first
// step, which has no mass yet and seeds it. Sizes state.mass to S (new positions at 0).
ref::SwaParams step_params(const AttentionPolicy& p, LayerState& state, int32_t S);
// The mass the heavy hitters are chosen by at this step: state.mass max-pooled over `pool`
// positions centred on each (window clipped at the ends), or mass itself for pool 1. Points into
// state; valid until the state's next call.
const float* selection_mass(const AttentionPolicy& p, LayerState& state);
// ALISA keeps the tokens with the largest attention mass "summed over the last k steps"; an
// exponential decay with horizon k = k_local stands in for the exact sliding sum (which would
// need k past weight vectors): mass = mass·(1 − 1/k_local) + weights, where weights is this step's
// softmax weight per position summed over heads: kept_weights[i] at kept[i], 0 elsewhere (the sum
// x·keep + 0 is x·keep, so scaling every position and adding at the kept ones is the same
// arithmetic without an [S] weights array to clear and read).
void fold_mass(LayerState& state, std::span<const int32_t> kept, const float* kept_weights, int32_t k_local);
// The fold's decay 1 − 1/k_local (k_local < 1 taken as 1).
float decay(int32_t k_local);
// The radius the mass is pooled over (selection_mass): pool / 2, 0 for no pooling.
int32_t pool_radius(const AttentionPolicy& p);

// The CPU step, and whether it reads host-tier rows through the hot-row cache (always: it
// gathers rows).
int64_t cpu_step(ThreadPool& pool, const PagedKvView& kv, const DecodeArgs& args, const AttentionPolicy& p,
                 LayerPolicyState& state);
bool cpu_reads_host_tier(const PagedKvView& kv, const AttentionPolicy& p);

extern const PolicyDef kDef;

}  // namespace fathom::alisa
