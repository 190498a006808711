#pragma once
// The decode policies with a CPU step (engine/attention/policies/<name>_cpu.cpp): one line each
// in cpu_steps.cpp. The CPU backend runs these; a registered policy without one is reported
// unimplemented there.
#include <cstdint>

#include "engine/attention/policy.h"
#include "engine/attention/policy_state.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/paged_kv.h"

namespace fathom {

struct CpuPolicyStep {
  const char* name;  // the registered policy's canonical name
  // One decode query of one layer (kernels/cpu), updating `state`; returns the KV bytes read.
  // args: one query at args.pos; selects_every_key is false.
  int64_t (*step)(ThreadPool&, const PagedKvView&, const DecodeArgs&, const AttentionPolicy&, LayerPolicyState&);
  // Whether the step can read host-tier rows of `kv` through the hot-row cache (else the backend
  // runs such a step densely over both tiers).
  bool (*reads_host_tier)(const PagedKvView& kv, const AttentionPolicy&);
};

// The CPU step of policy k, or null.
const CpuPolicyStep* cpu_step_of(PolicyKind k);

}  // namespace fathom
