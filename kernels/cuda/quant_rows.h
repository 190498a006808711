#pragma once
// Dot products of kR weight rows with kNx activation rows, per stored format, by one warp: the
// device functions of quant_gemv (their layouts are described in quant_gemv.cu) shared with the
// grouped expert GEMV (moe.cu, one row a warp). Included by .cu files only.
#include <cstdint>

#include "kernels/cuda/emu/cuda_emu.h"
#include "kernels/cuda/quant_device.h"
#include "kernels/ggml_type.h"

namespace fathom::cuda::quant_rows {

using namespace quant_device;
constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

__device__ __forceinline__ float dot4(float4 a, float b0, float b1, float b2, float b3) {
  return a.x * b0 + a.y * b1 + a.z * b2 + a.w * b3;
}

// Each function below: acc[r][m] += Σ_k W_r[k] · x[m][k] over the lane's share of the columns,
// for kR weight rows (rows[r], one stored row each) and kNx activation rows (x: [kNx][k] f32).
// The lane decodes its weights of all kR rows, then each x value it loads serves the kR rows: x
// traffic per weight is 1/kR of one row at a time. Every (r, m) goes through the same operations
// in the same order whatever kR and kNx are, so a row's result is bitwise the same in any launch.

template <int kR, int kNx>
__device__ __forceinline__ void rows_q8_0(const uint8_t* const* rows, int64_t k, const float* x, int lane,
                                          float (*acc)[kNx]) {
  const int64_t nb = k / 32;
  const int part = lane % 8;
  for (int64_t b = lane / 8; b < nb; b += 4) {
    float d[kR], q0[kR], q1[kR], q2[kR], q3[kR];
FATHOM_UNROLL
    for (int r = 0; r < kR; ++r) {
      const uint16_t* h = reinterpret_cast<const uint16_t*>(rows[r] + b * 34);
      d[r] = f16_bits(h[0]);
      const uint16_t q01 = h[1 + 2 * part], q23 = h[2 + 2 * part];
      q0[r] = static_cast<float>(static_cast<int8_t>(q01 & 0xff));
      q1[r] = static_cast<float>(static_cast<int8_t>(q01 >> 8));
      q2[r] = static_cast<float>(static_cast<int8_t>(q23 & 0xff));
      q3[r] = static_cast<float>(static_cast<int8_t>(q23 >> 8));
    }
FATHOM_UNROLL
    for (int m = 0; m < kNx; ++m) {
      const float4 xv = reinterpret_cast<const float4*>(x + m * k + b * 32)[part];
FATHOM_UNROLL
      for (int r = 0; r < kR; ++r) acc[r][m] += d[r] * dot4(xv, q0[r], q1[r], q2[r], q3[r]);
    }
  }
}

template <int kR, int kNx>
__device__ __forceinline__ void rows_q4_k(const uint8_t* const* rows, int64_t k, const float* x, int lane,
                                          float (*acc)[kNx]) {
  const int64_t nb = k / 256;
  const int chunk = lane / 8, off = 4 * (lane % 8);
  for (int64_t b = 0; b < nb; ++b) {
    float lo[kR][4], hi[kR][4], d_lo[kR], d_hi[kR], min_lo[kR], min_hi[kR];
FATHOM_UNROLL
    for (int r = 0; r < kR; ++r) {
      const uint8_t* blk = rows[r] + b * 144;
      const uint16_t* h = reinterpret_cast<const uint16_t*>(blk);
      const float d = f16_bits(h[0]), dmin = f16_bits(h[1]);
      float sc_lo, m_lo, sc_hi, m_hi;
      scale_min_k4(2 * chunk, blk + 4, &sc_lo, &m_lo);
      scale_min_k4(2 * chunk + 1, blk + 4, &sc_hi, &m_hi);
      const uint32_t qw = reinterpret_cast<const uint32_t*>(blk + 16)[lane];
FATHOM_UNROLL
      for (int t = 0; t < 4; ++t) {
        lo[r][t] = static_cast<float>((qw >> (8 * t)) & 0xF);
        hi[r][t] = static_cast<float>((qw >> (8 * t + 4)) & 0xF);
      }
      d_lo[r] = d * sc_lo, d_hi[r] = d * sc_hi, min_lo[r] = dmin * m_lo, min_hi[r] = dmin * m_hi;
    }
FATHOM_UNROLL
    for (int m = 0; m < kNx; ++m) {
      const float* xb = x + m * k + b * 256 + 64 * chunk + off;
      const float4 xl = *reinterpret_cast<const float4*>(xb);
      const float4 xh = *reinterpret_cast<const float4*>(xb + 32);
FATHOM_UNROLL
      for (int r = 0; r < kR; ++r)
        acc[r][m] += d_lo[r] * dot4(xl, lo[r][0], lo[r][1], lo[r][2], lo[r][3]) - min_lo[r] * (xl.x + xl.y + xl.z + xl.w) +
                     d_hi[r] * dot4(xh, hi[r][0], hi[r][1], hi[r][2], hi[r][3]) - min_hi[r] * (xh.x + xh.y + xh.z + xh.w);
    }
  }
}

template <int kR, int kNx>
__device__ __forceinline__ void rows_q6_k(const uint8_t* const* rows, int64_t k, const float* x, int lane,
                                          float (*acc)[kNx]) {
  const int64_t nb = k / 256;
  for (int64_t b = 0; b < nb; ++b) {
FATHOM_UNROLL
    for (int n = 0; n < 2; ++n) {
      float w0[kR], w1[kR], w2[kR], w3[kR];
FATHOM_UNROLL
      for (int r = 0; r < kR; ++r) {
        const uint8_t* blk = rows[r] + b * 210;
        const float d = f16_bits(*reinterpret_cast<const uint16_t*>(blk + 208));
        const uint8_t qla = blk[64 * n + lane], qlb = blk[64 * n + lane + 32], qh = blk[128 + 32 * n + lane];
        const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192 + 8 * n + lane / 16);
        w0[r] = d * static_cast<float>(sc[0]) * static_cast<float>(((qla & 0xF) | ((qh & 3) << 4)) - 32);
        w1[r] = d * static_cast<float>(sc[2]) * static_cast<float>(((qlb & 0xF) | (((qh >> 2) & 3) << 4)) - 32);
        w2[r] = d * static_cast<float>(sc[4]) * static_cast<float>(((qla >> 4) | (((qh >> 4) & 3) << 4)) - 32);
        w3[r] = d * static_cast<float>(sc[6]) * static_cast<float>(((qlb >> 4) | (((qh >> 6) & 3) << 4)) - 32);
      }
FATHOM_UNROLL
      for (int m = 0; m < kNx; ++m) {
        const float* xb = x + m * k + b * 256 + 128 * n + lane;
        const float x0 = xb[0], x1 = xb[32], x2 = xb[64], x3 = xb[96];
FATHOM_UNROLL
        for (int r = 0; r < kR; ++r) acc[r][m] += w0[r] * x0 + w1[r] * x1 + w2[r] * x2 + w3[r] * x3;
      }
    }
  }
}

