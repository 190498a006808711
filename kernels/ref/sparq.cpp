#include "kernels/ref/sparq.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace fathom::ref {

SparqParams sparq_params_for_ratio(double c, int32_t S, int32_t head_dim, bool reallocation) {
  SparqParams p;
  p.r = static_cast<int32_t>(std::clamp<long>(std::lround(head_dim * c), 1, head_dim));
  const long k = std::max<long>(std::lround(c * S / 2.0), std::min(kSparqMinK, S));
  p.k = static_cast<int32_t>(std::clamp<long>(k, 1, std::max(S, 1)));
  p.l = p.k / 4;
  p.reallocation = reallocation;
  return p;
}

std::vector<float> sparq_key_spread(const PagedKvView& kv, int32_t S) {
  const int32_t d = kv.head_dim;
  std::vector<float> spread(static_cast<size_t>(kv.n_kv_heads) * d), row(d);
  for (int32_t g = 0; g < kv.n_kv_heads; ++g) {
    std::vector<double> sum(d, 0.0), sq(d, 0.0);
    for (int32_t t = 0; t < S; ++t) {
      load_kv_row(kv, kv.k, t, g, row.data());
      for (int32_t c = 0; c < d; ++c) sum[c] += row[c], sq[c] += static_cast<double>(row[c]) * row[c];
    }
    for (int32_t c = 0; c < d; ++c) {
      const double mean = sum[c] / S;
      spread[static_cast<size_t>(g) * d + c] = static_cast<float>(std::sqrt(std::max(0.0, sq[c] / S - mean * mean)));
    }
  }
  return spread;
}

std::vector<float> sparq_key_spread_of_moments(const PagedKvView& kv, int32_t S) {
  const int32_t d = kv.head_dim;
  std::vector<float> spread(static_cast<size_t>(kv.n_kv_heads) * d);
  for (int32_t g = 0; g < kv.n_kv_heads; ++g) {
    const float* m2 = kv.k_moments + kv.key_moments_index(S - 1, g) + d;
    for (int32_t c = 0; c < d; ++c) spread[static_cast<size_t>(g) * d + c] = key_spread_of_m2(m2[c], S);
  }
  return spread;
}

