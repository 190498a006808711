#pragma once
// Block layouts of the GGML weight formats fathom reads (byte-exact with ggml's block_*
// structs and gguf-py's quants.py), plus helpers every backend shares to decode them.
// A row of K elements is K / block_size consecutive blocks; f16 fields are raw IEEE half bits.
// Helpers are `static inline` on purpose: this header is included by files compiled with
// AVX-512/AVX2 flags, and an external inline copy from such a file could be chosen by the
// linker for baseline code.
#include <cstdint>
#include <cstring>

namespace fathom::quant {

constexpr int kQK = 32;    // elements per block of the *_0 / *_1 formats
constexpr int kQKK = 256;  // elements per super-block of the K-quants

struct BlockQ4_0 {  // w = d * (q - 8), q in [0, 15]
  uint16_t d;
  uint8_t qs[kQK / 2];  // element i: low nibble of qs[i]; element i + 16: high nibble
};
struct BlockQ4_1 {  // w = d * q + m
  uint16_t d, m;
  uint8_t qs[kQK / 2];
};
struct BlockQ5_0 {  // w = d * (q - 16), q = nibble | (bit i of qh) << 4
  uint16_t d;
  uint8_t qh[4];  // little-endian uint32: bit i is the 5th bit of element i
  uint8_t qs[kQK / 2];
};
struct BlockQ5_1 {  // w = d * q + m
  uint16_t d, m;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
struct BlockQ8_0 {  // w = d * q
  uint16_t d;
  int8_t qs[kQK];
};
// K-quants: 8 sub-blocks of 32 with 6-bit scale and min packed in `scales` (see scale_min_k4).
struct BlockQ4_K {  // w = d * sc[j] * q - dmin * m[j]
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qs[kQKK / 2];  // 4 chunks of 32 bytes; chunk c: low nibbles = sub-block 2c, high = 2c+1
};
struct BlockQ5_K {  // as Q4_K with a 5th bit: qh[i] bit j is the high bit of sub-block j, element i
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qh[kQKK / 8];
  uint8_t qs[kQKK / 2];
};
struct BlockQ6_K {  // w = d * scales[i / 16] * (q - 32), q 6 bits (see ref::dequantize_row)
  uint8_t ql[kQKK / 2];
  uint8_t qh[kQKK / 4];
  int8_t scales[kQKK / 16];
  uint16_t d;
};
// Q2_K and Q3_K: 16 sub-blocks of 16. Element e = 128 h + 32 j + l (h < 2, j < 4, l < 32) has its
// 2 low bits at bits 2j..2j+1 of qs[32 h + l] and belongs to sub-block e / 16.
struct BlockQ2_K {  // w = d * (scales[s] & 15) * q - dmin * (scales[s] >> 4), q 2 bits
  uint8_t scales[kQKK / 16];
  uint8_t qs[kQKK / 4];
  uint16_t d, dmin;
};
struct BlockQ3_K {  // w = d * (sc[s] - 32) * (q - 4 * !hbit), sc 6 bits (q3_k_scales), q 2 bits
  uint8_t hmask[kQKK / 8];  // hmask[l] bit 4h + j: the 3rd bit of element 128 h + 32 j + l
  uint8_t qs[kQKK / 4];
  uint8_t scales[12];
  uint16_t d;
};
// The IQ4 formats: a 4-bit index into a fixed non-linear table (kIq4nlValues), nibbles laid out
// as Q4_0's (element i of a 32-group: low nibble of qs[i], element i + 16: high nibble).
struct BlockIQ4_NL {  // w = d * kIq4nlValues[q]
  uint16_t d;
  uint8_t qs[kQK / 2];
};
struct BlockIQ4_XS {  // w = d * (ls[g] - 32) * kIq4nlValues[q] per 32-group g, ls 6 bits
  uint16_t d;
  uint16_t scales_h;             // bits 2g..2g+1: the high 2 bits of ls[g]
  uint8_t scales_l[kQKK / 64];   // nibble g % 2 of byte g / 2: the low 4 bits of ls[g]
  uint8_t qs[kQKK / 2];          // 16 bytes per 32-group
};

static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22 && sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ4_K) == 144 && sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockIQ4_NL) == 18 && sizeof(BlockIQ4_XS) == 136);
// MXFP4 (OCP microscaling, gpt-oss's experts): 32 E2M1 values sharing a power-of-two scale.
struct BlockMXFP4 {  // w = e8m0_half(e) * kMxfp4Values[q]; nibbles laid out as Q4_0's
  uint8_t e;         // E8M0 exponent: 2^(e - 127)
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockMXFP4) == 17);

