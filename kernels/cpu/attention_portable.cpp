// Portable (any x86-64 / any ISA) instantiation of the partial attention kernel.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/attention_partial.h"
#include "kernels/ref/dequant.h"

namespace fathom::cpu {
namespace {

float dot(const float* a, const float* b, int32_t n) {
  float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int32_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += a[i] * b[i];
    s1 += a[i + 1] * b[i + 1];
    s2 += a[i + 2] * b[i + 2];
    s3 += a[i + 3] * b[i + 3];
  }
  for (; i < n; ++i) s0 += a[i] * b[i];
  return (s0 + s1) + (s2 + s3);
}
void axpy(float alpha, const float* x, float* y, int32_t n) {
  for (int32_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}
void scale(float* y, float alpha, int32_t n) {
  for (int32_t i = 0; i < n; ++i) y[i] *= alpha;
}
float dot_h(const float* a, const uint16_t* b, int32_t n) {
  float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int32_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += a[i] * ref::fp16_to_fp32(b[i]);
    s1 += a[i + 1] * ref::fp16_to_fp32(b[i + 1]);
    s2 += a[i + 2] * ref::fp16_to_fp32(b[i + 2]);
    s3 += a[i + 3] * ref::fp16_to_fp32(b[i + 3]);
  }
  for (; i < n; ++i) s0 += a[i] * ref::fp16_to_fp32(b[i]);
  return (s0 + s1) + (s2 + s3);
}
void axpy_h(float alpha, const uint16_t* x, float* y, int32_t n) {
  for (int32_t i = 0; i < n; ++i) y[i] += alpha * ref::fp16_to_fp32(x[i]);
}
float exp_shifted(float* s, int32_t n, float shift) {
  float sum = 0;
  for (int32_t i = 0; i < n; ++i) sum += (s[i] = std::exp(s[i] - shift));
  return sum;
}
void f16_to_f32(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = ref::fp16_to_fp32(src[i]);
}

// INT8 rows: the raw x_q as f32 (exact), same order as dot / axpy.
float dot_u8(const float* a, const uint8_t* b, int32_t n) {
  float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int32_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += a[i] * static_cast<float>(b[i]);
    s1 += a[i + 1] * static_cast<float>(b[i + 1]);
    s2 += a[i + 2] * static_cast<float>(b[i + 2]);
    s3 += a[i + 3] * static_cast<float>(b[i + 3]);
  }
  for (; i < n; ++i) s0 += a[i] * static_cast<float>(b[i]);
  return (s0 + s1) + (s2 + s3);
}
void axpy_u8(float alpha, const uint8_t* x, float* y, int32_t n) {
  for (int32_t i = 0; i < n; ++i) y[i] += alpha * static_cast<float>(x[i]);
}
void u8_to_f32(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

#include "kernels/cpu/attention_partial.inc"

}  // namespace

PartialAttentionFn partial_attention_portable() { return &partial_attention; }

}  // namespace fathom::cpu
