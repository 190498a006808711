#include "engine/attention/policies/sparq.h"

#include <algorithm>

namespace fathom::sparq {

ref::SparqParams resolve(const AttentionPolicy& p, int32_t S, int32_t d) {
  ref::SparqParams s = ref::sparq_params_for_ratio(p.kv_read_ratio, S, d, p.flag(kReallocation));
  if (p.kv_read_ratio >= 1.0) s.k = S;  // the loosest setting selects every key
  if (p.is_set(kR)) s.r = std::min(p.integer(kR), d);
  if (p.is_set(kK)) s.k = p.integer(kK);
  if (p.is_set(kL)) s.l = p.integer(kL);
  else if (p.is_set(kK)) s.l = s.k / 4;
  return s;
}

namespace {

bool selects_every_key(const AttentionPolicy& p, int32_t S, int32_t d) { return resolve(p, S, d).k >= S; }

}  // namespace

const PolicyDef kDef{
    .name = "sparq",
    .params = kParams,
    .selects_every_key = selects_every_key,
};

}  // namespace fathom::sparq