// acc[r][m] += scale[r] · Σ_t (value(nibble t of byte t of qw[r]) · x[m][t] + value(high nibble) ·
// x[m][16 + t]), t < 4: the low nibbles' 4 elements first, then the high nibbles', so that only 4
// decoded values a row are live at a time (8 spilled registers at kNx = 3 under sm_80).
template <int kR, int kNx, typename Value>
__device__ __forceinline__ void nibble_dots(const uint32_t* qw, const float* scale, const float* x, int64_t k,
                                            float (*acc)[kNx], Value value) {
FATHOM_UNROLL
  for (int half = 0; half < 2; ++half) {
    float v[kR][4];
FATHOM_UNROLL
    for (int r = 0; r < kR; ++r) {
      const uint32_t q = qw[r] >> (4 * half);
FATHOM_UNROLL
      for (int t = 0; t < 4; ++t) v[r][t] = value((q >> (8 * t)) & 0xF);
    }
FATHOM_UNROLL
    for (int m = 0; m < kNx; ++m) {
      const float4 xv = *reinterpret_cast<const float4*>(x + m * k + 16 * half);
FATHOM_UNROLL
      for (int r = 0; r < kR; ++r) acc[r][m] += scale[r] * dot4(xv, v[r][0], v[r][1], v[r][2], v[r][3]);
    }
  }
}

