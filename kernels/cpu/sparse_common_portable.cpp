// Portable (any ISA) instantiation of the sparse-attention inner loops.
#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "kernels/cpu/sparse_common.h"
#include "kernels/ref/dequant.h"

namespace fathom::cpu::sparse {
namespace {

float h2f(uint16_t h) { return ref::fp16_to_fp32(h); }

template <typename T, typename Load>
float dot_any(const float* q, const T* k, int32_t n, Load load) {
  float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int32_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += q[i] * load(k[i]);
    s1 += q[i + 1] * load(k[i + 1]);
    s2 += q[i + 2] * load(k[i + 2]);
    s3 += q[i + 3] * load(k[i + 3]);
  }
  for (; i < n; ++i) s0 += q[i] * load(k[i]);
  return (s0 + s1) + (s2 + s3);
}
float dot_f32(const float* q, const float* k, int32_t n) { return dot_any(q, k, n, [](float x) { return x; }); }
float dot_f16(const float* q, const uint16_t* k, int32_t n) { return dot_any(q, k, n, h2f); }
float dot_u8(const float* q, const uint8_t* k, int32_t n) {
  return dot_any(q, k, n, [](uint8_t x) { return static_cast<float>(x); });
}
void axpy_f32(float a, const float* x, float* y, int32_t n) {
  for (int32_t i = 0; i < n; ++i) y[i] += a * x[i];
}
void axpy_f16(float a, const uint16_t* x, float* y, int32_t n) {
  for (int32_t i = 0; i < n; ++i) y[i] += a * h2f(x[i]);
}
void axpy_u8(float a, const uint8_t* x, float* y, int32_t n) {
  for (int32_t i = 0; i < n; ++i) y[i] += a * static_cast<float>(x[i]);
}
float exp_shifted(float* s, int32_t n, float shift) {
  float sum = 0;
  for (int32_t i = 0; i < n; ++i) sum += (s[i] = std::exp(s[i] - shift));
  return sum;
}
float max_of(const float* s, int32_t n) {
  float m = s[0];
  for (int32_t i = 1; i < n; ++i) m = std::max(m, s[i]);
  return m;
}
float max_sum_exp(const float* s, int32_t n, float* mx) {
  const float m = max_of(s, n);
  float sum = 0;
  for (int32_t i = 0; i < n; ++i) sum += std::exp(s[i] - m);
  *mx = m;
  return sum;
}

int32_t indices_at_least(const float* s, int32_t n, uint32_t key, int32_t* out) {
  int32_t c = 0;
  for (int32_t i = 0; i < n; ++i) {  // branch-free: the slot is overwritten until a key passes
    out[c] = i;
    c += order_key(s[i]) >= key;
  }
  return c;
}

uint32_t kth_largest_key(const uint32_t* keys, int32_t m, int32_t k) {
  thread_local std::vector<uint32_t> copy;
  copy.assign(keys, keys + m);
  std::nth_element(copy.begin(), copy.begin() + (k - 1), copy.end(), std::greater<uint32_t>());
  return copy[k - 1];
}

// No blocked dot products here: key_logits goes key by key.
template <typename T>
bool dot_rows(const T*, const int64_t*, int32_t, const float*, int32_t, int32_t, float, float*, int64_t, const T*) {
  return false;
}

// No register-blocked row accumulation here: accumulate_v goes row by row.
template <typename T>
bool axpy_rows(const T*, const int64_t*, int32_t, int32_t, const float*, int64_t, float*, int32_t) {
  return false;
}

// No register-blocked tile kernel here: the generic path of sparq_scores handles every tile.
template <typename T>
bool kt_tile16(const T*, const int32_t*, int32_t, const float*, int32_t, float*, int64_t, int32_t, int32_t, float*) {
  return false;
}

// No pair kernel here: sparq_scores takes the tiles one at a time.
template <typename T>
bool kt_tile16x2(const T*, const T*, const int32_t*, int32_t, const float*, int32_t, float*, int64_t, int32_t, int32_t,
                 float*) {
  return false;
}

constexpr decltype(Kernels::run_partial) kRunPartial = nullptr;  // runs are gathered: no Kᵀ kernel at this level

#include "kernels/cpu/sparse_common.inc"

}  // namespace

const Kernels* kernels_portable() { return &kTable; }

}  // namespace fathom::cpu::sparse
