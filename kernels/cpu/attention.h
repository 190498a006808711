#pragma once
// Paged causal attention on the CPU: SIMD (run-time dispatch), multi-threaded over
// (query block, kv head, key chunk) work items; key chunks of long sequences are merged
// exactly with their log-sum-exp statistics (split-K, flash-decoding style).
#include "kernels/cpu/thread_pool.h"
#include "kernels/paged_kv.h"

namespace fathom::cpu {

// See AttentionArgs in kernels/paged_kv.h.
void paged_attention(ThreadPool& pool, const PagedKvView& kv, const AttentionArgs& args);

}  // namespace fathom::cpu
