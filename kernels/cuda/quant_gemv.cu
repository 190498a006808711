// Quantized GEMV. Launch: grid (ceil(n_out / 4)), block 128 = 4 warps, one warp per output row;
// the row's blocks are read by the warp together so every load instruction of the warp covers
// a contiguous span of the row (coalesced), each lane accumulates f32 partial dots for the n_x
// activation rows, and a shuffle tree reduces the 32 lanes at the end (lane 0 writes y).
//   Q8_0 (34-byte blocks of 32): 8 lanes per block, 4 blocks (136 bytes) per warp step; a lane
//        reads 4 quants (two 16-bit loads: blocks are only 2-byte aligned) and a float4 of x.
//   Q4_K (144-byte super-blocks of 256): the warp reads one super-block per step; lane l takes
//        the 32-bit word l of qs (bytes 4l..4l+3 of 128: 4 low nibbles of sub-block 2(l/8),
//        4 high nibbles of sub-block 2(l/8)+1) and two float4 of x; the sub-block scale and
//        min multiply the partial sums once: d·sc·Σq·x − dmin·m·Σx.
//   Q6_K (210-byte super-blocks): lane l decodes elements l + {0, 32, 64, 96} of each half
//        (the ref's loop order): byte loads of ql/qh contiguous across lanes, x loads too.
//   Q2_K (84 bytes), Q3_K (110): lane l decodes elements 128 h + 32 j + l (h < 2, j < 4) from
//        the bytes qs[32 h + l] (and Q3_K's hmask[l]): byte loads contiguous across lanes, x too.
//   IQ4_XS (136 bytes): lane l takes the 32-bit word l of qs (4 bytes of 32-group l / 4: its
//        elements 4 (l % 4) + {0..3} in the low nibbles, + 16 in the high ones), as Q4_K.
//   IQ4_NL (18-byte blocks of 32), MXFP4 (17): 4 lanes per block, 8 blocks per warp step; a
//        lane reads 4 bytes of qs (IQ4_NL: two 16-bit loads; MXFP4, byte-aligned: 4 byte loads)
//        and two float4 of x, as Q8_0.
// Bytes per output row: the row of W once plus n_x·K·4 of x (x is re-read by every warp but
// stays in L1/L2), so the kernel is bound by W's bytes, as decode GEMV should be.
#include "kernels/cuda/quant_gemv.h"

#include "kernels/cuda/quant_device.h"

namespace fathom::cuda {
namespace quant_gemv_detail {  // named: the kernels' names stay unique across the .cu files

using namespace quant_device;
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
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

// grid (ceil(n_out / kWarps)), block (kThreads)
template <GgmlType kType, int kNx>
__global__ void __launch_bounds__(kThreads) quant_gemv_kernel(const uint8_t* __restrict__ w, int64_t row_bytes,
                                                              int64_t n_out, int64_t k, const float* __restrict__ x,
                                                              float* __restrict__ y) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarps + static_cast<int>(threadIdx.x) / 32;
  if (n >= n_out) return;  // whole warps exit together: the shuffles below stay full-warp
  const uint8_t* row = w + n * row_bytes;
  float acc[kNx];
FATHOM_UNROLL
  for (int m = 0; m < kNx; ++m) acc[m] = 0.0f;
  if constexpr (kType == GgmlType::Q8_0) row_q8_0<kNx>(row, k, x, lane, acc);
  else if constexpr (kType == GgmlType::Q4_K) row_q4_k<kNx>(row, k, x, lane, acc);
  else if constexpr (kType == GgmlType::Q2_K) row_q23_k<false, kNx>(row, k, x, lane, acc);
  else if constexpr (kType == GgmlType::Q3_K) row_q23_k<true, kNx>(row, k, x, lane, acc);
  else if constexpr (kType == GgmlType::IQ4_XS) row_iq4_xs<kNx>(row, k, x, lane, acc);
  else if constexpr (kType == GgmlType::IQ4_NL) row_iq4_nl<kNx>(row, k, x, lane, acc);
  else if constexpr (kType == GgmlType::MXFP4) row_mxfp4<kNx>(row, k, x, lane, acc);
  else row_q6_k<kNx>(row, k, x, lane, acc);
FATHOM_UNROLL
  for (int m = 0; m < kNx; ++m) {
    const float s = warp_sum(acc[m]);
    if (lane == 0) y[m * n_out + n] = s;
  }
}

template <GgmlType kType>
void launch(const void* w, int64_t row_bytes, int64_t n_out, int64_t k, const float* x, int32_t n_x, float* y,
            cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((n_out + kWarps - 1) / kWarps));
  const auto* wb = static_cast<const uint8_t*>(w);
  switch (n_x) {
    case 1: FATHOM_LAUNCH((quant_gemv_kernel<kType, 1>), grid, dim3(kThreads), 0, stream, wb, row_bytes, n_out, k, x, y); break;
    case 2: FATHOM_LAUNCH((quant_gemv_kernel<kType, 2>), grid, dim3(kThreads), 0, stream, wb, row_bytes, n_out, k, x, y); break;
    case 3: FATHOM_LAUNCH((quant_gemv_kernel<kType, 3>), grid, dim3(kThreads), 0, stream, wb, row_bytes, n_out, k, x, y); break;
    default: FATHOM_LAUNCH((quant_gemv_kernel<kType, 4>), grid, dim3(kThreads), 0, stream, wb, row_bytes, n_out, k, x, y); break;
  }
}

}  // namespace quant_gemv_detail

