#include "engine/attention/policies/hip.h"

#include <algorithm>
#include <cmath>

namespace fathom::hip {

ref::HipParams resolve(const AttentionPolicy& p, int32_t S) {
  ref::HipParams h;
  h.block_size_k = p.integer(kBlockSizeK);
  h.per_kv_head = p.flag(kPerKvHead);
  const int64_t budget = static_cast<int64_t>(std::ceil(p.kv_read_ratio * S));
  h.sink = p.is_set(kSink) ? p.integer(kSink) : static_cast<int32_t>(std::min<int64_t>(16, budget / 16));
  h.window = p.is_set(kWindow) ? p.integer(kWindow) : static_cast<int32_t>(std::min<int64_t>(256, budget / 4));
  if (p.is_set(kMaskK)) {
    h.mask_k = p.integer(kMaskK);
  } else if (budget >= S) {
    h.mask_k = std::max(S, h.block_size_k);  // T′ < S ≤ mask_k: dense
  } else {
    const int64_t rest = std::max<int64_t>(budget - h.sink - h.window, h.block_size_k);
    h.mask_k = static_cast<int32_t>(rest / h.block_size_k * h.block_size_k);
  }
  return h;
}

bool refresh_due(const AttentionPolicy& p, const LayerState& st) {
  return st.age < 0 || st.age + 1 >= p.integer(kRefresh);
}

void count_step(const AttentionPolicy& p, bool estimated, int32_t rank, LayerState& st) {
  if (!estimated) ++st.age;
  else st.age = st.age < 0 ? std::max(rank, 0) % std::max(1, p.integer(kRefresh)) : 0;
}

namespace {

// HiP's mask is left alone by a dense step: it is estimated at the first step whose selection is
// partial (age < 0).
bool selects_every_key(const AttentionPolicy& p, int32_t S, int32_t) {
  const ref::HipParams h = resolve(p, S);
  return h.mask_k >= S - h.sink - h.window;
}

int32_t dense_layers(const AttentionPolicy& p) { return p.integer(kDenseLayers); }

void probe_params(const AttentionPolicy& p, AttentionPolicy& probe) {
  probe.set(kPerKvHead, p.flag(kPerKvHead));
  // The largest power of two <= refresh, at most the default's: a shorter refresh re-estimates
  // more often, so its break-even is the conservative one.
  const int32_t cap = std::min(p.integer(kRefresh), static_cast<int32_t>(kParams[kRefresh.index].initial));
  int32_t refresh = 1;
  while (refresh * 2 <= cap) refresh *= 2;
  probe.set(kRefresh, refresh);
}

// A measurement covers a whole refresh period (its estimate and the steps that reuse the mask).
int32_t measure_steps(const AttentionPolicy& p) { return std::max(8, p.integer(kRefresh)); }

}  // namespace

const PolicyDef kDef{
    .name = "hip",
    .params = kParams,
    .selects_every_key = selects_every_key,
    .dense_layers = dense_layers,
    .probe_params = probe_params,
    .measure_steps = measure_steps,
    .hot_row_series = true,
};

}  // namespace fathom::hip
