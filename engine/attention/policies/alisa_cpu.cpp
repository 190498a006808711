// ALISA's CPU step (kernels/cpu/swa_attention.cpp) and its mass on the host, registered in
// engine/attention/cpu_steps.cpp.
#include <algorithm>
#include <vector>

#include "base/error.h"
#include "engine/attention/policies/alisa.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/sparse_attention.h"

namespace fathom::alisa {

ref::SwaParams step_params(const AttentionPolicy& p, LayerState& st, int32_t S) {
  ref::SwaParams params = resolve(p, S);
  if (st.mass.empty()) params.ratio = 1.0f;
  st.mass.resize(S, 0.0f);
  return params;
}

const float* selection_mass(const AttentionPolicy& p, LayerState& st) {
  const int32_t radius = pool_radius(p);
  if (radius == 0) return st.mass.data();
  const int32_t n = static_cast<int32_t>(st.mass.size());
  st.pooled.resize(n);
  cpu::max_pool(st.mass.data(), n, radius, st.pooled.data());
  return st.pooled.data();
}

void fold_mass(LayerState& st, std::span<const int32_t> kept, const float* kept_weights, int32_t k_local) {
  const float keep = decay(k_local);
  cpu::scale_inplace(st.mass.data(), keep, static_cast<int64_t>(st.mass.size()));
  const int32_t S = static_cast<int32_t>(st.mass.size());
  for (size_t i = 0; i < kept.size(); ++i) {
    FATHOM_CHECK(kept[i] >= 0 && kept[i] < S, "kept position out of the mass");
    st.mass[kept[i]] += kept_weights[i];
  }
}

int64_t cpu_step(ThreadPool& pool, const PagedKvView& kv, const DecodeArgs& args, const AttentionPolicy& p,
                 LayerPolicyState& layer) {
  LayerState& st = layer_state<LayerState>(layer);
  const int32_t S = args.pos + 1;
  const ref::SwaParams params = step_params(p, st, S);
  std::vector<float> kept_weights;
  std::vector<int32_t> kept;
  const cpu::SwaResult r = cpu::swa_decode(
      pool, kv, args, params, [&] { return selection_mass(p, st); }, &kept_weights, &kept);
  fold_mass(st, kept, kept_weights.data(), r.k_local);
  return r.kv_bytes;
}

bool cpu_reads_host_tier(const PagedKvView&, const AttentionPolicy&) { return true; }  // gathers rows

}  // namespace fathom::alisa
