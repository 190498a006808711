#include "engine/attention/policy.h"

#include <algorithm>
#include <cmath>

#include "base/error.h"

namespace fathom {

const char* policy_name(PolicyKind k) {
  switch (k) {
    case PolicyKind::kDense: return "dense";
    case PolicyKind::kSparq: return "sparq";
    case PolicyKind::kHip: return "hip";
    case PolicyKind::kSwa: return "swa";
    case PolicyKind::kAuto: return "auto";
  }
  return "?";
}

PolicyKind parse_policy_name(const std::string& name) {
  for (int i = 0; i < kPolicyKinds; ++i)
    if (name == policy_name(static_cast<PolicyKind>(i))) return static_cast<PolicyKind>(i);
  throw Error("unknown attention policy '" + name + "' (available: dense, sparq, hip, swa, auto)");
}

void AttentionPolicy::validate() const {
  auto positive_or_unset = [](int32_t v, const char* what) {
    if (v != -1 && v < 1) throw Error(std::string(what) + " must be a positive integer");
  };
  if (!(kv_read_ratio > 0.0 && kv_read_ratio <= 1.0)) throw Error("kv_read_ratio must be in (0, 1]");
  positive_or_unset(sparq_r, "sparq r");
  positive_or_unset(sparq_k, "sparq k");
  if (sparq_l != -1 && sparq_l < 0) throw Error("sparq l must be >= 0");
  positive_or_unset(hip_mask_k, "hip mask_k");
  if (hip_sink != -1 && hip_sink < 0) throw Error("hip sink must be >= 0");
  if (hip_window != -1 && hip_window < 0) throw Error("hip window must be >= 0");
  if (hip_block_size_k < 1) throw Error("hip block_size_k must be >= 1");
  if (hip_refresh < 1) throw Error("hip refresh must be >= 1");
  if (hip_dense_layers < 0) throw Error("hip dense_layers must be >= 0");
  if (swa_ratio != -1 && !(swa_ratio > 0.0 && swa_ratio <= 1.0)) throw Error("swa ratio must be in (0, 1]");
  if (swa_pool < 1 || swa_pool % 2 == 0) throw Error("swa pool must be a positive odd integer");
  if (min_keys < kMeasuredBreakEven) throw Error("min_keys must be >= 0 or \"measured\"");
}

ref::SparqParams resolve_sparq(const AttentionPolicy& p, int32_t S, int32_t d) {
  ref::SparqParams s = ref::sparq_params_for_ratio(p.kv_read_ratio, S, d, p.sparq_reallocation);
  if (p.kv_read_ratio >= 1.0) s.k = S;  // the loosest setting selects every key
  if (p.sparq_r > 0) s.r = std::min(p.sparq_r, d);
  if (p.sparq_k > 0) s.k = p.sparq_k;
  if (p.sparq_l >= 0) s.l = p.sparq_l;
  else if (p.sparq_k > 0) s.l = s.k / 4;
  return s;
}

ref::HipParams resolve_hip(const AttentionPolicy& p, int32_t S) {
  ref::HipParams h;
  h.block_size_k = p.hip_block_size_k;
  h.per_kv_head = p.hip_per_kv_head;
  const int64_t budget = static_cast<int64_t>(std::ceil(p.kv_read_ratio * S));
  h.sink = p.hip_sink >= 0 ? p.hip_sink : static_cast<int32_t>(std::min<int64_t>(16, budget / 16));
  h.window = p.hip_window >= 0 ? p.hip_window : static_cast<int32_t>(std::min<int64_t>(256, budget / 4));
  if (p.hip_mask_k > 0) {
    h.mask_k = p.hip_mask_k;
  } else if (budget >= S) {
    h.mask_k = std::max(S, h.block_size_k);  // T′ < S ≤ mask_k: dense
  } else {
    const int64_t rest = std::max<int64_t>(budget - h.sink - h.window, h.block_size_k);
    h.mask_k = static_cast<int32_t>(rest / h.block_size_k * h.block_size_k);
  }
  return h;
}

ref::SwaParams resolve_swa(const AttentionPolicy& p, int32_t S) {
  ref::SwaParams s;
  if (p.swa_ratio > 0) {
    s.ratio = static_cast<float>(p.swa_ratio);
  } else {
    const double floor = std::min(1.0, static_cast<double>(kSwaMinKept) / std::max(S, 1));
    s.ratio = static_cast<float>(std::max(p.kv_read_ratio, floor));
  }
  return s;
}

AttentionPolicy resolve_auto(const AttentionPolicy& p) {
  if (p.kind != PolicyKind::kAuto) return p;
  AttentionPolicy chosen = p;
  chosen.kind = PolicyKind::kSwa;
  return chosen;
}

AttentionPolicy break_even_probe(const AttentionPolicy& p) {
  const double ratio = p.kind == PolicyKind::kSwa && p.swa_ratio > 0 ? p.swa_ratio : p.kv_read_ratio;
  AttentionPolicy probe;
  probe.kind = p.kind;
  // Up to a power of two to 1/8, then to a multiple of 1/8: eleven buckets (1/64 ... 1/8, 1/4,
  // 3/8, ... 1). With powers of two only, 3/8 was probed at 1/2, where SWA is about dense's speed
  // (SmolLM2 8k keys: 283 vs 292 us a layer), so a 3/8 request's break-even came out "never" in
  // some start-ups although 3/8 measures 1.3x dense at 8k (bench_decode).
  probe.kv_read_ratio = 1.0 / 64;
  while (probe.kv_read_ratio < ratio && probe.kv_read_ratio < 0.125) probe.kv_read_ratio *= 2;
  if (ratio > 0.125) probe.kv_read_ratio = std::min(1.0, std::ceil(ratio * 8 - 1e-9) / 8);
  if (p.kind == PolicyKind::kHip) {
    probe.hip_per_kv_head = p.hip_per_kv_head;
    // The largest power of two <= refresh, at most the default's: a shorter refresh re-estimates
    // more often, so its break-even is the conservative one.
    const int32_t cap = std::min(p.hip_refresh, AttentionPolicy{}.hip_refresh);
    probe.hip_refresh = 1;
    while (probe.hip_refresh * 2 <= cap) probe.hip_refresh *= 2;
  }
  return probe;
}

bool same_break_even_probe(const AttentionPolicy& a, const AttentionPolicy& b) {
  return a.kind == b.kind && a.kv_read_ratio == b.kv_read_ratio && a.hip_per_kv_head == b.hip_per_kv_head &&
         a.hip_refresh == b.hip_refresh;
}

}  // namespace fathom
