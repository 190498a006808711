#pragma once
// One decode query of one layer through the sequence's attention policy, with the state a
// policy keeps across steps (HiP's cached mask, ALISA's attention mass), and the KV bytes read.
#include <cstdint>
#include <vector>

#include "engine/attention/policy.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/paged_kv.h"

namespace fathom {

struct LayerPolicyState {
  ref::HipMask hip_mask;
  ref::HipParams hip_params;    // the parameters the cached mask was estimated with
  int32_t hip_age = -1;         // decode steps since the mask was estimated; −1: none yet
  std::vector<float> swa_mass;  // [positions] decayed attention weight summed over heads
};

// Per sequence, one entry per layer. Reset when the sequence is recomputed; copied on fork.
struct SeqPolicyState {
  std::vector<LayerPolicyState> layers;
};

// True when `layer` reads the KV cache through the sparse policy (else dense): sliding-window
// layers already read at most their window and stay dense; HiP keeps its leading layers dense.
bool layer_uses_policy(const AttentionPolicy& p, int32_t layer, bool sliding);

// Runs args (one query at args.pos) over kv with policy `p` and returns the KV bytes read.
// Dense reads S = pos + 1 rows of K and V per kv head.
int64_t decode_attention(ThreadPool& pool, const PagedKvView& kv, const DecodeArgs& args, const AttentionPolicy& p,
                         LayerPolicyState& state);

// Bytes dense attention reads for one query attending `keys` keys.
int64_t dense_kv_bytes(const PagedKvView& kv, int64_t keys);

}  // namespace fathom
