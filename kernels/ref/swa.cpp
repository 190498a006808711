#include "kernels/ref/swa.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace fathom::ref {

SwaSizes swa_sizes(int32_t n, float ratio) {
  const int64_t budget = static_cast<int64_t>(std::floor(static_cast<double>(n) * ratio));
  SwaSizes z;
  z.k_local = static_cast<int32_t>(std::clamp<int64_t>(budget / 2, 1, n));
  z.k_global = static_cast<int32_t>(std::clamp<int64_t>(budget - z.k_local, 0, n - z.k_local));
  return z;
}

SwaStats swa_select(int32_t n, float ratio, const float* mass) {
  const SwaSizes z = swa_sizes(n, ratio);
  SwaStats st;
  st.k_local = z.k_local;
  st.k_global = z.k_global;
  const int32_t older = n - st.k_local;
  std::vector<int32_t> cand(older);
  std::iota(cand.begin(), cand.end(), 0);
  std::nth_element(cand.begin(), cand.begin() + st.k_global, cand.end(), [&](int32_t x, int32_t y) {
    return mass[x] != mass[y] ? mass[x] > mass[y] : x < y;
  });
  st.kept.assign(cand.begin(), cand.begin() + st.k_global);
  for (int32_t t = older; t < n; ++t) st.kept.push_back(t);
  std::sort(st.kept.begin(), st.kept.end());
  return st;
}

SwaStats swa_attention(const PagedKvView& kv, const DecodeArgs& args, const SwaParams& p, const float* mass) {
  const int32_t d = kv.head_dim, group = args.n_heads / kv.n_kv_heads;
  SwaStats st = swa_select(args.pos + 1, p.ratio, mass);
  std::vector<AttentionState> part(group);
  for (int32_t g = 0; g < kv.n_kv_heads; ++g) {
    st.kv_bytes += partial_attention(kv, g, args.q + static_cast<int64_t>(g) * group * d, group, args.scale,
                                     st.kept.data(), static_cast<int64_t>(st.kept.size()), part.data());
    for (int32_t j = 0; j < group; ++j)
      std::copy(part[j].o.begin(), part[j].o.end(), args.out + static_cast<int64_t>(g * group + j) * d);
  }
  return st;
}

}  // namespace fathom::ref
