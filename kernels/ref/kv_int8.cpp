#include "kernels/ref/kv_int8.h"

#include <algorithm>
#include <cmath>

namespace fathom::ref {

void kv_int8_quantize(const float* x, int64_t n, int32_t group_size, uint8_t* q, Int8Group* groups) {
  for (int64_t g0 = 0, gi = 0; g0 < n; g0 += group_size, ++gi) {
    const int64_t len = std::min<int64_t>(group_size, n - g0);
    const auto [lo, hi] = std::minmax_element(x + g0, x + g0 + len);
    Int8Group& grp = groups[gi];
    grp.min = *lo;
    grp.scale = (*hi - *lo) / 255.0f;
    for (int64_t i = 0; i < len; ++i) {
      // (x − min)/λ = x/λ + z; computed from the difference so it lies in [0, 255] up to rounding.
      const float v = grp.scale > 0.0f ? std::nearbyint((x[g0 + i] - grp.min) / grp.scale) : 0.0f;
      q[g0 + i] = static_cast<uint8_t>(std::clamp(v, 0.0f, 255.0f));
    }
  }
}

void kv_int8_dequantize(const uint8_t* q, const Int8Group* groups, int64_t n, int32_t group_size, float* x) {
  for (int64_t i = 0; i < n; ++i) {
    const Int8Group& grp = groups[i / group_size];
    x[i] = grp.scale * static_cast<float>(q[i]) + grp.min;
  }
}

int64_t kv_int8_bytes(int64_t n, int32_t group_size) {
  return n + (n + group_size - 1) / group_size * static_cast<int64_t>(sizeof(Int8Group));
}

}  // namespace fathom::ref
