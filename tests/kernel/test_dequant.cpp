// Dequantization: ref::dequantize_row against hand-computed values and the fp16/bf16
// conversions against the compiler's _Float16; cpu::dequantize_row == ref bit-exact for every
// format and every SIMD level this machine has, on random valid blocks.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "kernels/quant_blocks.h"
#include "kernels/ref/dequant.h"

namespace fathom {
namespace {

const GgmlType kFormats[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16,   GgmlType::Q4_0,
                             GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,   GgmlType::Q8_0,
                             GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K,   GgmlType::Q5_K,
                             GgmlType::Q6_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS, GgmlType::MXFP4};
const char* kLevels[] = {"portable", "avx2", "avx512"};

// Byte offsets of the f16 scale fields inside one block.
std::vector<int> f16_fields(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0: case GgmlType::Q5_0: case GgmlType::Q8_0: return {0};
    case GgmlType::IQ4_NL: case GgmlType::IQ4_XS: return {0};
    case GgmlType::Q4_1: case GgmlType::Q5_1: case GgmlType::Q4_K: case GgmlType::Q5_K: return {0, 2};
    case GgmlType::Q2_K: return {80, 82};
    case GgmlType::Q3_K: return {108};
    case GgmlType::Q6_K: return {208};
    default: return {};
  }
}

// Random bytes, with every float field finite (f16 scales, F16/BF16/F32 elements), so that
// bit comparison is meaningful. Subnormal and huge f16 scales are included on purpose.
std::vector<uint8_t> random_row(GgmlType t, int64_t n, std::mt19937& rng) {
  const size_t bytes = ggml_row_size(t, n);
  std::vector<uint8_t> v(bytes);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  auto finite_f16 = [&] {
    uint16_t h;
    do h = static_cast<uint16_t>(rng()); while (((h >> 10) & 0x1F) == 0x1F);
    return h;
  };
  if (t == GgmlType::F16 || t == GgmlType::BF16) {
    for (size_t i = 0; i + 1 < bytes; i += 2) {
      uint16_t h = finite_f16();
      if (t == GgmlType::BF16) do h = static_cast<uint16_t>(rng()); while (((h >> 7) & 0xFF) == 0xFF);
      std::memcpy(&v[i], &h, 2);
    }
  } else if (t == GgmlType::F32) {
    for (size_t i = 0; i + 3 < bytes; i += 4) {
      uint32_t u;
      do u = static_cast<uint32_t>(rng()); while (((u >> 23) & 0xFF) == 0xFF);
      std::memcpy(&v[i], &u, 4);
    }
  } else {
    const int64_t ts = ggml_info(t).type_size;
    for (size_t blk = 0; blk < bytes; blk += ts)
      for (int off : f16_fields(t)) {
        const uint16_t h = finite_f16();
        std::memcpy(&v[blk + off], &h, 2);
      }
  }
  return v;
}

TEST(Fp16, ToFp32MatchesCompilerForAllHalfValues) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float want = static_cast<float>(std::bit_cast<_Float16>(static_cast<uint16_t>(h)));
    const float got = ref::fp16_to_fp32(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << h;
    } else {
      ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want)) << "h=" << h;
    }
  }
}

TEST(Fp16, FromFp32RoundsToNearestEven) {
  std::mt19937 rng(1);
  for (int i = 0; i < 2000000; ++i) {
    uint32_t u = static_cast<uint32_t>(rng());
    if (i % 2) u = (u & 0x8FFFFFFFu) | 0x30000000u;  // half the samples near the f16 range
    const float f = std::bit_cast<float>(u);
    if (std::isnan(f)) continue;
    const uint16_t want = std::bit_cast<uint16_t>(static_cast<_Float16>(f));
    ASSERT_EQ(ref::fp32_to_fp16(f), want) << "f=" << f << " bits=" << u;
  }
  EXPECT_EQ(ref::fp32_to_fp16(65520.0f), 0x7C00);  // tie above max rounds to inf
  EXPECT_EQ(ref::fp32_to_fp16(65519.0f), 0x7BFF);
  EXPECT_EQ(ref::fp32_to_fp16(std::ldexp(1.0f, -25)), 0x0000);  // tie to even zero
  EXPECT_EQ(ref::fp32_to_fp16(std::ldexp(1.5f, -25)), 0x0001);
}

