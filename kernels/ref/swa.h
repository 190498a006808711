#pragma once
// Scalar reference of ALISA's Sparse Window Attention (ALGORITHMS.md; no public implementation,
// follows the paper): keep the most recent tokens and the tokens with the largest recent
// attention mass, gather them densely and take an exact softmax.
#include <cstdint>
#include <vector>

#include "kernels/ref/attention_state.h"

namespace fathom::ref {

struct SwaParams {
  float ratio = 0.5f;  // caching ratio r: about n·r of the n = pos + 1 tokens are kept
};

struct SwaStats {
  int64_t kv_bytes = 0;           // 2 · |kept| · d · element size · n_kv_heads
  std::vector<int32_t> kept;      // ascending positions, shared by every head
  int32_t k_local = 0, k_global = 0;
};

// How many positions a step at n = pos + 1 keys keeps (the rule below): the k_local newest and
// k_global older ones.
struct SwaSizes {
  int32_t k_local = 0, k_global = 0;
};
SwaSizes swa_sizes(int32_t n, float ratio);

// The kept positions of a step at n = pos + 1 keys (the selection rule below), ascending.
SwaStats swa_select(int32_t n, float ratio, const float* mass);

// n = pos + 1. k_local = max(1, ⌊n·r/2⌋) most recent tokens [n − k_local, n) (the current token
// is always kept); k_global = max(0, ⌊n·r⌋ − k_local) older tokens with the largest `mass`
// (ties: lower position). The paper's k = ⌊n·r/2⌋ for both halves; giving the global half the
// remainder makes r = 1 keep every token for odd n too (so r = 1 is dense).
//   mass: [pos + 1] attention weight per position summed over the last k decode steps and over
//         heads (the caller accumulates it; only [0, n − k_local) is read).
SwaStats swa_attention(const PagedKvView& kv, const DecodeArgs& args, const SwaParams& p, const float* mass);

}  // namespace fathom::ref
