// Portable matmul kernels (baseline x86-64 / any CPU): every format, written for clarity.
// Dequantization is the reference one; dot kernels dequantize 256-element chunks into a
// small buffer (kF32) or unpack 32-weight chunks to integers (kQ8).
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/cpu/matmul_kernels.h"
#include "kernels/quant_blocks.h"
#include "kernels/ref/dequant.h"

namespace fathom::cpu::detail {
namespace {

using namespace fathom::quant;

template <GgmlType T>
void dequant(const void* src, float* dst, int64_t n) {
  ref::dequantize_row(T, src, dst, n);
}

constexpr int64_t kChunk = 256;  // elements dequantized at a time (multiple of every block)

template <GgmlType T>
void dot_f32(const DotArgs& a, int64_t n0, int64_t n1) {
  const GgmlTypeInfo& info = ggml_info(T);
  alignas(64) float tmp[kChunk];
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = a.w + n * a.row_bytes;
    float acc[kMaxMr][8] = {};
    for (int64_t k0 = 0; k0 < a.K; k0 += kChunk) {
      const int64_t kc = std::min(kChunk, a.K - k0);
      ref::dequantize_row(T, row + k0 / info.block_size * info.type_size, tmp, kc);
      for (int m = 0; m < a.mr; ++m) {
        const float* x = a.x + m * a.ldx + k0;
        int64_t k = 0;
        for (; k + 8 <= kc; k += 8)
          for (int l = 0; l < 8; ++l) acc[m][l] += x[k + l] * tmp[k + l];
        for (; k < kc; ++k) acc[m][0] += x[k] * tmp[k];
      }
    }
    for (int m = 0; m < a.mr; ++m) {
      const float* s = acc[m];
      a.y[m * a.ldy + n] = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    }
  }
}

// 32 weights of chunk c of a row as integers: w[i] = scale[i / 16] * q[i] + min[i / 16].
struct Chunk32 {
  int8_t q[32];
  float scale[2];
  float min;
  float min_hi;  // min of elements 16..31 where it differs from `min` (Q2_K), else equal
};

template <GgmlType T>
void unpack32(const uint8_t* row, int64_t c, Chunk32* out) {
  using ref::fp16_to_fp32;
  out->min = 0.0f;
  if constexpr (T == GgmlType::Q2_K || T == GgmlType::Q3_K) {
    // Chunk c: elements 32 (c % 8) .. +31 of super-block c / 8, i.e. h = (c % 8) / 4, j = c % 4.
    using B = std::conditional_t<T == GgmlType::Q2_K, BlockQ2_K, BlockQ3_K>;
    const B& b = reinterpret_cast<const B*>(row)[c / 8];
    const int s = static_cast<int>(c % 8), h = s / 4, j = s % 4;
    for (int l = 0; l < 32; ++l) {
      int v = (b.qs[32 * h + l] >> (2 * j)) & 3;
      if constexpr (T == GgmlType::Q3_K) v -= (b.hmask[l] >> (4 * h + j)) & 1 ? 0 : 4;
      out->q[l] = static_cast<int8_t>(v);
    }
    const float d = fp16_to_fp32(b.d);
    if constexpr (T == GgmlType::Q2_K) {
      const float dmin = fp16_to_fp32(b.dmin);
      for (int t = 0; t < 2; ++t) out->scale[t] = d * static_cast<float>(b.scales[2 * s + t] & 0xF);
      out->min = -(dmin * static_cast<float>(b.scales[2 * s] >> 4));
      out->min_hi = -(dmin * static_cast<float>(b.scales[2 * s + 1] >> 4));
      return;
    } else {
      int8_t sc[16];
      q3_k_scales(b.scales, sc);
      for (int t = 0; t < 2; ++t) out->scale[t] = d * static_cast<float>(sc[2 * s + t]);
    }
  } else if constexpr (T == GgmlType::MXFP4) {
    const BlockMXFP4& b = reinterpret_cast<const BlockMXFP4*>(row)[c];
    for (int j = 0; j < 16; ++j) {
      out->q[j] = kMxfp4Values[b.qs[j] & 0xF];
      out->q[j + 16] = kMxfp4Values[b.qs[j] >> 4];
    }
    out->scale[0] = out->scale[1] = e8m0_half(b.e);
  } else if constexpr (T == GgmlType::IQ4_NL || T == GgmlType::IQ4_XS) {
    const uint8_t* qs;
    float d;
    if constexpr (T == GgmlType::IQ4_NL) {
      const BlockIQ4_NL& b = reinterpret_cast<const BlockIQ4_NL*>(row)[c];
      qs = b.qs;
      d = fp16_to_fp32(b.d);
    } else {
      const BlockIQ4_XS& b = reinterpret_cast<const BlockIQ4_XS*>(row)[c / 8];
      qs = b.qs + 16 * (c % 8);
      d = fp16_to_fp32(b.d) * static_cast<float>(iq4_xs_scale(b, static_cast<int>(c % 8)));
    }
    for (int j = 0; j < 16; ++j) {
      out->q[j] = kIq4nlValues[qs[j] & 0xF];
      out->q[j + 16] = kIq4nlValues[qs[j] >> 4];
    }
    out->scale[0] = out->scale[1] = d;
  } else if constexpr (T == GgmlType::Q4_0 || T == GgmlType::Q4_1) {
    using B = std::conditional_t<T == GgmlType::Q4_0, BlockQ4_0, BlockQ4_1>;
    const B& b = reinterpret_cast<const B*>(row)[c];
    const int off = T == GgmlType::Q4_0 ? 8 : 0;
    for (int j = 0; j < 16; ++j) {
      out->q[j] = static_cast<int8_t>((b.qs[j] & 0xF) - off);
      out->q[j + 16] = static_cast<int8_t>((b.qs[j] >> 4) - off);
    }
    out->scale[0] = out->scale[1] = fp16_to_fp32(b.d);
    if constexpr (T == GgmlType::Q4_1) out->min = fp16_to_fp32(b.m);
  } else if constexpr (T == GgmlType::Q5_0 || T == GgmlType::Q5_1) {
    using B = std::conditional_t<T == GgmlType::Q5_0, BlockQ5_0, BlockQ5_1>;
    const B& b = reinterpret_cast<const B*>(row)[c];
    const int off = T == GgmlType::Q5_0 ? 16 : 0;
    const uint32_t qh = load_u32(b.qh);
    for (int j = 0; j < 16; ++j) {
      out->q[j] = static_cast<int8_t>(((b.qs[j] & 0xF) | (((qh >> j) & 1) << 4)) - off);
      out->q[j + 16] = static_cast<int8_t>(((b.qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - off);
    }
    out->scale[0] = out->scale[1] = fp16_to_fp32(b.d);
    if constexpr (T == GgmlType::Q5_1) out->min = fp16_to_fp32(b.m);
  } else if constexpr (T == GgmlType::Q8_0) {
    const BlockQ8_0& b = reinterpret_cast<const BlockQ8_0*>(row)[c];
    for (int j = 0; j < 32; ++j) out->q[j] = b.qs[j];
    out->scale[0] = out->scale[1] = fp16_to_fp32(b.d);
  } else if constexpr (T == GgmlType::Q4_K || T == GgmlType::Q5_K) {
    using B = std::conditional_t<T == GgmlType::Q4_K, BlockQ4_K, BlockQ5_K>;
    const B& b = reinterpret_cast<const B*>(row)[c / 8];
    const int j = static_cast<int>(c % 8);
    uint8_t sc, m;
    scale_min_k4(j, b.scales, &sc, &m);
    const uint8_t* qs = b.qs + 32 * (j / 2);
    for (int l = 0; l < 32; ++l) {
      int v = j % 2 == 0 ? (qs[l] & 0xF) : (qs[l] >> 4);
      if constexpr (T == GgmlType::Q5_K) v |= ((b.qh[l] >> j) & 1) << 4;
      out->q[l] = static_cast<int8_t>(v);
    }
    out->scale[0] = out->scale[1] = fp16_to_fp32(b.d) * sc;
    out->min = -(fp16_to_fp32(b.dmin) * m);
  } else if constexpr (T == GgmlType::Q6_K) {
    const BlockQ6_K& b = reinterpret_cast<const BlockQ6_K*>(row)[c / 8];
    const int j = static_cast<int>(c % 8), h = j / 4, t = j % 4;
    const uint8_t* ql = b.ql + 64 * h + (t & 1) * 32;
    const uint8_t* qh = b.qh + 32 * h;
    for (int l = 0; l < 32; ++l) {
      const int lo = t < 2 ? (ql[l] & 0xF) : (ql[l] >> 4);
      out->q[l] = static_cast<int8_t>((lo | (((qh[l] >> (2 * t)) & 3) << 4)) - 32);
    }
    const float d = fp16_to_fp32(b.d);
    out->scale[0] = d * b.scales[8 * h + 2 * t];
    out->scale[1] = d * b.scales[8 * h + 2 * t + 1];
  }
  out->min_hi = out->min;
}

template <GgmlType T>
void dot_q8(const DotArgs& a, int64_t n0, int64_t n1) {
  const int64_t nc = a.K / 32;
  Chunk32 ch;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = a.w + n * a.row_bytes;
    float acc[kMaxMr] = {};
    for (int64_t c = 0; c < nc; ++c) {
      unpack32<T>(row, c, &ch);
      for (int m = 0; m < a.mr; ++m) {
        const int8_t* q = a.q + m * a.ldq + c * 32;
        int32_t s0 = 0, s1 = 0;
        for (int i = 0; i < 16; ++i) s0 += ch.q[i] * q[i];
        for (int i = 16; i < 32; ++i) s1 += ch.q[i] * q[i];
        const float dx = a.qd[m * a.ldqs + c];
        float mins;
        if constexpr (T == GgmlType::Q2_K) {
          const int16_t* q16 = a.qsum16 + m * 2 * a.ldqs + 2 * c;
          mins = ch.min * static_cast<float>(q16[0]) + ch.min_hi * static_cast<float>(q16[1]);
        } else {
          mins = ch.min * static_cast<float>(a.qsum[m * a.ldqs + c]);
        }
        acc[m] += dx * (ch.scale[0] * static_cast<float>(s0) + ch.scale[1] * static_cast<float>(s1) + mins);
      }
    }
    for (int m = 0; m < a.mr; ++m) a.y[m * a.ldy + n] = acc[m];
  }
}

void quantize_q8(const float* x, int64_t K, int8_t* q, float* qd, int32_t* qsum, int16_t* qsum16) {
  for (int64_t b = 0; b < K / 32; ++b, x += 32, q += 32) {
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int32_t s[2] = {0, 0};
    for (int i = 0; i < 32; ++i) {
      q[i] = static_cast<int8_t>(std::nearbyint(x[i] * id));
      s[i / 16] += q[i];
    }
    qd[b] = d;
    qsum[b] = s[0] + s[1];
    qsum16[2 * b] = static_cast<int16_t>(s[0]);
    qsum16[2 * b + 1] = static_cast<int16_t>(s[1]);
  }
}

void gemm_f32(const float* x, int64_t ldx, const float* w, int64_t ldw, int64_t M, int64_t N,
              int64_t K, float* y, int64_t ldy, bool accumulate) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      const float* xr = x + m * ldx;
      const float* wr = w + n * ldw;
      float s[8] = {};
      int64_t k = 0;
      for (; k + 8 <= K; k += 8)
        for (int l = 0; l < 8; ++l) s[l] += xr[k + l] * wr[k + l];
      for (; k < K; ++k) s[0] += xr[k] * wr[k];
      const float v = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
      y[m * ldy + n] = accumulate ? y[m * ldy + n] + v : v;
    }
}

