#pragma once
// One weight row's dot products with 1..4 activation rows, per stored format, by one warp: the
// device functions of quant_gemv (their layouts are described in quant_gemv.cu) shared with the
// grouped expert GEMV (moe.cu). Included by .cu files only.
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

template <int kNx>
__device__ __forceinline__ void row_q8_0(const uint8_t* row, int64_t k, const float* x, int lane, float* acc) {
  const int64_t nb = k / 32;
  const int part = lane % 8;
  for (int64_t b = lane / 8; b < nb; b += 4) {
    const uint8_t* blk = row + b * 34;
    const uint16_t* h = reinterpret_cast<const uint16_t*>(blk);
    const float d = f16_bits(h[0]);
    const uint16_t q01 = h[1 + 2 * part], q23 = h[2 + 2 * part];
    const float q0 = static_cast<float>(static_cast<int8_t>(q01 & 0xff));
    const float q1 = static_cast<float>(static_cast<int8_t>(q01 >> 8));
    const float q2 = static_cast<float>(static_cast<int8_t>(q23 & 0xff));
    const float q3 = static_cast<float>(static_cast<int8_t>(q23 >> 8));
FATHOM_UNROLL
    for (int m = 0; m < kNx; ++m) {
      const float4 xv = reinterpret_cast<const float4*>(x + m * k + b * 32)[part];
      acc[m] += d * dot4(xv, q0, q1, q2, q3);
    }
  }
}

template <int kNx>
__device__ __forceinline__ void row_q4_k(const uint8_t* row, int64_t k, const float* x, int lane, float* acc) {
  const int64_t nb = k / 256;
  const int chunk = lane / 8, off = 4 * (lane % 8);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = row + b * 144;
    const uint16_t* h = reinterpret_cast<const uint16_t*>(blk);
    const float d = f16_bits(h[0]), dmin = f16_bits(h[1]);
    float sc_lo, m_lo, sc_hi, m_hi;
    scale_min_k4(2 * chunk, blk + 4, &sc_lo, &m_lo);
    scale_min_k4(2 * chunk + 1, blk + 4, &sc_hi, &m_hi);
    const uint32_t qw = reinterpret_cast<const uint32_t*>(blk + 16)[lane];
    const float l0 = static_cast<float>(qw & 0xF), l1 = static_cast<float>((qw >> 8) & 0xF);
    const float l2 = static_cast<float>((qw >> 16) & 0xF), l3 = static_cast<float>((qw >> 24) & 0xF);
    const float h0 = static_cast<float>((qw >> 4) & 0xF), h1 = static_cast<float>((qw >> 12) & 0xF);
    const float h2 = static_cast<float>((qw >> 20) & 0xF), h3 = static_cast<float>(qw >> 28);
    const float d_lo = d * sc_lo, d_hi = d * sc_hi, min_lo = dmin * m_lo, min_hi = dmin * m_hi;
FATHOM_UNROLL
    for (int m = 0; m < kNx; ++m) {
      const float* xb = x + m * k + b * 256 + 64 * chunk + off;
      const float4 xl = *reinterpret_cast<const float4*>(xb);
      const float4 xh = *reinterpret_cast<const float4*>(xb + 32);
      acc[m] += d_lo * dot4(xl, l0, l1, l2, l3) - min_lo * (xl.x + xl.y + xl.z + xl.w) +
                d_hi * dot4(xh, h0, h1, h2, h3) - min_hi * (xh.x + xh.y + xh.z + xh.w);
    }
  }
}

