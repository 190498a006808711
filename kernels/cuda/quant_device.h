#pragma once
// Device-side helpers to decode the GGML weight blocks of kernels/quant_blocks.h (whose
// helpers are host-only): half / bfloat16 bits, the 6-bit scales and mins of Q4_K, Q3_K's
// and IQ4_XS's 6-bit scales, the IQ4 levels and MXFP4's values and E8M0 scale. Shared by embedding.cu and quant_gemv.cu.
// Block layouts are quant::BlockQ8_0 (34 bytes), BlockIQ4_NL (18), BlockMXFP4 (17),
// BlockQ2_K (84), BlockQ3_K (110), BlockQ4_K (144), BlockIQ4_XS (136) and BlockQ6_K (210);
// Q2_K, Q4_K and IQ4_XS blocks are 4-byte aligned, MXFP4 blocks byte-aligned, the others
// 2-byte aligned.
#include <cstdint>

#include "kernels/quant_blocks.h"
#include "kernels/cuda/emu/cuda_emu.h"

namespace fathom::cuda::quant_device {

__device__ __forceinline__ float f16_bits(uint16_t h) {
#ifdef __CUDACC__
  return __half2float(__ushort_as_half(h));
#else
  return fathom_emu::f16_bits_to_f32(h);
#endif
}

__device__ __forceinline__ float bf16_bits(uint16_t h) {
#ifdef __CUDACC__
  return __uint_as_float(static_cast<uint32_t>(h) << 16);
#else
  return fathom_emu::bits_f32(static_cast<uint32_t>(h) << 16);
#endif
}

// Scale and min of sub-block j (0..7) of a Q4_K super-block: quant::scale_min_k4 on the device.
__device__ __forceinline__ void scale_min_k4(int j, const uint8_t* q, float* sc, float* m) {
  if (j < 4) {
    *sc = static_cast<float>(q[j] & 63);
    *m = static_cast<float>(q[j + 4] & 63);
  } else {
    *sc = static_cast<float>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<float>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// The signed scale (-32..31) of 16-element sub-block s (0..15) of a Q3_K super-block:
// quant::q3_k_scales for one s.
__device__ __forceinline__ float q3_k_scale(const uint8_t* scales, int s) {
  const int lo = (scales[s % 8] >> (4 * (s / 8))) & 0xF, hi = (scales[8 + s % 4] >> (2 * (s / 4))) & 3;
  return static_cast<float>((lo | hi << 4) - 32);
}

// The signed scale (-32..31) of 32-group g (0..7) of an IQ4_XS super-block at `blk`.
__device__ __forceinline__ float iq4_xs_scale(const uint8_t* blk, int g) {
  const int scales_h = blk[2] | blk[3] << 8;
  return static_cast<float>((((blk[4 + g / 2] >> (4 * (g % 2))) & 0xF) | (((scales_h >> (2 * g)) & 3) << 4)) - 32);
}

// quant::kIq4nlValues[i] (i < 16) from the table's four words: selects, no indexed local array.
__device__ __forceinline__ float iq4nl_level(uint32_t i) {
  const uint32_t w = i < 8 ? (i < 4 ? 0xBFAD9881u : 0xF6EADDCFu) : (i < 12 ? 0x26190D01u : 0x71594535u);
  return static_cast<float>(static_cast<int8_t>((w >> (8 * (i & 3))) & 0xFF));
}
static_assert(quant::kIq4nlWords[0] == 0xBFAD9881u && quant::kIq4nlWords[1] == 0xF6EADDCFu &&
                  quant::kIq4nlWords[2] == 0x26190D01u && quant::kIq4nlWords[3] == 0x71594535u,
              "iq4nl_level's words are kIq4nlValues");

// quant::kMxfp4Values[i] (i < 16), the same way.
__device__ __forceinline__ float mxfp4_value(uint32_t i) {
  const uint32_t w = i < 8 ? (i < 4 ? 0x03020100u : 0x0C080604u) : (i < 12 ? 0xFDFEFF00u : 0xF4F8FAFCu);
  return static_cast<float>(static_cast<int8_t>((w >> (8 * (i & 3))) & 0xFF));
}
static_assert(quant::kMxfp4Words[0] == 0x03020100u && quant::kMxfp4Words[1] == 0x0C080604u &&
                  quant::kMxfp4Words[2] == 0xFDFEFF00u && quant::kMxfp4Words[3] == 0xF4F8FAFCu,
              "mxfp4_value's words are kMxfp4Values");

// quant::e8m0_half on the device: 2^(e - 127) / 2.
__device__ __forceinline__ float e8m0_half(uint32_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : (e - 1) << 23;
#ifdef __CUDACC__
  return __uint_as_float(bits);
#else
  return fathom_emu::bits_f32(bits);
#endif
}

}  // namespace fathom::cuda::quant_device
