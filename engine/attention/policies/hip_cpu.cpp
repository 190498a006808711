// HiP's CPU step (kernels/cpu/hip_attention.cpp), registered in engine/attention/cpu_steps.cpp.
#include "engine/attention/policies/hip.h"
#include "kernels/cpu/sparse_attention.h"

namespace fathom::hip {

int64_t cpu_step(ThreadPool& pool, const PagedKvView& kv, const DecodeArgs& args, const AttentionPolicy& p,
                 LayerPolicyState& layer) {
  LayerState& st = layer_state<LayerState>(layer);
  ref::HipBytes bytes;
  const bool refresh = refresh_due(p, st);
  if (refresh) {  // estimate at this position
    st.params = resolve(p, args.pos + 1);
    cpu::hip_estimate_mask(pool, kv, args, st.params, &st.mask, &bytes);
  }
  count_step(p, refresh, layer.rank, st);
  cpu::hip_sparse_decode(pool, kv, args, st.params, st.mask, &bytes);
  return bytes.total();
}

bool cpu_reads_host_tier(const PagedKvView&, const AttentionPolicy&) { return true; }  // gathers rows

}  // namespace fathom::hip
