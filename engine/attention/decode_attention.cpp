#include "engine/attention/decode_attention.h"

#include <algorithm>

#include "base/error.h"
#include "kernels/cpu/ops.h"

namespace fathom {

bool layer_uses_policy(const AttentionPolicy& p, int32_t layer, bool sliding) {
  if (p.kind == PolicyKind::kDense || sliding) return false;
  return p.kind != PolicyKind::kHip || layer >= p.hip_dense_layers;
}

int64_t dense_kv_bytes(const KvLayout& kv, int64_t keys) {
  return 2 * keys * static_cast<int64_t>(kv_row_bytes(kv.dtype, kv.head_dim)) * kv.n_kv_heads;
}

ref::SwaParams swa_step_params(const AttentionPolicy& p, LayerPolicyState& st, int32_t S) {
  ref::SwaParams params = resolve_swa(p, S);
  if (st.swa_mass.empty()) params.ratio = 1.0f;
  st.swa_mass.resize(S, 0.0f);
  return params;
}

int32_t swa_pool_radius(const AttentionPolicy& p) { return p.swa_pool <= 1 ? 0 : p.swa_pool / 2; }

const float* swa_selection_mass(const AttentionPolicy& p, LayerPolicyState& st) {
  const int32_t radius = swa_pool_radius(p);
  if (radius == 0) return st.swa_mass.data();
  const int32_t n = static_cast<int32_t>(st.swa_mass.size());
  st.swa_pooled.resize(n);
  cpu::max_pool(st.swa_mass.data(), n, radius, st.swa_pooled.data());
  return st.swa_pooled.data();
}

float swa_decay(int32_t k_local) { return 1.0f - 1.0f / static_cast<float>(std::max(1, k_local)); }

void swa_fold_mass(LayerPolicyState& st, std::span<const int32_t> kept, const float* kept_weights, int32_t k_local) {
  const float keep = swa_decay(k_local);
  cpu::scale_inplace(st.swa_mass.data(), keep, static_cast<int64_t>(st.swa_mass.size()));
  const int32_t S = static_cast<int32_t>(st.swa_mass.size());
  for (size_t i = 0; i < kept.size(); ++i) {
    FATHOM_CHECK(kept[i] >= 0 && kept[i] < S, "kept position out of the mass");
    st.swa_mass[kept[i]] += kept_weights[i];
  }
}

bool hip_refresh_due(const AttentionPolicy& p, const LayerPolicyState& st) {
  return st.hip_age < 0 || st.hip_age + 1 >= p.hip_refresh;
}

void hip_count_step(const AttentionPolicy& p, bool estimated, LayerPolicyState& st) {
  if (!estimated) ++st.hip_age;
  else st.hip_age = st.hip_age < 0 ? st.hip_turn % std::max(1, p.hip_refresh) : 0;
}

bool selects_every_key(const AttentionPolicy& p, int32_t S, int32_t d) {
  switch (p.kind) {
    case PolicyKind::kSparq: return resolve_sparq(p, S, d).k >= S;
    case PolicyKind::kHip: {
      const ref::HipParams h = resolve_hip(p, S);
      return h.mask_k >= S - h.sink - h.window;
    }
    case PolicyKind::kSwa: return resolve_swa(p, S).ratio >= 1.0f;
    case PolicyKind::kAuto: return selects_every_key(resolve_auto(p), S, d);
    case PolicyKind::kDense: return true;
  }
  return true;
}

}  // namespace fathom
