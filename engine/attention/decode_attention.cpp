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
  ref::SwaParams params = resolve_swa(p, S);
  if (st.swa_mass.empty()) params.ratio = 1.0f;
  st.swa_mass.resize(S, 0.0f);
  return params;
}

namespace {

// dst[t] = max(src[max(0, t − r) .. min(n − 1, t + r)]), the window clipped to the array.
// Small r (SWA's default pool 7 is r = 3): r passes of dst[t] = max(dst[t], src[t − k], src[t + k]),
// each a straight elementwise loop the compiler vectorises (~r·n/8 instructions). Large r: van
// Herk / Gil-Werman in O(n) whatever r — with blocks of w = 2r + 1, `ahead[i]` is the max from i's
// block start to i and `behind[i]` from i to its block end, and a full window spans at most two
// blocks, so its max is max(behind[t − r], ahead[t + r]); its running maxima do not vectorise.
// This runs every layer step over all S positions on the step's critical path.
void max_pool(const float* __restrict src, int32_t n, int32_t r, float* __restrict dst) {
  if (n <= 0) return;
  r = std::min(r, n);  // a window wider than the array is the array (and a client's pool is up to 2^31)
  if (r <= 16) {
    std::copy(src, src + n, dst);
    for (int32_t k = 1; k <= r; ++k)
      for (int32_t t = r; t + r < n; ++t) dst[t] = std::max(dst[t], std::max(src[t - k], src[t + k]));
  } else {
    // Reused per thread: two S-float vectors every layer step were an allocation each (S up to 128k).
    static thread_local std::vector<float> ahead, behind;
    ahead.resize(n);
    behind.resize(n);
    for (int32_t b = 0; b < n; b += 2 * r + 1) {
      const int32_t e = std::min(n, b + 2 * r + 1);
      float run = src[b];
      for (int32_t i = b; i < e; ++i) ahead[i] = run = std::max(run, src[i]);
      run = src[e - 1];
      for (int32_t i = e - 1; i >= b; --i) behind[i] = run = std::max(run, src[i]);
    }
    for (int32_t t = r; t + r < n; ++t) dst[t] = std::max(behind[t - r], ahead[t + r]);
  }
  // The windows cut by an end of the array, in O(n) whatever r: at the left end [0, t + r] grows by
  // one position per t (a running prefix max); at the right end [t − r, n) shrinks by one (a
  // running suffix max, filled from the end).
  float prefix = src[0];
  for (int32_t t = 0, hi = 0; t < r; ++t) {
    for (const int32_t want = std::min(n - 1, t + r); hi < want;) prefix = std::max(prefix, src[++hi]);
    dst[t] = prefix;
  }
  float suffix = src[n - 1];
  for (int32_t t = n - 1, lo = n - 1; t >= std::max(r, n - r); --t) {
    for (const int32_t want = t - r; lo > want;) suffix = std::max(suffix, src[--lo]);
    dst[t] = suffix;
  }
}

}  // namespace

const float* swa_selection_mass(const AttentionPolicy& p, LayerPolicyState& st) {
  if (p.swa_pool <= 1) return st.swa_mass.data();
  const int32_t n = static_cast<int32_t>(st.swa_mass.size());
  st.swa_pooled.resize(n);
  max_pool(st.swa_mass.data(), n, p.swa_pool / 2, st.swa_pooled.data());
  return st.swa_pooled.data();
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
    case PolicyKind::kSwa: return resolve_swa(p, S).ratio >= 1.0f;
    case PolicyKind::kAuto: return selects_every_key(resolve_auto(p), S, d);
    case PolicyKind::kDense: return true;
  }
  return true;
}

}  // namespace fathom
