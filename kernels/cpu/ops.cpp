#include "kernels/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <cstring>
#include <vector>

#include "kernels/cpu/ops_avx512.h"
#include "kernels/cpu/matmul.h"
#include "kernels/ref/dequant.h"

namespace fathom::cpu {
namespace {
bool use_avx512() { return std::strcmp(simd_level(), "avx512") == 0; }  // follows set_simd_level_for_testing
}  // namespace

void rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps) {
  if (use_avx512()) return rms_norm_avx512(x, w, y, rows, n, eps);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
    for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * inv * w[i];
  }
}

void rope_table(const int32_t* pos, int64_t n_tokens, int32_t rope_dim, const double* inv_freq, float mscale,
                float* cos_out, float* sin_out) {
  const int32_t half = rope_dim / 2;
  for (int64_t t = 0; t < n_tokens; ++t) {
    const double p = static_cast<double>(pos[t]);
    for (int32_t i = 0; i < half; ++i) {
      const double angle = p * inv_freq[i];
      cos_out[t * half + i] = static_cast<float>(mscale * std::cos(angle));
      sin_out[t * half + i] = static_cast<float>(mscale * std::sin(angle));
    }
  }
}

void rope_table(const int32_t* pos, int64_t n_tokens, int32_t rope_dim, float base, float scale, float* cos_out,
                float* sin_out) {
  std::vector<double> inv_freq(rope_dim / 2);
  for (int32_t i = 0; i < rope_dim / 2; ++i)
    inv_freq[i] = std::pow(static_cast<double>(base), -2.0 * i / rope_dim) / scale;
  rope_table(pos, n_tokens, rope_dim, inv_freq.data(), 1.0f, cos_out, sin_out);
}

void rope_apply(float* x, int64_t n_tokens, int32_t n_heads, int32_t head_dim, int32_t rope_dim, bool neox,
                const float* cos_t, const float* sin_t) {
  const int32_t half = rope_dim / 2;
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* c = cos_t + t * half;
    const float* s = sin_t + t * half;
    for (int32_t h = 0; h < n_heads; ++h) {
      float* v = x + (t * n_heads + h) * head_dim;
      for (int32_t i = 0; i < half; ++i) {
        const int32_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        const float x0 = v[a], x1 = v[b];
        v[a] = x0 * c[i] - x1 * s[i];
        v[b] = x0 * s[i] + x1 * c[i];
      }
    }
  }
}

void silu_mul(float* gate, const float* up, int64_t n) {
  if (use_avx512()) return silu_mul_avx512(gate, up, n);
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    gate[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void gelu_tanh_mul(float* gate, const float* up, int64_t n) {
  if (use_avx512()) return gelu_tanh_mul_avx512(gate, up, n);
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    gate[i] = 0.5f * g * (1.0f + std::tanh(kSqrt2OverPi * (g + 0.044715f * g * g * g))) * up[i];
  }
}

void swiglu_oai_mul(float* gate, const float* up, int64_t n) {
  constexpr float kAlpha = 1.702f, kLimit = 7.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float g = std::min(gate[i], kLimit), u = std::clamp(up[i], -kLimit, kLimit);
    gate[i] = (u + 1.0f) * (g / (1.0f + std::exp(-kAlpha * g)));
  }
}

double exp_scaled_inplace(float* x, int64_t n, float shift, float scale) {
  if (use_avx512()) return exp_scaled_inplace_avx512(x, n, shift, scale);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += x[i] = std::exp((x[i] - shift) * scale);
  return sum;
}

double sum_exp(const float* x, int64_t n, float shift) {
  if (use_avx512()) return sum_exp_avx512(x, n, shift);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(x[i] - shift);
  return sum;
}

void add_inplace(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void scale_inplace(float* y, float alpha, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] *= alpha;
}