TEST(Bf16, ToFp32IsShift) {
  EXPECT_EQ(ref::bf16_to_fp32(0x3F80), 1.0f);
  EXPECT_EQ(ref::bf16_to_fp32(0xC040), -3.0f);
}

TEST(RefDequant, HandComputedBlocks) {
  using namespace quant;
  float y[256];
  BlockQ8_0 q8{};
  q8.d = ref::fp32_to_fp16(0.5f);
  for (int i = 0; i < 32; ++i) q8.qs[i] = static_cast<int8_t>(i - 16);
  ref::dequantize_row(GgmlType::Q8_0, &q8, y, 32);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(y[i], 0.5f * (i - 16));

  BlockQ4_1 q41{};
  q41.d = ref::fp32_to_fp16(2.0f);
  q41.m = ref::fp32_to_fp16(-1.0f);
  for (int i = 0; i < 16; ++i) q41.qs[i] = static_cast<uint8_t>(i | ((15 - i) << 4));
  ref::dequantize_row(GgmlType::Q4_1, &q41, y, 32);
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(y[i], 2.0f * i - 1.0f);
    EXPECT_EQ(y[i + 16], 2.0f * (15 - i) - 1.0f);
  }

  BlockQ5_0 q50{};
  q50.d = ref::fp32_to_fp16(1.0f);
  const uint32_t qh = 0x80000001u;  // 5th bit set for elements 0 and 31
  std::memcpy(q50.qh, &qh, 4);
  ref::dequantize_row(GgmlType::Q5_0, &q50, y, 32);
  EXPECT_EQ(y[0], 0.0f);     // (0 | 16) - 16
  EXPECT_EQ(y[1], -16.0f);   // 0 - 16
  EXPECT_EQ(y[31], 0.0f);

  BlockQ6_K q6{};
  q6.d = ref::fp32_to_fp16(1.0f);
  for (int i = 0; i < 16; ++i) q6.scales[i] = static_cast<int8_t>(i + 1);
  q6.ql[0] = 0x21;  // element 0: low nibble 1; element 64: high nibble 2
  q6.qh[0] = 0x03 | (0x01 << 4);  // element 0: +48; element 64: +16
  ref::dequantize_row(GgmlType::Q6_K, &q6, y, 256);
  EXPECT_EQ(y[0], 1.0f * (49 - 32));
  EXPECT_EQ(y[64], 5.0f * (18 - 32));  // scale index 4 for elements 64..79
  EXPECT_EQ(y[255], 16.0f * -32);

  BlockQ3_K q3{};
  q3.d = ref::fp32_to_fp16(0.5f);
  q3.scales[0] = 0x21;   // sub-block 0: low 4 bits 1; sub-block 8: low 4 bits 2
  q3.scales[8] = 0x02;   // sub-block 0: high 2 bits 2 -> 33 - 32 = 1
  q3.qs[0] = 0x03;       // element 0: low bits 3
  q3.hmask[0] = 0x01;    // element 0: 3rd bit set (no -4); element 32 (bit 1 clear): 0 - 4
  q3.hmask[1] = 0x10;    // element 129 (h 1, j 0, l 1): 3rd bit set
  ref::dequantize_row(GgmlType::Q3_K, &q3, y, 256);
  EXPECT_EQ(y[0], 0.5f * 1 * 3);
  EXPECT_EQ(y[32], 0.5f * -32 * -4);  // sub-block 2: scale bits all zero -> -32
  EXPECT_EQ(y[129], 0.5f * (2 - 32) * 0);  // sub-block 8: 2 - 32, q 0
  EXPECT_EQ(y[128], 0.5f * (2 - 32) * -4);

  BlockIQ4_XS iq{};
  iq.d = ref::fp32_to_fp16(0.25f);
  iq.scales_l[0] = 0x53;              // group 0: low 4 bits 3; group 1: 5
  iq.scales_h = 0x2 | (0x3 << 14);    // group 0: high bits 2 -> 35 - 32 = 3; group 7: 48 - 32 = 16
  iq.qs[0] = 0xF0;                    // element 0: level 0 (-127); element 16: level 15 (113)
  ref::dequantize_row(GgmlType::IQ4_XS, &iq, y, 256);
  EXPECT_EQ(y[0], 0.25f * 3 * -127);
  EXPECT_EQ(y[16], 0.25f * 3 * 113);
  EXPECT_EQ(y[32], 0.25f * (5 - 32) * -127);
  EXPECT_EQ(y[255], 0.25f * 16 * -127);

  BlockMXFP4 mx{};
  mx.e = 128;       // scale 2^(128 - 127) / 2 = 1 (the values are E2M1 doubled)
  mx.qs[0] = 0xF7;  // element 0: index 7 (12); element 16: index 15 (-12)
  mx.qs[1] = 0x01;  // element 1: index 1 (1)
  ref::dequantize_row(GgmlType::MXFP4, &mx, y, 32);
  EXPECT_EQ(y[0], 12.0f);
  EXPECT_EQ(y[16], -12.0f);
  EXPECT_EQ(y[1], 1.0f);
  mx.e = 0;  // 2^-127 / 2: a subnormal scale
  ref::dequantize_row(GgmlType::MXFP4, &mx, y, 32);
  EXPECT_EQ(y[0], std::ldexp(12.0f, -128));

  BlockQ2_K q2{};
  q2.d = ref::fp32_to_fp16(2.0f);
  q2.dmin = ref::fp32_to_fp16(0.5f);
  q2.scales[0] = 0x35;  // sub-block 0: scale 5, min 3
  q2.qs[0] = 0x0E;      // element 0: 2; element 32: 3
  ref::dequantize_row(GgmlType::Q2_K, &q2, y, 256);
  EXPECT_EQ(y[0], 2.0f * 5 * 2 - 0.5f * 3);
  EXPECT_EQ(y[1], -1.5f);
  EXPECT_EQ(y[32], 0.0f);  // sub-block 2: scale 0, min 0
}