// ggml's kvalues_iq4nl: the 16 levels of IQ4_NL / IQ4_XS. The same bytes as four little-endian
// words (kIq4nlWords) for code that cannot index a table (device code without local memory).
constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
constexpr uint32_t kIq4nlWords[4] = {0xBFAD9881u, 0xF6EADDCFu, 0x26190D01u, 0x71594535u};

// Unpacks the 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K super-block
// (ggml's get_scale_min_k4).
static inline void scale_min_k4(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

static inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// All 8 scales and mins of a Q4_K / Q5_K super-block at once (ggml's utmp trick): bytes
// 0..7 of out[0..1] are the scales, bytes 0..7 of out[2..3] the mins.
static inline void unpack_scales_mins_k4(const uint8_t* s, uint32_t out[4]) {
  constexpr uint32_t kmask1 = 0x3f3f3f3f, kmask2 = 0x0f0f0f0f, kmask3 = 0x03030303;
  const uint32_t u0 = load_u32(s), u1 = load_u32(s + 4), u2 = load_u32(s + 8);
  out[0] = u0 & kmask1;
  out[1] = (u2 & kmask2) | (((u0 >> 6) & kmask3) << 4);
  out[2] = u1 & kmask1;
  out[3] = ((u2 >> 4) & kmask2) | (((u1 >> 6) & kmask3) << 4);
}

// ggml's kvalues_mxfp4: E2M1 values doubled (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives x 2),
// hence the half in e8m0_half; as words for device code (kMxfp4Words).
constexpr int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
constexpr uint32_t kMxfp4Words[4] = {0x03020100u, 0x0C080604u, 0xFDFEFF00u, 0xF4F8FAFCu};

// 2^(e - 127) / 2 as an f32 (ggml's GGML_E8M0_TO_FP32_HALF: e < 2 gives a subnormal).
static inline float e8m0_half(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// The 16 signed scales (-32..31) of a Q3_K super-block: 6 bits each, the low 4 in nibble s / 8 of
// scales[s % 8], the high 2 at bits 2 (s / 4) of scales[8 + s % 4]; four scales per 32-bit word
// at once (ggml's kmask trick).
static inline void q3_k_scales(const uint8_t* s, int8_t out[16]) {
  constexpr uint32_t kLow2 = 0x03030303, kLow4 = 0x0f0f0f0f;
  const uint32_t a0 = load_u32(s), a1 = load_u32(s + 4), t = load_u32(s + 8);
  const uint32_t w[4] = {(a0 & kLow4) | (t & kLow2) << 4, (a1 & kLow4) | ((t >> 2) & kLow2) << 4,
                         ((a0 >> 4) & kLow4) | ((t >> 4) & kLow2) << 4, ((a1 >> 4) & kLow4) | ((t >> 6) & kLow2) << 4};
  uint8_t u[16];
  std::memcpy(u, w, 16);
  for (int i = 0; i < 16; ++i) out[i] = static_cast<int8_t>(u[i] - 32);
}

// The signed scale (-32..31) of 32-group g (0..7) of an IQ4_XS super-block.
static inline int iq4_xs_scale(const BlockIQ4_XS& b, int g) {
  return (((b.scales_l[g / 2] >> (4 * (g % 2))) & 0xF) | (((b.scales_h >> (2 * g)) & 3) << 4)) - 32;
}

}  // namespace fathom::quant