template <int kNx>
__device__ __forceinline__ void row_q6_k(const uint8_t* row, int64_t k, const float* x, int lane, float* acc) {
  const int64_t nb = k / 256;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = row + b * 210;
    const float d = f16_bits(*reinterpret_cast<const uint16_t*>(blk + 208));
FATHOM_UNROLL
    for (int n = 0; n < 2; ++n) {
      const uint8_t qla = blk[64 * n + lane], qlb = blk[64 * n + lane + 32], qh = blk[128 + 32 * n + lane];
      const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192 + 8 * n + lane / 16);
      const float w0 = d * static_cast<float>(sc[0]) * static_cast<float>(((qla & 0xF) | ((qh & 3) << 4)) - 32);
      const float w1 = d * static_cast<float>(sc[2]) * static_cast<float>(((qlb & 0xF) | (((qh >> 2) & 3) << 4)) - 32);
      const float w2 = d * static_cast<float>(sc[4]) * static_cast<float>(((qla >> 4) | (((qh >> 4) & 3) << 4)) - 32);
      const float w3 = d * static_cast<float>(sc[6]) * static_cast<float>(((qlb >> 4) | (((qh >> 6) & 3) << 4)) - 32);
FATHOM_UNROLL
      for (int m = 0; m < kNx; ++m) {
        const float* xb = x + m * k + b * 256 + 128 * n + lane;
        acc[m] += w0 * xb[0] + w1 * xb[32] + w2 * xb[64] + w3 * xb[96];
      }
    }
  }
}

// acc[m] += scale · Σ_t (value(nibble t of byte t) · x[m][t] + value(high nibble) · x[m][16 + t]),
// t < 4, for the 4 bytes of `qw`: the low nibbles' 4 elements first, then the high nibbles', so
// that only 4 decoded values are live at a time (8 spilled registers at kNx = 3 under sm_80).
template <int kNx, typename Value>
__device__ __forceinline__ void nibble_dots(uint32_t qw, float scale, const float* x, int64_t k, float* acc,
                                            Value value) {
FATHOM_UNROLL
  for (int half = 0; half < 2; ++half) {
    const uint32_t q = qw >> (4 * half);
    const float v0 = value(q & 0xF), v1 = value((q >> 8) & 0xF), v2 = value((q >> 16) & 0xF), v3 = value((q >> 24) & 0xF);
FATHOM_UNROLL
    for (int m = 0; m < kNx; ++m)
      acc[m] += scale * dot4(*reinterpret_cast<const float4*>(x + m * k + 16 * half), v0, v1, v2, v3);
  }
}

template <bool kQ3, int kNx>
__device__ __forceinline__ void row_q23_k(const uint8_t* row, int64_t k, const float* x, int lane, float* acc) {
  constexpr int kBytes = kQ3 ? 110 : 84, kQs = kQ3 ? 32 : 16;
  const int64_t nb = k / 256;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = row + b * kBytes;
    const float d = f16_bits(*reinterpret_cast<const uint16_t*>(blk + (kQ3 ? 108 : 80)));
    const float dmin = kQ3 ? 0.0f : f16_bits(*reinterpret_cast<const uint16_t*>(blk + 82));
    const uint8_t hm = kQ3 ? blk[lane] : 0;
FATHOM_UNROLL
    for (int h = 0; h < 2; ++h) {
      const uint8_t q = blk[kQs + 32 * h + lane];
FATHOM_UNROLL
      for (int j = 0; j < 4; ++j) {
        const int s = 8 * h + 2 * j + lane / 16;  // the element's 16-element sub-block
        float w;
        if constexpr (kQ3) {
          const int v = ((q >> (2 * j)) & 3) - ((hm >> (4 * h + j)) & 1 ? 0 : 4);
          w = d * q3_k_scale(blk + 96, s) * static_cast<float>(v);
        } else {
          const uint8_t sc = blk[s];
          w = d * static_cast<float>(sc & 0xF) * static_cast<float>((q >> (2 * j)) & 3) - dmin * static_cast<float>(sc >> 4);
        }
FATHOM_UNROLL
        for (int m = 0; m < kNx; ++m) acc[m] += w * x[m * k + b * 256 + 128 * h + 32 * j + lane];
      }
    }
  }
}

