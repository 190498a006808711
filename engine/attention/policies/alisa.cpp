#include "engine/attention/policies/alisa.h"

#include <algorithm>

namespace fathom::alisa {

ref::SwaParams resolve(const AttentionPolicy& p, int32_t S) {
  ref::SwaParams s;
  if (p.is_set(kRatio)) {
    s.ratio = static_cast<float>(p.number(kRatio));
  } else {
    const double floor = std::min(1.0, static_cast<double>(kMinKept) / std::max(S, 1));
    s.ratio = static_cast<float>(std::max(p.kv_read_ratio, floor));
  }
  return s;
}

int32_t pool_radius(const AttentionPolicy& p) { return p.integer(kPool) <= 1 ? 0 : p.integer(kPool) / 2; }

float decay(int32_t k_local) { return 1.0f - 1.0f / static_cast<float>(std::max(1, k_local)); }

namespace {

bool selects_every_key(const AttentionPolicy& p, int32_t S, int32_t) { return resolve(p, S).ratio >= 1.0f; }

double probe_ratio(const AttentionPolicy& p) { return p.is_set(kRatio) ? p.number(kRatio) : p.kv_read_ratio; }

}  // namespace

const PolicyDef kDef{
    .name = "alisa",
    .alias = "swa",
    .params = kParams,
    .selects_every_key = selects_every_key,
    .probe_ratio = probe_ratio,
    .hot_row_series = true,
};

}  // namespace fathom::alisa
