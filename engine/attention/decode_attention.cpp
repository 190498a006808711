#include "engine/attention/decode_attention.h"

#include <algorithm>

namespace fathom {

bool layer_uses_policy(const AttentionPolicy& p, int32_t layer, bool sliding) {
  if (p.kind == PolicyKind::kDense || sliding) return false;
  return p.kind != PolicyKind::kHip || layer >= p.hip_dense_layers;
}

int64_t dense_kv_bytes(const KvLayout& kv, int64_t keys) {
  return 2 * keys * static_cast<int64_t>(kv_row_bytes(kv.dtype, kv.head_dim)) * kv.n_kv_heads;
}

ref::SwaParams swa_step_params(const AttentionPolicy& p, LayerPolicyState& st, int32_t S) {
  ref::SwaParams params = resolve_swa(p);
  if (st.swa_mass.empty()) params.ratio = 1.0f;
  st.swa_mass.resize(S, 0.0f);
  return params;
}

void swa_fold_mass(LayerPolicyState& st, const float* weights, int32_t k_local) {
  const float keep = 1.0f - 1.0f / static_cast<float>(std::max(1, k_local));
  for (size_t t = 0; t < st.swa_mass.size(); ++t) st.swa_mass[t] = st.swa_mass[t] * keep + weights[t];
}

bool selects_every_key(const AttentionPolicy& p, int32_t S, int32_t d) {
  switch (p.kind) {
    case PolicyKind::kSparq: return resolve_sparq(p, S, d).k >= S;
    case PolicyKind::kHip: {
      const ref::HipParams h = resolve_hip(p, S);
      return h.mask_k >= S - h.sink - h.window;
    }
    case PolicyKind::kSwa: return resolve_swa(p).ratio >= 1.0f;
    case PolicyKind::kDense: return true;
  }
  return true;
}

}  // namespace fathom
