#pragma once
// The per-ISA inner kernel of kernels/cpu/attention.cpp.
#include <cstdint>

#include "kernels/cpu/thread_pool.h"
#include "kernels/paged_kv.h"

namespace fathom::cpu {

// R query rows that share one kv head; row r attends keys [lo[r], hi[r]] (inclusive),
// intersected with the work item's key range [t0, t1).
struct PartialRows {
  int32_t count = 0;
  const float* const* q = nullptr;  // [R] -> [head_dim]
  const int32_t* lo = nullptr;      // [R]
  const int32_t* hi = nullptr;      // [R]
};

// Online softmax over keys [t0, t1) of kv head `head`. Outputs per row: acc[r][head_dim]
// (unnormalised Σ p·v), m[r] (max logit, -inf if the row saw no key), l[r] (Σ exp(logit - m)).
// scratch: at least 2·block_size·head_dim + block_size floats.
using PartialAttentionFn = void (*)(const PagedKvView& kv, int32_t head, const PartialRows& rows, int32_t t0,
                                    int32_t t1, float scale, float* acc, float* m, float* l, float* scratch);

PartialAttentionFn partial_attention_portable();
// nullptr when this CPU lacks the ISA.
PartialAttentionFn partial_attention_avx2();
PartialAttentionFn partial_attention_avx512();

// cpu::paged_attention with an explicit inner kernel (tests run every ISA variant).
void paged_attention_with(PartialAttentionFn kernel, ThreadPool& pool, const PagedKvView& kv, const AttentionArgs& args);

}  // namespace fathom::cpu
