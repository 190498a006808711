#include "engine/backend/cpu/cpu_policies.h"

#include "base/error.h"
#include "engine/attention/cpu_steps.h"

namespace fathom {

bool cpu_implements(PolicyKind kind) { return kind == kDensePolicy || cpu_step_of(kind) != nullptr; }

int64_t cpu_sparse_decode(ThreadPool& pool, const PagedKvView& kv, const DecodeArgs& args, const AttentionPolicy& p,
                          LayerPolicyState& state) {
  const CpuPolicyStep* s = cpu_step_of(p.kind);
  FATHOM_CHECK(s != nullptr, "a policy without a CPU step reached the CPU backend");
  return s->step(pool, kv, args, p, state);
}

bool cpu_reads_host_tier(const PagedKvView& kv, const AttentionPolicy& p) {
  const CpuPolicyStep* s = cpu_step_of(p.kind);
  return s != nullptr && s->reads_host_tier(kv, p);
}

}  // namespace fathom
