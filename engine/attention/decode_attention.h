#pragma once
// Backend-independent parts of decode attention through a request's policy: the state a policy
// keeps across steps (HiP's cached mask, ALISA's attention mass), which layers and lengths it
// covers, and the dense byte count. The kernels per policy live in each backend
// (engine/backend/cpu/cpu_policies.cpp, engine/backend/cuda/).
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "engine/attention/policy.h"
#include "engine/kv/kv_layout.h"

namespace fathom {

// State a backend keeps for one layer of one sequence in its own memory (the CUDA backend: SWA's
// mass on the device), opaque to the engine.
class BackendLayerState {
 public:
  virtual ~BackendLayerState() = default;
  virtual std::unique_ptr<BackendLayerState> clone() const = 0;  // a fork's copy
};

// Owns a BackendLayerState; copying the owner clones it (a fork gets its own copy), destroying it
// frees it (a finished or recomputed sequence).
class BackendLayerStatePtr {
 public:
  BackendLayerStatePtr() = default;
  BackendLayerStatePtr(const BackendLayerStatePtr& o) : p_(o.p_ ? o.p_->clone() : nullptr) {}
  BackendLayerStatePtr& operator=(const BackendLayerStatePtr& o) {
    if (this != &o) p_ = o.p_ ? o.p_->clone() : nullptr;
    return *this;
  }
  BackendLayerStatePtr(BackendLayerStatePtr&&) noexcept = default;
  BackendLayerStatePtr& operator=(BackendLayerStatePtr&&) noexcept = default;
  BackendLayerState* get() const { return p_.get(); }
  void reset(std::unique_ptr<BackendLayerState> p) { p_ = std::move(p); }

 private:
  std::unique_ptr<BackendLayerState> p_;
};

struct LayerPolicyState {
  ref::HipMask hip_mask;
  ref::HipParams hip_params;    // the parameters the cached mask was estimated with
  int32_t hip_age = -1;         // steps counted toward the next refresh (hip_refresh_due); −1: no mask yet
  int32_t hip_turn = 0;         // this layer's refresh phase: its rank among the policy's layers (hip_turn)
  std::vector<float> swa_mass;    // [positions] decayed attention weight summed over heads
  std::vector<float> swa_pooled;  // [positions] scratch: swa_mass max-pooled (swa_selection_mass)
  BackendLayerStatePtr backend;   // a backend's own per-layer state (unused by the CPU backend)
};

// Per sequence, one entry per layer. Reset when the sequence is recomputed; copied on fork.
struct SeqPolicyState {
  std::vector<LayerPolicyState> layers;
};

// True when `layer` reads the KV cache through the sparse policy (else dense): sliding-window
// layers already read at most their window and stay dense; HiP keeps its leading layers dense.
bool layer_uses_policy(const AttentionPolicy& p, int32_t layer, bool sliding);

// HiP's mask refresh. Each layer re-estimates its mask every p.hip_refresh decode steps, but the
// layers take turns: a sequence's first estimate (in every layer at once: there is no mask yet)
// starts a layer's count at its hip_turn mod R, so its next estimate comes R − (turn mod R) steps
// later, and from then on each step re-estimates ~1/R of the layers. Refreshing every layer at the
// same step made that step slower than a dense one (SmolLM2 at 8k, R = 4: 13-14 ms every 4th token
// against dense's 12, the other three ~7); each mask still lives R steps.
bool hip_refresh_due(const AttentionPolicy& p, const LayerPolicyState& state);
// After a HiP step: `estimated` tells whether it estimated the mask.
void hip_count_step(const AttentionPolicy& p, bool estimated, LayerPolicyState& state);
// A layer's turn: how many layers below it read through the policy (layer_uses_policy, with
// sliding(l) telling whether layer l is a sliding-window one), so that the layers the policy reads
// take consecutive turns. (The layer index itself would not do: Gemma 3's global layers are 5, 11,
// 17, ... — all odd, so with R = 2 every one of them would refresh at the same step.)
template <typename SlidingOf>
int32_t hip_turn(const AttentionPolicy& p, int32_t layer, SlidingOf&& sliding) {
  int32_t turn = 0;
  for (int32_t l = 0; l < layer; ++l) turn += layer_uses_policy(p, l, sliding(l)) ? 1 : 0;
  return turn;
}

// True when the policy would select every one of the S keys at head dimension d: the step is
// dense attention and runs the dense kernel — the output is then exactly dense (one kernel's
// rounding, not the gather kernels'), and no selection work is spent. HiP's mask state is left
// alone: it is estimated at the first step whose selection is partial (hip_age < 0).
bool selects_every_key(const AttentionPolicy& p, int32_t S, int32_t d);

// SWA's parameters for a step at S keys: the request's caching ratio, or 1 (dense) on the first
// step, which has no mass yet and seeds it. Sizes state.swa_mass to S (new positions at 0).
ref::SwaParams swa_step_params(const AttentionPolicy& p, LayerPolicyState& state, int32_t S);
// The mass SWA selects its heavy hitters by at this step: state.swa_mass max-pooled over
// p.swa_pool positions centred on each (window clipped at the ends), or swa_mass itself for
// pool 1. Points into state; valid until the state's next SWA call.
const float* swa_selection_mass(const AttentionPolicy& p, LayerPolicyState& state);
// ALISA keeps the tokens with the largest attention mass "summed over the last k steps"; an
// exponential decay with horizon k = k_local stands in for the exact sliding sum (which would
// need k past weight vectors): mass = mass·(1 − 1/k_local) + weights, where weights is this step's
// softmax weight per position summed over heads: kept_weights[i] at kept[i], 0 elsewhere (the sum
// x·keep + 0 is x·keep, so scaling every position and adding at the kept ones is the same
// arithmetic without an [S] weights array to clear and read).
void swa_fold_mass(LayerPolicyState& state, std::span<const int32_t> kept, const float* kept_weights, int32_t k_local);
// The fold's decay 1 − 1/k_local (k_local < 1 taken as 1).
float swa_decay(int32_t k_local);
// The radius SWA pools its mass over (swa_selection_mass): p.swa_pool / 2, 0 for no pooling.
int32_t swa_pool_radius(const AttentionPolicy& p);

// Bytes dense attention reads for one query attending `keys` keys: S rows of K and V per kv head.
int64_t dense_kv_bytes(const KvLayout& kv, int64_t keys);

}  // namespace fathom
