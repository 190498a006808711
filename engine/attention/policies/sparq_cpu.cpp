// SparQ's CPU step (kernels/cpu/sparq_attention.cpp), registered in engine/attention/cpu_steps.cpp.
#include <vector>

#include "engine/attention/policies/sparq.h"
#include "kernels/cpu/sparse_attention.h"

namespace fathom::sparq {

int64_t cpu_step(ThreadPool& pool, const PagedKvView& kv, const DecodeArgs& args, const AttentionPolicy& p,
                 LayerPolicyState&) {
  const int32_t S = args.pos + 1;
  std::vector<float> spread;  // [n_kv][d]: the M2 row of the moments plane, 4·d bytes per kv head
  if (p.flag(kKeySpread) && kv.k_moments != nullptr) spread = ref::sparq_key_spread_of_moments(kv, S);
  const int64_t spread_bytes = static_cast<int64_t>(spread.size() * sizeof(float));
  return cpu::sparq_decode(pool, kv, args, resolve(p, S, kv.head_dim), nullptr,
                           spread.empty() ? nullptr : spread.data())
             .kv_bytes +
         spread_bytes;
}

// It reads the r selected dimension rows of each host block's transposed-K tile from the host
// tier, then its top-k rows through the hot-row cache, where the layout allows.
bool cpu_reads_host_tier(const PagedKvView& kv, const AttentionPolicy& p) {
  return cpu::sparq_reads_host_tier(kv, p.flag(kReallocation));
}

}  // namespace fathom::sparq
