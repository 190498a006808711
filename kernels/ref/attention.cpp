#include "kernels/ref/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/ref/attention_state.h"
#include "kernels/ref/dequant.h"

namespace fathom::ref {
namespace {

// Element i (an element offset into a layer's K or V) as f32. An INT8 row's parameters sit at
// index i / head_dim (row offsets are multiples of head_dim).
float load(const PagedKvView& kv, const void* base, int64_t i) {
  switch (kv.dtype) {
    case KvDtype::kF32: return static_cast<const float*>(base)[i];
    case KvDtype::kF16: return fp16_to_fp32(static_cast<const uint16_t*>(base)[i]);
    case KvDtype::kI8: {
      const KvInt8Row& r = (base == kv.k ? kv.k_rows : kv.v_rows)[i / kv.head_dim];
      return r.scale * static_cast<float>(static_cast<const uint8_t*>(base)[i]) + r.min;
    }
  }
  return 0.0f;
}

}  // namespace

void paged_attention(const PagedKvView& kv, const AttentionArgs& a) {
  const int32_t d = kv.head_dim, group = a.n_heads / kv.n_kv_heads;
  std::vector<double> logits;
  for (int32_t i = 0; i < a.n_q; ++i) {
    const int32_t pos = a.pos0 + i;
    const int32_t lo = a.window > 0 ? std::max(0, pos - a.window + 1) : 0;
    for (int32_t h = 0; h < a.n_heads; ++h) {
      const int32_t g = h / group;
      const float* q = a.q + (static_cast<int64_t>(i) * a.n_heads + h) * d;
      logits.assign(pos - lo + 1, 0.0);
      double max_logit = -INFINITY;
      for (int32_t t = lo; t <= pos; ++t) {
        const int64_t base = kv.tile_offset(t / kv.block_size, g) + static_cast<int64_t>(t % kv.block_size) * d;
        double s = 0;
        for (int32_t c = 0; c < d; ++c) s += static_cast<double>(q[c]) * load(kv, kv.k, base + c);
        logits[t - lo] = reference_logit(s, a.logit_scale());
        max_logit = std::max(max_logit, logits[t - lo]);
      }
      double denom = 0;
      for (double& l : logits) denom += (l = std::exp(l - max_logit));
      if (a.sinks != nullptr) denom += std::exp(static_cast<double>(a.sinks[h]) - max_logit);
      float* out = a.out + (static_cast<int64_t>(i) * a.n_heads + h) * d;
      for (int32_t c = 0; c < d; ++c) {
        double acc = 0;
        for (int32_t t = lo; t <= pos; ++t) {
          const int64_t base = kv.tile_offset(t / kv.block_size, g) + static_cast<int64_t>(t % kv.block_size) * d;
          acc += logits[t - lo] * load(kv, kv.v, base + c);
        }
        out[c] = static_cast<float>(acc / denom);
      }
    }
  }
}

}  // namespace fathom::ref
