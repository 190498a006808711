#include "engine/backend/cpu/cpu_policies.h"

#include <algorithm>
#include <vector>

#include "base/error.h"
#include "kernels/cpu/sparse_attention.h"

namespace fathom {
namespace {

int64_t sparq_step(ThreadPool& pool, const PagedKvView& kv, const DecodeArgs& args, const AttentionPolicy& p) {
  const int32_t S = args.pos + 1;
  std::vector<float> spread;  // [n_kv][d]: the M2 row of the moments plane, 4·d bytes per kv head
  if (p.sparq_key_spread && kv.k_moments != nullptr) spread = ref::sparq_key_spread_of_moments(kv, S);
  const int64_t spread_bytes = static_cast<int64_t>(spread.size() * sizeof(float));
  return cpu::sparq_decode(pool, kv, args, resolve_sparq(p, S, kv.head_dim), nullptr,
                           spread.empty() ? nullptr : spread.data())
             .kv_bytes +
         spread_bytes;
}

int64_t hip_step(ThreadPool& pool, const PagedKvView& kv, const DecodeArgs& args, const AttentionPolicy& p,
                 LayerPolicyState& st) {
  ref::HipBytes bytes;
  const bool refresh = hip_refresh_due(p, st);
  if (refresh) {  // estimate at this position
    st.hip_params = resolve_hip(p, args.pos + 1);
    cpu::hip_estimate_mask(pool, kv, args, st.hip_params, &st.hip_mask, &bytes);
  }
  hip_count_step(p, refresh, st);
  cpu::hip_sparse_decode(pool, kv, args, st.hip_params, st.hip_mask, &bytes);
  return bytes.total();
}

int64_t swa_step(ThreadPool& pool, const PagedKvView& kv, const DecodeArgs& args, const AttentionPolicy& p,
                 LayerPolicyState& st) {
  const int32_t S = args.pos + 1;
  const ref::SwaParams params = swa_step_params(p, st, S);
  std::vector<float> kept_weights;
  std::vector<int32_t> kept;
  const cpu::SwaResult r = cpu::swa_decode(
      pool, kv, args, params, [&] { return swa_selection_mass(p, st); }, &kept_weights, &kept);
  swa_fold_mass(st, kept, kept_weights.data(), r.k_local);
  return r.kv_bytes;
}

}  // namespace

bool cpu_implements(PolicyKind kind) {
  switch (kind) {
    case PolicyKind::kDense:
    case PolicyKind::kSparq:
    case PolicyKind::kHip:
    case PolicyKind::kSwa: return true;
    case PolicyKind::kAuto: return false;  // resolved before it reaches a backend
  }
  return false;
}

int64_t cpu_sparse_decode(ThreadPool& pool, const PagedKvView& kv, const DecodeArgs& args, const AttentionPolicy& p,
                          LayerPolicyState& state) {
  switch (p.kind) {
    case PolicyKind::kSparq: return sparq_step(pool, kv, args, p);
    case PolicyKind::kHip: return hip_step(pool, kv, args, p, state);
    case PolicyKind::kSwa: return swa_step(pool, kv, args, p, state);
    case PolicyKind::kDense:
    case PolicyKind::kAuto: break;
  }
  FATHOM_CHECK(false, "dense and auto are not sparse kernels");
  return 0;
}

}  // namespace fathom
