// Scalar reference dequantization: ggml's dequantize_row_* formulas, element for element.
// Bit-exactness with ggml / gguf-py depends on the rounding of every product and sum, so each
// product that is followed by an add goes through `rounded()`, which keeps the compiler
// from fusing the two into an FMA (possible when built with -march=native).
#include "kernels/ref/dequant.h"

#include <cstring>

#include "base/error.h"
#include "kernels/quant_blocks.h"

namespace fathom::ref {
namespace {

using namespace fathom::quant;

inline float rounded(float v) {
#if defined(__GNUC__) && defined(__x86_64__)
  __asm__("" : "+x"(v));
#elif defined(__GNUC__) && defined(__aarch64__)
  __asm__("" : "+w"(v));
#else
  volatile float t = v;
  v = t;
#endif
  return v;
}

float h2f(uint16_t h) { return fp16_to_fp32(h); }

void dequant_q4_0(const BlockQ4_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = h2f(b[i].d);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = static_cast<float>((b[i].qs[j] & 0xF) - 8) * d;
      y[j + 16] = static_cast<float>((b[i].qs[j] >> 4) - 8) * d;
    }
  }
}

void dequant_q4_1(const BlockQ4_1* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = h2f(b[i].d), m = h2f(b[i].m);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = rounded(static_cast<float>(b[i].qs[j] & 0xF) * d) + m;
      y[j + 16] = rounded(static_cast<float>(b[i].qs[j] >> 4) * d) + m;
    }
  }
}

void dequant_q5_0(const BlockQ5_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = h2f(b[i].d);
    const uint32_t qh = load_u32(b[i].qh);
    for (int j = 0; j < kQK / 2; ++j) {
      const int h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
      y[j] = static_cast<float>(((b[i].qs[j] & 0xF) | h0) - 16) * d;
      y[j + 16] = static_cast<float>(((b[i].qs[j] >> 4) | h1) - 16) * d;
    }
  }
}

void dequant_q5_1(const BlockQ5_1* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = h2f(b[i].d), m = h2f(b[i].m);
    const uint32_t qh = load_u32(b[i].qh);
    for (int j = 0; j < kQK / 2; ++j) {
      const int h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
      y[j] = rounded(static_cast<float>((b[i].qs[j] & 0xF) | h0) * d) + m;
      y[j + 16] = rounded(static_cast<float>((b[i].qs[j] >> 4) | h1) * d) + m;
    }
  }
}

void dequant_q8_0(const BlockQ8_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = h2f(b[i].d);
    for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(b[i].qs[j]) * d;
  }
}

void dequant_q4_k(const BlockQ4_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
    const uint8_t* q = b[i].qs;
    for (int j = 0; j < 8; j += 2, q += 32) {
      uint8_t sc, m;
      scale_min_k4(j, b[i].scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      scale_min_k4(j + 1, b[i].scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) *y++ = rounded(d1 * static_cast<float>(q[l] & 0xF)) - m1;
      for (int l = 0; l < 32; ++l) *y++ = rounded(d2 * static_cast<float>(q[l] >> 4)) - m2;
    }
  }
}

void dequant_q5_k(const BlockQ5_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
    const uint8_t* ql = b[i].qs;
    const uint8_t* qh = b[i].qh;
    for (int j = 0; j < 8; j += 2, ql += 32) {
      uint8_t sc, m;
      scale_min_k4(j, b[i].scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      scale_min_k4(j + 1, b[i].scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      const uint8_t u1 = static_cast<uint8_t>(1u << j), u2 = static_cast<uint8_t>(2u << j);
      for (int l = 0; l < 32; ++l)
        *y++ = rounded(d1 * static_cast<float>((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0))) - m1;
      for (int l = 0; l < 32; ++l)
        *y++ = rounded(d2 * static_cast<float>((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0))) - m2;
    }
  }
}

void dequant_q6_k(const BlockQ6_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h2f(b[i].d);
    const uint8_t* ql = b[i].ql;
    const uint8_t* qh = b[i].qh;
    const int8_t* sc = b[i].scales;
    for (int n = 0; n < kQKK; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l + 0] = d * sc[is + 0] * static_cast<float>(q1);
        y[l + 32] = d * sc[is + 2] * static_cast<float>(q2);
        y[l + 64] = d * sc[is + 4] * static_cast<float>(q3);
        y[l + 96] = d * sc[is + 6] * static_cast<float>(q4);
      }
    }
  }
}

// Q2_K, Q3_K, the IQ4 formats and MXFP4: every product is exact in f32 (at most 11 + 6 + 7 significant
// bits), so only Q2_K's subtraction of the min rounds and the SIMD kernels may multiply in any order.
void dequant_q2_k(const BlockQ2_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
    for (int e = 0; e < kQKK; ++e) {
      const int h = e / 128, j = (e % 128) / 32, l = e % 32;
      const uint8_t sc = b[i].scales[e / 16];
      const float dl = d * static_cast<float>(sc & 0xF), ml = dmin * static_cast<float>(sc >> 4);
      const int q = (b[i].qs[32 * h + l] >> (2 * j)) & 3;
      *y++ = rounded(dl * static_cast<float>(q)) - ml;
    }
  }
}