TEST(CpuDequant, BitExactWithRefOnRandomBlocks) {
  std::mt19937 rng(42);
  const int64_t lengths[] = {256, 1024, 4096};
  for (const char* level : kLevels) {
    if (!cpu::set_simd_level_for_testing(level)) {
      std::printf("[dequant] level %s not supported here, skipped\n", level);
      continue;
    }
    for (GgmlType t : kFormats) {
      for (int64_t n : lengths) {
        const int64_t rows = 3;
        std::vector<uint8_t> w;
        for (int r = 0; r < rows; ++r) {
          const auto row = random_row(t, n, rng);
          w.insert(w.end(), row.begin(), row.end());
        }
        std::vector<float> want(n), got(n);
        for (int64_t r = 0; r < rows; ++r) {
          ref::dequantize_row(t, w.data() + r * ggml_row_size(t, n), want.data(), n);
          cpu::dequantize_row(t, w.data(), n, r, got.data());
          ASSERT_EQ(std::memcmp(want.data(), got.data(), n * sizeof(float)), 0)
              << ggml_type_name(t) << " level " << level << " n " << n << " row " << r;
        }
      }
    }
  }
  if (!cpu::set_simd_level_for_testing("avx512")) cpu::set_simd_level_for_testing("avx2");
}

TEST(CpuDequant, RejectsUnsupportedType) {
  float y[256];
  uint8_t buf[300] = {};
  EXPECT_THROW(cpu::dequantize_row(GgmlType::IQ2_XXS, buf, 256, 0, y), std::exception);
  EXPECT_THROW(ref::dequantize_row(GgmlType::IQ3_S, buf, y, 256), std::exception);
}

}  // namespace
}  // namespace fathom
