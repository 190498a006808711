#pragma once
// Where a sparse decode policy starts to pay on the CPU backend. A sparse step reads less KV but
// does more work per key it reads (SparQ's approximate scores, HiP's mask estimation every R
// steps, SWA's selection and mass update), so at short contexts it is slower than dense; the
// engine runs such steps densely (engine/forward.cpp). The break-even is measured, not assumed:
// one layer of the model's KV shape (heads, head dim, dtype, block size) filled with random rows
// in a storage of its own, the dense kernel and the policy's kernel timed on the backend's
// threads at 256, 512, ..., 32,768 keys up to the model's context length (best of 3 rounds of
// max(8, R) steps each), the layer's KV dropped from the caches before every step (a served step
// reads it from memory: the rest of the model passes through the caches in between).
#include <cstdint>
#include <vector>

#include "engine/attention/policy.h"
#include "engine/kv/kv_layout.h"
#include "kernels/cpu/thread_pool.h"

namespace fathom {

struct BreakEvenTimes {
  int32_t keys = 0;
  double dense_us = 0, sparse_us = 0;  // per layer step
};

struct BreakEven {
  // The smallest measured length from which the policy is faster than dense at every longer
  // measured length; kNever when it is not faster even at the longest.
  static constexpr int32_t kNever = INT32_MAX;
  int32_t min_keys = kNever;
  std::vector<BreakEvenTimes> times;  // one per measured length, ascending
};

// `p` as a request would send it (explicit parameters included); layout: the model's (its
// n_layers is ignored); n_heads query heads; scale the attention scale; context_length the
// model's (lengths past it are not measured; 0: all).
BreakEven measure_break_even(ThreadPool& pool, const KvLayout& layout, int32_t n_heads, float scale,
                             const AttentionPolicy& p, int32_t context_length);

}  // namespace fathom
