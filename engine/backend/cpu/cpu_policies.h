#pragma once
// The CPU backend's decode policies: every registered policy with a CPU step
// (engine/attention/cpu_steps.h).
#include <cstdint>

#include "engine/attention/decode_attention.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/paged_kv.h"

namespace fathom {

// Dense, and every policy with a CPU step (auto is resolved before it reaches a backend).
bool cpu_implements(PolicyKind kind);

// args: one query at args.pos over kv; p must have a CPU step and selects_every_key be false.
int64_t cpu_sparse_decode(ThreadPool& pool, const PagedKvView& kv, const DecodeArgs& args, const AttentionPolicy& p,
                          LayerPolicyState& state);

// Whether p's CPU step reads host-tier rows of kv through the hot-row cache.
bool cpu_reads_host_tier(const PagedKvView& kv, const AttentionPolicy& p);

}  // namespace fathom