template <bool kQ3, int kR, int kNx>
__device__ __forceinline__ void rows_q23_k(const uint8_t* const* rows, int64_t k, const float* x, int lane,
                                           float (*acc)[kNx]) {
  constexpr int kBytes = kQ3 ? 110 : 84, kQs = kQ3 ? 32 : 16;
  const int64_t nb = k / 256;
  for (int64_t b = 0; b < nb; ++b) {
FATHOM_UNROLL
    for (int h = 0; h < 2; ++h) {
FATHOM_UNROLL
      for (int j = 0; j < 4; ++j) {
        const int s = 8 * h + 2 * j + lane / 16;  // the element's 16-element sub-block
        float w[kR];
FATHOM_UNROLL
        for (int r = 0; r < kR; ++r) {
          const uint8_t* blk = rows[r] + b * kBytes;
          const float d = f16_bits(*reinterpret_cast<const uint16_t*>(blk + (kQ3 ? 108 : 80)));
          const uint8_t q = blk[kQs + 32 * h + lane];
          if constexpr (kQ3) {
            const uint8_t hm = blk[lane];
            const int v = ((q >> (2 * j)) & 3) - ((hm >> (4 * h + j)) & 1 ? 0 : 4);
            w[r] = d * q3_k_scale(blk + 96, s) * static_cast<float>(v);
          } else {
            const float dmin = f16_bits(*reinterpret_cast<const uint16_t*>(blk + 82));
            const uint8_t sc = blk[s];
            w[r] = d * static_cast<float>(sc & 0xF) * static_cast<float>((q >> (2 * j)) & 3) - dmin * static_cast<float>(sc >> 4);
          }
        }
FATHOM_UNROLL
        for (int m = 0; m < kNx; ++m) {
          const float xv = x[m * k + b * 256 + 128 * h + 32 * j + lane];
FATHOM_UNROLL
          for (int r = 0; r < kR; ++r) acc[r][m] += w[r] * xv;
        }
      }
    }
  }
}

template <int kR, int kNx>
__device__ __forceinline__ void rows_iq4_xs(const uint8_t* const* rows, int64_t k, const float* x, int lane,
                                            float (*acc)[kNx]) {
  const int64_t nb = k / 256;
  const int g = lane / 4, off = 32 * g + 4 * (lane % 4);
  for (int64_t b = 0; b < nb; ++b) {
    float dl[kR];
    uint32_t qw[kR];
FATHOM_UNROLL
    for (int r = 0; r < kR; ++r) {
      const uint8_t* blk = rows[r] + b * 136;
      dl[r] = f16_bits(*reinterpret_cast<const uint16_t*>(blk)) * iq4_xs_scale(blk, g);
      qw[r] = reinterpret_cast<const uint32_t*>(blk + 8)[lane];
    }
    nibble_dots<kR, kNx>(qw, dl, x + b * 256 + off, k, acc, iq4nl_level);
  }
}

template <int kR, int kNx>
__device__ __forceinline__ void rows_mxfp4(const uint8_t* const* rows, int64_t k, const float* x, int lane,
                                           float (*acc)[kNx]) {
  const int64_t nb = k / 32;
  const int part = lane % 4;
  for (int64_t b = lane / 4; b < nb; b += 8) {
    float d[kR];
    uint32_t qw[kR];
FATHOM_UNROLL
    for (int r = 0; r < kR; ++r) {
      const uint8_t* blk = rows[r] + b * 17;
      d[r] = e8m0_half(blk[0]);
      const uint8_t* qs = blk + 1 + 4 * part;
      qw[r] = qs[0] | qs[1] << 8 | qs[2] << 16 | static_cast<uint32_t>(qs[3]) << 24;
    }
    nibble_dots<kR, kNx>(qw, d, x + b * 32 + 4 * part, k, acc, mxfp4_value);
  }
}

template <int kR, int kNx>
__device__ __forceinline__ void rows_iq4_nl(const uint8_t* const* rows, int64_t k, const float* x, int lane,
                                            float (*acc)[kNx]) {
  const int64_t nb = k / 32;
  const int part = lane % 4;
  for (int64_t b = lane / 4; b < nb; b += 8) {
    float d[kR];
    uint32_t qw[kR];
FATHOM_UNROLL
    for (int r = 0; r < kR; ++r) {
      const uint16_t* h = reinterpret_cast<const uint16_t*>(rows[r] + b * 18);
      d[r] = f16_bits(h[0]);
      qw[r] = h[1 + 2 * part] | static_cast<uint32_t>(h[2 + 2 * part]) << 16;  // bytes 4 part ..
    }
    nibble_dots<kR, kNx>(qw, d, x + b * 32 + 4 * part, k, acc, iq4nl_level);
  }
}