template <int kNx>
__device__ __forceinline__ void row_iq4_xs(const uint8_t* row, int64_t k, const float* x, int lane, float* acc) {
  const int64_t nb = k / 256;
  const int g = lane / 4, off = 32 * g + 4 * (lane % 4);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = row + b * 136;
    const float dl = f16_bits(*reinterpret_cast<const uint16_t*>(blk)) * iq4_xs_scale(blk, g);
    const uint32_t qw = reinterpret_cast<const uint32_t*>(blk + 8)[lane];
    nibble_dots<kNx>(qw, dl, x + b * 256 + off, k, acc, iq4nl_level);
  }
}

template <int kNx>
__device__ __forceinline__ void row_mxfp4(const uint8_t* row, int64_t k, const float* x, int lane, float* acc) {
  const int64_t nb = k / 32;
  const int part = lane % 4;
  for (int64_t b = lane / 4; b < nb; b += 8) {
    const uint8_t* blk = row + b * 17;
    const float d = e8m0_half(blk[0]);
    const uint8_t* qs = blk + 1 + 4 * part;
    const uint32_t qw = qs[0] | qs[1] << 8 | qs[2] << 16 | static_cast<uint32_t>(qs[3]) << 24;
    nibble_dots<kNx>(qw, d, x + b * 32 + 4 * part, k, acc, mxfp4_value);
  }
}

template <int kNx>
__device__ __forceinline__ void row_iq4_nl(const uint8_t* row, int64_t k, const float* x, int lane, float* acc) {
  const int64_t nb = k / 32;
  const int part = lane % 4;
  for (int64_t b = lane / 4; b < nb; b += 8) {
    const uint16_t* h = reinterpret_cast<const uint16_t*>(row + b * 18);
    const float d = f16_bits(h[0]);
    const uint32_t qw = h[1 + 2 * part] | static_cast<uint32_t>(h[2 + 2 * part]) << 16;  // bytes 4 part ..
    nibble_dots<kNx>(qw, d, x + b * 32 + 4 * part, k, acc, iq4nl_level);
  }
}


// acc[m] += Σ_k W_row[k] · x[m][k] for the row at `row` in stored format kType (the formats of
// quant_gemv, and F16 / F32: lane l takes elements l, l + 32, ...). x: [kNx][k] f32.
template <GgmlType kType, int kNx>
__device__ __forceinline__ void row_dot(const uint8_t* row, int64_t k, const float* x, int lane, float* acc) {
  if constexpr (kType == GgmlType::Q8_0) row_q8_0<kNx>(row, k, x, lane, acc);
  else if constexpr (kType == GgmlType::Q4_K) row_q4_k<kNx>(row, k, x, lane, acc);
  else if constexpr (kType == GgmlType::Q2_K) row_q23_k<false, kNx>(row, k, x, lane, acc);
  else if constexpr (kType == GgmlType::Q3_K) row_q23_k<true, kNx>(row, k, x, lane, acc);
  else if constexpr (kType == GgmlType::IQ4_XS) row_iq4_xs<kNx>(row, k, x, lane, acc);
  else if constexpr (kType == GgmlType::IQ4_NL) row_iq4_nl<kNx>(row, k, x, lane, acc);
  else if constexpr (kType == GgmlType::MXFP4) row_mxfp4<kNx>(row, k, x, lane, acc);
  else if constexpr (kType == GgmlType::Q6_K) row_q6_k<kNx>(row, k, x, lane, acc);
  else if constexpr (kType == GgmlType::F16) {
    const __half* h = reinterpret_cast<const __half*>(row);
    for (int64_t i = lane; i < k; i += 32) {
      const float w = __half2float(h[i]);
FATHOM_UNROLL
      for (int m = 0; m < kNx; ++m) acc[m] += w * x[m * k + i];
    }
  } else {
    static_assert(kType == GgmlType::F32, "a format row_dot does not read");
    const float* f = reinterpret_cast<const float*>(row);
    for (int64_t i = lane; i < k; i += 32) {
      const float w = f[i];
FATHOM_UNROLL
      for (int m = 0; m < kNx; ++m) acc[m] += w * x[m * k + i];
    }
  }
}

}  // namespace fathom::cuda::quant_rows
