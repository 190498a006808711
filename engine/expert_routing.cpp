#include "engine/expert_routing.h"

#include <algorithm>
#include <cmath>

#include "base/error.h"

namespace fathom {

void route_tokens(const float* logits, int64_t tokens, int32_t experts, int32_t used, ExpertRouting& out) {
  FATHOM_CHECK(experts > 0 && used > 0 && used <= experts);
  out.tokens = tokens;
  out.experts = experts;
  out.used = used;
  const int64_t pairs = tokens * used;
  std::vector<int32_t> chosen(pairs);  // (tokens, used) expert of each slot
  std::vector<float> weight(pairs);
  std::vector<float> p(experts);
  std::vector<int32_t> order(experts);
  for (int64_t t = 0; t < tokens; ++t) {
    const float* l = logits + t * experts;
    const float mx = *std::max_element(l, l + experts);
    float sum = 0;
    for (int32_t e = 0; e < experts; ++e) sum += p[e] = std::exp(l[e] - mx);
    for (int32_t e = 0; e < experts; ++e) p[e] /= sum;
    for (int32_t e = 0; e < experts; ++e) order[e] = e;
    std::partial_sort(order.begin(), order.begin() + used, order.end(),
                      [&](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    float top = 0;
    for (int32_t j = 0; j < used; ++j) top += p[order[j]];
    for (int32_t j = 0; j < used; ++j) {
      chosen[t * used + j] = order[j];
      weight[t * used + j] = p[order[j]] / top;
    }
  }
  // Counting sort of the pairs by expert (stable: tokens ascending within an expert).
  out.expert_begin.assign(experts + 1, 0);
  for (const int32_t e : chosen) ++out.expert_begin[e + 1];
  for (int32_t e = 0; e < experts; ++e) out.expert_begin[e + 1] += out.expert_begin[e];
  std::vector<int32_t> next(out.expert_begin.begin(), out.expert_begin.end() - 1);
  out.pair_token.resize(pairs);
  out.pair_weight.resize(pairs);
  out.token_pair.resize(pairs);
  for (int64_t i = 0; i < pairs; ++i) {
    const int32_t p_at = next[chosen[i]]++;
    out.pair_token[p_at] = static_cast<int32_t>(i / used);
    out.pair_weight[p_at] = weight[i];
    out.token_pair[i] = p_at;
  }
}

}  // namespace fathom