template <GgmlType T>
void fill(KernelTable& t) {
  const int f = fmt_index(T);
  t.dequant[f] = dequant<T>;
  t.dot_f32[f] = dot_f32<T>;
  if constexpr (T != GgmlType::F32 && T != GgmlType::F16 && T != GgmlType::BF16) t.dot_q8[f] = dot_q8<T>;
}

}  // namespace

const KernelTable& portable_kernels() {
  static const KernelTable t = [] {
    KernelTable k;
    fill<GgmlType::F32>(k);
    fill<GgmlType::F16>(k);
    fill<GgmlType::BF16>(k);
    fill<GgmlType::Q4_0>(k);
    fill<GgmlType::Q4_1>(k);
    fill<GgmlType::Q5_0>(k);
    fill<GgmlType::Q5_1>(k);
    fill<GgmlType::Q8_0>(k);
    fill<GgmlType::Q4_K>(k);
    fill<GgmlType::Q5_K>(k);
    fill<GgmlType::Q6_K>(k);
    fill<GgmlType::Q2_K>(k);
    fill<GgmlType::Q3_K>(k);
    fill<GgmlType::IQ4_NL>(k);
    fill<GgmlType::IQ4_XS>(k);
    fill<GgmlType::MXFP4>(k);
    k.quantize_q8 = quantize_q8;
    k.gemm_f32 = gemm_f32;
    return k;
  }();
  return t;
}

}  // namespace fathom::cpu::detail
