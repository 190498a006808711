#pragma once
// Device-side helpers to decode the GGML weight blocks of kernels/quant_blocks.h (whose
// helpers are host-only): half / bfloat16 bits, and the 6-bit scales and mins of Q4_K.
// Shared by embedding.cu and quant_gemv.cu. Block layouts are quant::BlockQ8_0 (34 bytes),
// quant::BlockQ4_K (144) and quant::BlockQ6_K (210); only Q4_K is 4-byte aligned.
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

}  // namespace fathom::cuda::quant_device