// Small r (SWA's default pool 7 is r = 3): AVX-512 one pass of 2r + 1 loads per 16 outputs, else
// r passes of dst[t] = max(dst[t], src[t − k], src[t + k]), each a straight elementwise loop the
// compiler vectorises. Large r: van Herk / Gil-Werman in O(n) whatever r — with blocks of
// w = 2r + 1, `ahead[i]` is the max from i's block start to i and `behind[i]` from i to its block
// end, and a full window spans at most two blocks, so its max is max(behind[t − r], ahead[t + r]).
// SWA runs this every layer step over all S positions on the step's critical path (~6.5 us for
// 8k positions the scalar way, ~1 us with AVX-512).
void max_pool(const float* __restrict src, int32_t n, int32_t r, float* __restrict dst) {
  if (n <= 0) return;
  r = std::min(r, n);  // a window wider than the array is the array (and a client's pool is up to 2^31)
  if (r <= 16 && use_avx512() && n >= 2 * r + 1) {
    max_pool_interior_avx512(src, n, r, dst);
  } else if (r <= 16) {
    std::copy(src, src + n, dst);
    for (int32_t k = 1; k <= r; ++k)
      for (int32_t t = r; t + r < n; ++t) dst[t] = std::max(dst[t], std::max(src[t - k], src[t + k]));
  } else {
    // Reused per thread: two S-float vectors every layer step were an allocation each (S up to 128k).
    static thread_local std::vector<float> ahead, behind;
    ahead.resize(n);
    behind.resize(n);
    for (int32_t b = 0; b < n; b += 2 * r + 1) {
      const int32_t e = std::min(n, b + 2 * r + 1);
      float run = src[b];
      for (int32_t i = b; i < e; ++i) ahead[i] = run = std::max(run, src[i]);
      run = src[e - 1];
      for (int32_t i = e - 1; i >= b; --i) behind[i] = run = std::max(run, src[i]);
    }
    for (int32_t t = r; t + r < n; ++t) dst[t] = std::max(behind[t - r], ahead[t + r]);
  }
  // The windows cut by an end of the array, in O(n) whatever r: at the left end [0, t + r] grows by
  // one position per t (a running prefix max); at the right end [t − r, n) shrinks by one (a
  // running suffix max, filled from the end).
  float prefix = src[0];
  for (int32_t t = 0, hi = 0; t < r; ++t) {
    for (const int32_t want = std::min(n - 1, t + r); hi < want;) prefix = std::max(prefix, src[++hi]);
    dst[t] = prefix;
  }
  float suffix = src[n - 1];
  for (int32_t t = n - 1, lo = n - 1; t >= std::max(r, n - r); --t) {
    for (const int32_t want = t - r; lo > want;) suffix = std::max(suffix, src[--lo]);
    dst[t] = suffix;
  }
}

void kv_store(const float* src, void* dst, KvDtype dtype, int64_t n) {
  switch (dtype) {
    case KvDtype::kF32:
      std::memcpy(dst, src, sizeof(float) * n);
      return;
    case KvDtype::kF16: {
      auto* out = static_cast<uint16_t*>(dst);
      if (use_avx512()) return fp32_to_fp16_avx512(src, out, n);
      for (int64_t i = 0; i < n; ++i) out[i] = ref::fp32_to_fp16(src[i]);
      return;
    }
    case KvDtype::kI8: throw std::invalid_argument("kv_store: INT8 rows need kv_store_int8_row");
  }
}

void kv_store_int8_row(const float* src, int64_t n, uint8_t* dst, KvInt8Row* row) {
  float lo = src[0], hi = src[0];
  for (int64_t i = 1; i < n; ++i) {
    lo = std::min(lo, src[i]);
    hi = std::max(hi, src[i]);
  }
  const float scale = (hi - lo) / 255.0f;
  row->scale = scale;
  row->min = lo;
  if (scale == 0.0f) {
    std::memset(dst, 0, static_cast<size_t>(n));
    return;
  }
  const float inv = 1.0f / scale;
  for (int64_t i = 0; i < n; ++i)
    dst[i] = static_cast<uint8_t>(std::clamp(std::nearbyint((src[i] - lo) * inv), 0.0f, 255.0f));
}

}  // namespace fathom::cpu
