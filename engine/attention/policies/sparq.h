#pragma once
// SparQ (ALGORITHMS.md; kernels/ref/sparq.h): per step, the r largest query components rank the
// keys, the top k (with the last l forced) are attended exactly, the rest reallocated to the mean
// value. Its options: "sparq": {"r", "k", "l", "reallocation", "key_spread"}.
#include "engine/attention/policy.h"
#include "engine/attention/policy_registry.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/paged_kv.h"
#include "kernels/ref/sparq.h"

namespace fathom::sparq {

// r, k, l: derived from the ratio at S unless set (ref::sparq_params_for_ratio).
// key_spread: step 1 weighted by √ of the keys' spread per component (ref::sparq_attention's
// key_spread, from the cache's running K moments); false: the paper's rule. At 1/8 it found 20/20
// pass keys on Gemma 3 at 4k and 8k where the paper's rule found 4/20 and 5/20; on fresh prompts
// it is right on exactly dense's at 1k-8k (eval/results/sparq_key_spread.md).
inline constexpr ParamSpec kParams[] = {
    {"r", ParamType::kInt, kDerived, 1},
    {"k", ParamType::kInt, kDerived, 1},
    {"l", ParamType::kInt, kDerived, 0},
    {"reallocation", ParamType::kBool, 1},
    {"key_spread", ParamType::kBool, 1},
};
inline constexpr Param kR{kParams, 0}, kK{kParams, 1}, kL{kParams, 2}, kReallocation{kParams, 3},
    kKeySpread{kParams, 4};

// Parameters for one decode step at S = pos + 1 keys and head dimension d.
ref::SparqParams resolve(const AttentionPolicy& p, int32_t S, int32_t d);

// The CPU step, and whether it reads host-tier rows of kv through the hot-row cache: the r
// selected dimension rows of each host block's transposed-K tile, then its top-k rows, where the
// layout allows (cpu::sparq_reads_host_tier).
int64_t cpu_step(ThreadPool& pool, const PagedKvView& kv, const DecodeArgs& args, const AttentionPolicy& p,
                 LayerPolicyState& state);
bool cpu_reads_host_tier(const PagedKvView& kv, const AttentionPolicy& p);

extern const PolicyDef kDef;

}  // namespace fathom::sparq