cudaError_t quant_gemv(GgmlType type, const void* w, int64_t n_out, int64_t k, const float* x, int32_t n_x, float* y,
                       cudaStream_t stream) {
  using namespace quant_gemv_detail;
  if (n_out == 0) return cudaSuccess;
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (n_out < 0 || (n_out + kWarps - 1) / kWarps > 0x7fffffff || n_x < 1 || n_x > 4 || k <= 0 || !aligned(w) ||
      !aligned(x))
    return cudaErrorInvalidValue;
  switch (type) {
    case GgmlType::Q8_0:
      if (k % 32 != 0) return cudaErrorInvalidValue;
      launch<GgmlType::Q8_0>(w, k / 32 * 34, n_out, k, x, n_x, y, stream);
      break;
    case GgmlType::Q4_K:
      if (k % 256 != 0) return cudaErrorInvalidValue;
      launch<GgmlType::Q4_K>(w, k / 256 * 144, n_out, k, x, n_x, y, stream);
      break;
    case GgmlType::Q6_K:
      if (k % 256 != 0) return cudaErrorInvalidValue;
      launch<GgmlType::Q6_K>(w, k / 256 * 210, n_out, k, x, n_x, y, stream);
      break;
    case GgmlType::Q2_K:
      if (k % 256 != 0) return cudaErrorInvalidValue;
      launch<GgmlType::Q2_K>(w, k / 256 * 84, n_out, k, x, n_x, y, stream);
      break;
    case GgmlType::Q3_K:
      if (k % 256 != 0) return cudaErrorInvalidValue;
      launch<GgmlType::Q3_K>(w, k / 256 * 110, n_out, k, x, n_x, y, stream);
      break;
    case GgmlType::IQ4_XS:
      if (k % 256 != 0) return cudaErrorInvalidValue;
      launch<GgmlType::IQ4_XS>(w, k / 256 * 136, n_out, k, x, n_x, y, stream);
      break;
    case GgmlType::IQ4_NL:
      if (k % 32 != 0) return cudaErrorInvalidValue;
      launch<GgmlType::IQ4_NL>(w, k / 32 * 18, n_out, k, x, n_x, y, stream);
      break;
    case GgmlType::MXFP4:
      if (k % 32 != 0) return cudaErrorInvalidValue;
      launch<GgmlType::MXFP4>(w, k / 32 * 17, n_out, k, x, n_x, y, stream);
      break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace fathom::cuda