void dequant_q3_k(const BlockQ3_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h2f(b[i].d);
    int8_t sc[16];
    q3_k_scales(b[i].scales, sc);
    for (int e = 0; e < kQKK; ++e) {
      const int h = e / 128, j = (e % 128) / 32, l = e % 32;
      const float dl = d * static_cast<float>(sc[e / 16]);
      const int low = (b[i].qs[32 * h + l] >> (2 * j)) & 3;
      const int high = (b[i].hmask[l] >> (4 * h + j)) & 1;
      *y++ = dl * static_cast<float>(low - (high ? 0 : 4));
    }
  }
}

void dequant_iq4_nl(const BlockIQ4_NL* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = h2f(b[i].d);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = d * static_cast<float>(kIq4nlValues[b[i].qs[j] & 0xF]);
      y[j + 16] = d * static_cast<float>(kIq4nlValues[b[i].qs[j] >> 4]);
    }
  }
}

void dequant_iq4_xs(const BlockIQ4_XS* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h2f(b[i].d);
    for (int g = 0; g < 8; ++g, y += 32) {
      const float dl = d * static_cast<float>(iq4_xs_scale(b[i], g));
      const uint8_t* qs = b[i].qs + 16 * g;
      for (int j = 0; j < 16; ++j) {
        y[j] = dl * static_cast<float>(kIq4nlValues[qs[j] & 0xF]);
        y[j + 16] = dl * static_cast<float>(kIq4nlValues[qs[j] >> 4]);
      }
    }
  }
}

void dequant_mxfp4(const BlockMXFP4* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = e8m0_half(b[i].e);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = static_cast<float>(kMxfp4Values[b[i].qs[j] & 0xF]) * d;
      y[j + 16] = static_cast<float>(kMxfp4Values[b[i].qs[j] >> 4]) * d;
    }
  }
}

}  // namespace

float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F, mant = h & 0x3FF;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);  // inf / nan (payload kept, as hardware does)
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: renormalize
    int e = 113;
    uint32_t m = mant;
    while ((m & 0x400) == 0) {
      m <<= 1;
      --e;
    }
    bits = sign | (static_cast<uint32_t>(e) << 23) | ((m & 0x3FF) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t fp32_to_fp16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000;
  const uint32_t absx = x & 0x7FFFFFFF;
  if (absx > 0x7F800000) return static_cast<uint16_t>(sign | 0x7E00 | ((absx >> 13) & 0x3FF));  // nan
  if (absx >= 0x477FF000) return static_cast<uint16_t>(sign | 0x7C00);  // rounds to >= 65520: inf
  if (absx < 0x38800000) {  // result is subnormal or zero: round(|f| / 2^-24) to nearest even
    if (absx < 0x33000000) return static_cast<uint16_t>(sign);  // < 2^-25: rounds to zero
    const uint32_t e = absx >> 23, m = (absx & 0x7FFFFF) | 0x800000;
    const uint32_t shift = 126 - e;  // value = m * 2^(e - 150); half units are 2^-24
    const uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    const uint32_t r = q + ((rem > half || (rem == half && (q & 1))) ? 1 : 0);
    return static_cast<uint16_t>(sign | r);
  }
  // normal: rebias exponent, round mantissa 23 -> 10 bits to nearest even (carry may bump exp)
  const uint32_t base = absx - (112u << 23);
  const uint32_t r = base + 0xFFF + ((base >> 13) & 1);
  return static_cast<uint16_t>(sign | (r >> 13));
}

float bf16_to_fp32(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n) {
  const int64_t bs = ggml_info(type).block_size;
  FATHOM_CHECK(n % bs == 0, "row length not a multiple of the block size");
  const int64_t nb = n / bs;
  switch (type) {
    case GgmlType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case GgmlType::F16: {
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(h[i]);
      return;
    }
    case GgmlType::BF16: {
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(h[i]);
      return;
    }
    case GgmlType::Q4_0: return dequant_q4_0(static_cast<const BlockQ4_0*>(src), dst, nb);
    case GgmlType::Q4_1: return dequant_q4_1(static_cast<const BlockQ4_1*>(src), dst, nb);
    case GgmlType::Q5_0: return dequant_q5_0(static_cast<const BlockQ5_0*>(src), dst, nb);
    case GgmlType::Q5_1: return dequant_q5_1(static_cast<const BlockQ5_1*>(src), dst, nb);
    case GgmlType::Q8_0: return dequant_q8_0(static_cast<const BlockQ8_0*>(src), dst, nb);
    case GgmlType::Q4_K: return dequant_q4_k(static_cast<const BlockQ4_K*>(src), dst, nb);
    case GgmlType::Q5_K: return dequant_q5_k(static_cast<const BlockQ5_K*>(src), dst, nb);
    case GgmlType::Q6_K: return dequant_q6_k(static_cast<const BlockQ6_K*>(src), dst, nb);
    case GgmlType::Q2_K: return dequant_q2_k(static_cast<const BlockQ2_K*>(src), dst, nb);
    case GgmlType::Q3_K: return dequant_q3_k(static_cast<const BlockQ3_K*>(src), dst, nb);
    case GgmlType::IQ4_NL: return dequant_iq4_nl(static_cast<const BlockIQ4_NL*>(src), dst, nb);
    case GgmlType::IQ4_XS: return dequant_iq4_xs(static_cast<const BlockIQ4_XS*>(src), dst, nb);
    case GgmlType::MXFP4: return dequant_mxfp4(static_cast<const BlockMXFP4*>(src), dst, nb);
    default:
      break;
  }
  throw Error(std::string("dequantize_row: unsupported weight type ") + ggml_type_name(type));
}

}  // namespace fathom::ref