// F16 / F32 rows: lane l takes elements l, l + 32, ...
template <typename T, int kR, int kNx>
__device__ __forceinline__ void rows_dense(const uint8_t* const* rows, int64_t k, const float* x, int lane,
                                           float (*acc)[kNx]) {
  for (int64_t i = lane; i < k; i += 32) {
    float w[kR];
FATHOM_UNROLL
    for (int r = 0; r < kR; ++r) {
      const T v = reinterpret_cast<const T*>(rows[r])[i];
      if constexpr (sizeof(T) == 2) w[r] = __half2float(v);
      else w[r] = v;
    }
FATHOM_UNROLL
    for (int m = 0; m < kNx; ++m) {
      const float xv = x[m * k + i];
FATHOM_UNROLL
      for (int r = 0; r < kR; ++r) acc[r][m] += w[r] * xv;
    }
  }
}

// acc[r][m] += Σ_k W_r[k] · x[m][k] for kR rows (rows[r]) in stored format kType (the formats of
// quant_gemv, and F16 / F32). x: [kNx][k] f32.
template <GgmlType kType, int kR, int kNx>
__device__ __forceinline__ void rows_dot(const uint8_t* const* rows, int64_t k, const float* x, int lane,
                                         float (*acc)[kNx]) {
  if constexpr (kType == GgmlType::Q8_0) rows_q8_0<kR, kNx>(rows, k, x, lane, acc);
  else if constexpr (kType == GgmlType::Q4_K) rows_q4_k<kR, kNx>(rows, k, x, lane, acc);
  else if constexpr (kType == GgmlType::Q2_K) rows_q23_k<false, kR, kNx>(rows, k, x, lane, acc);
  else if constexpr (kType == GgmlType::Q3_K) rows_q23_k<true, kR, kNx>(rows, k, x, lane, acc);
  else if constexpr (kType == GgmlType::IQ4_XS) rows_iq4_xs<kR, kNx>(rows, k, x, lane, acc);
  else if constexpr (kType == GgmlType::IQ4_NL) rows_iq4_nl<kR, kNx>(rows, k, x, lane, acc);
  else if constexpr (kType == GgmlType::MXFP4) rows_mxfp4<kR, kNx>(rows, k, x, lane, acc);
  else if constexpr (kType == GgmlType::Q6_K) rows_q6_k<kR, kNx>(rows, k, x, lane, acc);
  else if constexpr (kType == GgmlType::F16) rows_dense<__half, kR, kNx>(rows, k, x, lane, acc);
  else {
    static_assert(kType == GgmlType::F32, "a format rows_dot does not read");
    rows_dense<float, kR, kNx>(rows, k, x, lane, acc);
  }
}

// One warp's part of y = x · Wᵀ: y[m][n0 + r] (row stride n_out) for weight rows n0..n0 + kR - 1 of
// W (row_bytes apart) and activation rows x[0..kNx); rows past n_out read the last row again and
// are not stored. quant_gemv's kernels and the experts' grouped GEMV.
template <GgmlType kType, int kR, int kNx>
__device__ __forceinline__ void warp_rows(const uint8_t* w, int64_t row_bytes, int64_t n_out, int64_t n0, int64_t k,
                                          const float* x, float* y, int lane) {
  const uint8_t* rows[kR];
FATHOM_UNROLL
  for (int r = 0; r < kR; ++r) rows[r] = w + (n0 + r < n_out ? n0 + r : n_out - 1) * row_bytes;
  float acc[kR][kNx];
FATHOM_UNROLL
  for (int r = 0; r < kR; ++r)
FATHOM_UNROLL
    for (int m = 0; m < kNx; ++m) acc[r][m] = 0.0f;
  rows_dot<kType, kR, kNx>(rows, k, x, lane, acc);
FATHOM_UNROLL
  for (int r = 0; r < kR; ++r)
FATHOM_UNROLL
    for (int m = 0; m < kNx; ++m) {
      const float s = warp_sum(acc[r][m]);
      if (lane == 0 && n0 + r < n_out) y[m * n_out + n0 + r] = s;
    }
}

}  // namespace fathom::cuda::quant_rows
