#pragma once
// The CPU backend's sparse decode policies: one decode query of one layer through SparQ, HiP or
// SWA (kernels/cpu), updating the sequence's policy state; returns the KV bytes read.
#include <cstdint>

#include "engine/attention/decode_attention.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/paged_kv.h"

namespace fathom {

// The policies cpu_sparse_decode implements (every PolicyKind but dense, which is not sparse).
bool cpu_implements(PolicyKind kind);

// args: one query at args.pos over kv; p.kind must be sparse and selects_every_key false.
int64_t cpu_sparse_decode(ThreadPool& pool, const PagedKvView& kv, const DecodeArgs& args, const AttentionPolicy& p,
                          LayerPolicyState& state);

}  // namespace fathom
