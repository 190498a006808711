#include "engine/attention/decode_attention.h"

#include <algorithm>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/sparse_attention.h"

namespace fathom {

bool layer_uses_policy(const AttentionPolicy& p, int32_t layer, bool sliding) {
  if (p.kind == PolicyKind::kDense || sliding) return false;
  return p.kind != PolicyKind::kHip || layer >= p.hip_dense_layers;
}

int64_t dense_kv_bytes(const PagedKvView& kv, int64_t keys) {
  return 2 * keys * static_cast<int64_t>(kv_row_bytes(kv.dtype, kv.head_dim)) * kv.n_kv_heads;
}

namespace {

int64_t hip_step(ThreadPool& pool, const PagedKvView& kv, const DecodeArgs& args, const AttentionPolicy& p,
                 LayerPolicyState& st) {
  ref::HipBytes bytes;
  if (st.hip_age < 0 || st.hip_age + 1 >= p.hip_refresh) {  // refresh: estimate at this position
    st.hip_params = resolve_hip(p, args.pos + 1);
    cpu::hip_estimate_mask(pool, kv, args, st.hip_params, &st.hip_mask, &bytes);
    st.hip_age = 0;
  } else {
    ++st.hip_age;
  }
  cpu::hip_sparse_decode(pool, kv, args, st.hip_params, st.hip_mask, &bytes);
  return bytes.total();
}

// ALISA keeps the tokens with the largest attention mass "summed over the last k steps"; an
// exponential decay with horizon k (the local window) stands in for the exact sliding sum, which
// would need k past weight vectors. The first step has no history: it attends densely (ratio 1)
// to seed the mass.
int64_t swa_step(ThreadPool& pool, const PagedKvView& kv, const DecodeArgs& args, const AttentionPolicy& p,
                 LayerPolicyState& st) {
  const int32_t S = args.pos + 1;
  const bool seeded = !st.swa_mass.empty();
  st.swa_mass.resize(S, 0.0f);
  ref::SwaParams params = resolve_swa(p);
  if (!seeded) params.ratio = 1.0f;
  std::vector<float> weights(S, 0.0f);
  const cpu::SwaResult r = cpu::swa_decode(pool, kv, args, params, st.swa_mass.data(), weights.data());
  const float keep = 1.0f - 1.0f / static_cast<float>(std::max(1, r.k_local));
  for (int32_t t = 0; t < S; ++t) st.swa_mass[t] = st.swa_mass[t] * keep + weights[t];
  return r.kv_bytes;
}

// True when the policy would select every one of the S keys: the step is dense attention and
// runs the dense kernel — the output is then exactly dense (one kernel's rounding, not the
// gather kernels'), and no selection work is spent. HiP's mask state is left alone: it is
// estimated at the first step whose selection is partial (hip_age < 0).
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

}  // namespace

int64_t decode_attention(ThreadPool& pool, const PagedKvView& kv, const DecodeArgs& args, const AttentionPolicy& p,
                         LayerPolicyState& state) {
  switch (selects_every_key(p, args.pos + 1, kv.head_dim) ? PolicyKind::kDense : p.kind) {
    case PolicyKind::kSparq:
      return cpu::sparq_decode(pool, kv, args, resolve_sparq(p, args.pos + 1, kv.head_dim)).kv_bytes;
    case PolicyKind::kHip: return hip_step(pool, kv, args, p, state);
    case PolicyKind::kSwa: return swa_step(pool, kv, args, p, state);
    case PolicyKind::kDense: break;
  }
  const AttentionArgs a{args.q, args.out, 1, args.n_heads, args.pos, 0, args.scale};
  cpu::paged_attention(pool, kv, a);
  return dense_kv_bytes(kv, args.pos + 1);
}

}  // namespace fathom