SparqStats sparq_attention(const PagedKvView& kv, const DecodeArgs& args, const SparqParams& p,
                           const float* v_mean, const float* key_spread) {
  const int32_t d = kv.head_dim, n_kv = kv.n_kv_heads, group = args.n_heads / n_kv;
  const int32_t S = args.pos + 1;
  const int64_t elem = static_cast<int64_t>(kv_dtype_bytes(kv.dtype));
  SparqStats st;
  st.r = std::clamp(p.r < 0 ? d / 8 : p.r, 1, d);
  st.k = std::clamp(p.k, 1, S);
  st.l = std::clamp(p.l < 0 ? p.k / 4 : p.l, 1, st.k);  // ≥ 1: the current token is always kept
  st.selected.resize(n_kv);
  st.alpha.resize(args.n_heads);
  std::vector<float> krow(d), vrow(d);
  std::vector<double> approx(static_cast<size_t>(group) * S);  // [group][S] ŝ_h
  for (int32_t g = 0; g < n_kv; ++g) {
    const float* qg = args.q + static_cast<int64_t>(g) * group * d;  // [group][d]
    // Step 1: I1 = top-r of the group's summed |q| (weighted by √ of the keys' spread when given).
    std::vector<double> w(d, 1.0);
    if (key_spread != nullptr)
      for (int32_t c = 0; c < d; ++c) w[c] = std::sqrt(static_cast<double>(key_spread[static_cast<int64_t>(g) * d + c]));
    std::vector<double> a(d, 0.0);
    for (int32_t j = 0; j < group; ++j)
      for (int32_t c = 0; c < d; ++c) a[c] += std::fabs(qg[j * d + c]) * w[c];
    std::vector<int32_t> dims(d);
    std::iota(dims.begin(), dims.end(), 0);
    std::partial_sort(dims.begin(), dims.begin() + st.r, dims.end(),
                      [&](int32_t x, int32_t y) { return a[x] != a[y] ? a[x] > a[y] : x < y; });
    dims.resize(st.r);
    // Step 2: approximate logits from r components of every key, temperature-corrected.
    std::vector<double> factor(group);
    for (int32_t j = 0; j < group; ++j) {
      double l1 = 0, l1_r = 0;
      for (int32_t c = 0; c < d; ++c) l1 += std::fabs(qg[j * d + c]) * w[c];
      for (int32_t c : dims) l1_r += std::fabs(qg[j * d + c]) * w[c];
      factor[j] = args.scale * (l1_r > 0 ? std::sqrt(l1 / l1_r) : 1.0);
    }
    for (int32_t t = 0; t < S; ++t) {
      load_kv_row(kv, kv.k, t, g, krow.data());  // the reference loads the row; only r are counted
      for (int32_t j = 0; j < group; ++j) {
        double dot = 0;
        for (int32_t c : dims) dot += static_cast<double>(qg[j * d + c]) * krow[c];
        approx[j * S + t] = dot * factor[j];
      }
    }
    st.kv_bytes += static_cast<int64_t>(S) * st.r * elem;
    // Step 3: forced last-l positions by flag, the rest by group-summed ŝ.
    const int32_t first_forced = S - st.l;
    std::vector<int32_t> rest(first_forced);
    std::iota(rest.begin(), rest.end(), 0);
    std::vector<double> summed(first_forced, 0.0);
    for (int32_t t = 0; t < first_forced; ++t)
      for (int32_t j = 0; j < group; ++j) summed[t] += approx[j * S + t];
    const int32_t n_rest = st.k - st.l;
    std::nth_element(rest.begin(), rest.begin() + n_rest, rest.end(), [&](int32_t x, int32_t y) {
      return summed[x] != summed[y] ? summed[x] > summed[y] : x < y;
    });
    std::vector<int32_t>& sel = st.selected[g];
    sel.assign(rest.begin(), rest.begin() + n_rest);
    for (int32_t t = first_forced; t < S; ++t) sel.push_back(t);
    std::sort(sel.begin(), sel.end());
    // Step 4: α_h = approximate softmax mass of I2.
    for (int32_t j = 0; j < group; ++j) {
      const double* s = &approx[j * S];
      const double mx = *std::max_element(s, s + S);
      double all = 0, chosen = 0;
      for (int32_t t = 0; t < S; ++t) all += std::exp(s[t] - mx);
      for (int32_t t : sel) chosen += std::exp(s[t] - mx);
      st.alpha[g * group + j] = static_cast<float>(chosen / all);
    }
    // Step 5: exact attention over the gathered rows.
    std::vector<AttentionState> y(group);
    st.kv_bytes += partial_attention(kv, g, qg, group, args.scale, sel.data(), static_cast<int64_t>(sel.size()),
                                     y.data());
    // Step 6: mean-value reallocation.
    std::vector<double> vbar(d, 0.0);
    if (p.reallocation) {
      if (v_mean != nullptr) {
        for (int32_t c = 0; c < d; ++c) vbar[c] = v_mean[static_cast<int64_t>(g) * d + c];
        st.kv_bytes += static_cast<int64_t>(d) * 4;
      } else {
        for (int32_t t = 0; t < S; ++t) {
          load_kv_row(kv, kv.v, t, g, vrow.data());
          for (int32_t c = 0; c < d; ++c) vbar[c] += vrow[c];
        }
        for (double& x : vbar) x /= S;
        st.kv_bytes += static_cast<int64_t>(S) * d * elem;
      }
    }
    for (int32_t j = 0; j < group; ++j) {
      const double alpha = p.reallocation ? st.alpha[g * group + j] : 1.0;
      float* out = args.out + static_cast<int64_t>(g * group + j) * d;
      for (int32_t c = 0; c < d; ++c) out[c] = static_cast<float>(alpha * y[j].o[c] + (1.0 - alpha) * vbar[c]);
    }
  }
  return st;
}

}  // namespace fathom::ref
