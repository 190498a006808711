// The mixture-of-experts kernels of kernels/cuda/moe.h under the emulator, against plain loops:
//   grouped_gemv (F32, F16, Q8_0, IQ4_NL, MXFP4, Q2_K, Q3_K, Q4_K, Q6_K, IQ4_XS): each item's rows
//     against a double dot over its expert's ref-dequantized rows; tolerance as quant_gemv's
//     (test_backend_ops): |err| <= 1e-6 + 2.5e-7·Σ|w·x| (f32 products and per-lane sums, a 32-lane tree);
//     items of 1..4 rows, experts skipped and repeated, odd n_out; rows outside every item untouched
//   grouped_gemm (the same formats and BF16): the same comparison; tolerance |err| <= 1e-6 +
//     k·2⁻²⁴·Σ|w·x| (each output an f32 sum over k in order: the recursive-summation bound);
//     items of 64 rows (a full tile), 6, 1 and 37 (not multiples of the 64-row tile or of a
//     thread's 4 rows), an expert with no pairs, n_out 5 and 70 (a partial 64-output tile),
//     k past the last 32-column stage (F32/F16/BF16: 72, and 45: no vector loads); rows outside
//     every item untouched
//   gather_rows: exact; combine_experts: exact against the same f32 sum in slot order.
#include "kernels/cuda/moe.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "kernels/ggml_type.h"
#include "kernels/ref/dequant.h"
#include "tests/kernel/cuda_device_buffer.h"
#include "tests/kernel/random_rows.h"

namespace fathom {
namespace {

// Expert e's rows of `w` (stride bytes apart) against every item's rows of x, in double.
void expect_items_match(GgmlType type, const std::vector<uint8_t>& w, int64_t stride, int64_t n_out, int64_t k,
                        const std::vector<float>& x, const std::vector<float>& got,
                        const std::vector<cuda::ExpertRows>& items, double rel_tol, const char* what) {
  const int64_t row_bytes = static_cast<int64_t>(ggml_row_size(type, k));
  double worst = 0;
  std::vector<float> row(k);
  for (const cuda::ExpertRows& it : items)
    for (int64_t n = 0; n < n_out; ++n) {
      ref::dequantize_row(type, w.data() + it.expert * stride + n * row_bytes, row.data(), k);
      for (int32_t r = it.first; r < it.first + it.count; ++r) {
        double sum = 0, mag = 0;
        for (int64_t i = 0; i < k; ++i) {
          sum += static_cast<double>(row[i]) * x[r * k + i];
          mag += std::fabs(static_cast<double>(row[i]) * x[r * k + i]);
        }
        const double err = std::fabs(got[r * n_out + n] - sum);
        worst = std::max(worst, err / mag);
        EXPECT_LE(err, 1e-6 + rel_tol * mag) << what << " " << ggml_type_name(type) << " k=" << k << " n_out=" << n_out
                                             << " row " << r << " output " << n;
      }
    }
  std::printf("%s %-6s k=%ld n_out=%ld: worst |err|/Σ|wx| %.3g\n", what, ggml_type_name(type), static_cast<long>(k),
              static_cast<long>(n_out), worst);
}

using GroupedLaunch = cudaError_t (*)(GgmlType, const void*, int64_t, int64_t, int64_t, const float*, float*,
                                      const cuda::ExpertRows*, int32_t, cudaStream_t);

// `experts` experts of random `type` rows (n_out x k each, 16-byte aligned) and `rows` random
// activation rows through `launch` over `items`: every item's outputs against the double dot
// (expect_items_match), and the last row, which no item names, left untouched.
void check_grouped(GroupedLaunch launch, const char* what, GgmlType type, int64_t n_out, int64_t k, int32_t experts,
                   const std::vector<cuda::ExpertRows>& items, int64_t rows, double rel_tol, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t row_bytes = static_cast<int64_t>(ggml_row_size(type, k));
  const int64_t stride = (n_out * row_bytes + 15) / 16 * 16;  // each expert 16-byte aligned
  std::vector<uint8_t> w(static_cast<size_t>(experts * stride));
  for (int32_t e = 0; e < experts; ++e) {
    const std::vector<uint8_t> expert_rows = test::random_rows(type, n_out, k, rng);
    std::copy(expert_rows.begin(), expert_rows.end(), w.begin() + e * stride);
  }
  std::vector<float> x(static_cast<size_t>(rows * k));
  for (float& v : x) v = normal(rng);
  const float kUntouched = 12345.0f;
  std::vector<float> y0(static_cast<size_t>(rows * n_out), kUntouched);
  testing::DeviceBuffer<uint8_t> dw(w);
  testing::DeviceBuffer<float> dx(x), dy(y0);
  testing::DeviceBuffer<cuda::ExpertRows> ditems(items);
  ASSERT_EQ(launch(type, dw.ptr, stride, n_out, k, dx.ptr, dy.ptr, ditems.ptr, static_cast<int32_t>(items.size()), nullptr),
            cudaSuccess);
  const std::vector<float> got = dy.download();
  expect_items_match(type, w, stride, n_out, k, x, got, items, rel_tol, what);
  for (int64_t n = 0; n < n_out; ++n) EXPECT_EQ(got[(rows - 1) * n_out + n], kUntouched);
}

// The shapes `launch` must refuse with cudaErrorInvalidValue.
void expect_refusals(GroupedLaunch launch, const std::vector<cuda::ExpertRows>& items) {
  testing::DeviceBuffer<float> dx(256);
  testing::DeviceBuffer<cuda::ExpertRows> ditems(items);
  EXPECT_EQ(launch(GgmlType::Q4_K, dx.ptr, 0, 1, 96, dx.ptr, dx.ptr, ditems.ptr, 1, nullptr),
            cudaErrorInvalidValue);  // k not a multiple of 256
  EXPECT_EQ(launch(GgmlType::Q4_0, dx.ptr, 0, 1, 256, dx.ptr, dx.ptr, ditems.ptr, 1, nullptr),
            cudaErrorInvalidValue);  // no kernel for Q4_0
  EXPECT_EQ(launch(GgmlType::F32, dx.ptr, 8, 1, 32, dx.ptr, dx.ptr, ditems.ptr, 1, nullptr),
            cudaErrorInvalidValue);  // an expert stride off 16-byte alignment
}

TEST(CudaMoe, GroupedGemvMatchesDequantizedDot) {
  std::mt19937 rng(48);
  constexpr int32_t kExperts = 5;
  // Expert 0: 3 rows (one item), 1: none, 2: 6 rows (items of 4 and 2), 3: 1 row, 4: 4 rows.
  const std::vector<cuda::ExpertRows> items = {{0, 0, 3}, {2, 3, 4}, {2, 7, 2}, {3, 9, 1}, {4, 10, 4}};
  constexpr int64_t kRows = 15;  // the last row is in no item
  for (const GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::Q8_0, GgmlType::IQ4_NL, GgmlType::MXFP4,
                              GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::IQ4_XS}) {
    const int64_t block = ggml_info(type).block_size;
    const int64_t k = block == 256 ? 512 : 96;
    for (const int64_t n_out : {1, 7, 48})
      check_grouped(cuda::grouped_gemv, "grouped_gemv", type, n_out, k, kExperts, items, kRows, 2.5e-7, rng);
  }
  expect_refusals(cuda::grouped_gemv, items);
}

TEST(CudaMoe, GroupedGemmMatchesDequantizedDot) {
  std::mt19937 rng(4848);
  constexpr int32_t kExperts = 4;
  // Expert 0: 70 rows (a full tile of 64, then 6), 1: none, 2: 1 row, 3: 37 rows.
  const std::vector<cuda::ExpertRows> items = {{0, 0, 64}, {0, 64, 6}, {2, 70, 1}, {3, 71, 37}};
  constexpr int64_t kRows = 109;  // the last row is in no item
  static_assert(cuda::kGroupedGemmRows == 64, "the items above are sized for 64-row tiles");
  for (const GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::IQ4_NL,
                              GgmlType::MXFP4, GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q6_K,
                              GgmlType::IQ4_XS}) {
    const int64_t block = ggml_info(type).block_size;
    const std::vector<int64_t> ks = block == 256 ? std::vector<int64_t>{512}
                                    : block == 32 ? std::vector<int64_t>{96}
                                                  : std::vector<int64_t>{72, 45};
    for (const int64_t k : ks)
      for (const int64_t n_out : {5, 70})
        check_grouped(cuda::grouped_gemm, "grouped_gemm", type, n_out, k, kExperts, items, kRows,
                      static_cast<double>(k) * 0x1p-24, rng);
  }
  expect_refusals(cuda::grouped_gemm, items);
  testing::DeviceBuffer<float> dx(256);
  testing::DeviceBuffer<cuda::ExpertRows> ditems(items);
  EXPECT_EQ(cuda::grouped_gemm(GgmlType::F32, dx.ptr, 0, 1, 32, dx.ptr, dx.ptr, ditems.ptr, 0, nullptr),
            cudaSuccess);  // no items: nothing to do
}

TEST(CudaMoe, GatherAndCombineMatchLoops) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  constexpr int64_t kTokens = 5, kWidth = 37;
  constexpr int32_t kUsed = 3;
  std::vector<float> x(kTokens * kWidth), y(kTokens * kUsed * kWidth), weight(kTokens * kUsed);
  for (float& v : x) v = normal(rng);
  for (float& v : y) v = normal(rng);
  for (float& v : weight) v = std::fabs(normal(rng));
  std::vector<int32_t> pair(kTokens * kUsed), token(kTokens * kUsed);
  for (int32_t i = 0; i < kTokens * kUsed; ++i) pair[i] = (i * 7) % (kTokens * kUsed);  // a permutation
  for (int32_t i = 0; i < kTokens * kUsed; ++i) token[pair[i]] = i / kUsed;
  testing::DeviceBuffer<float> dx(x), dy(y), dw(weight), dg(kTokens * kUsed * kWidth), dout(kTokens * kWidth);
  testing::DeviceBuffer<int32_t> dpair(pair), dtoken(token);
  ASSERT_EQ(cuda::gather_rows(dx.ptr, dtoken.ptr, kTokens * kUsed, kWidth, dg.ptr, nullptr), cudaSuccess);
  ASSERT_EQ(cuda::combine_experts(dy.ptr, dpair.ptr, dw.ptr, kTokens, kUsed, kWidth, dout.ptr, nullptr), cudaSuccess);
  const std::vector<float> gathered = dg.download(), out = dout.download();
  for (int64_t p = 0; p < kTokens * kUsed; ++p)
    for (int64_t d = 0; d < kWidth; ++d) EXPECT_EQ(gathered[p * kWidth + d], x[token[p] * kWidth + d]);
  for (int64_t t = 0; t < kTokens; ++t)
    for (int64_t d = 0; d < kWidth; ++d) {
      float s = 0.0f;
      for (int32_t j = 0; j < kUsed; ++j) s += weight[pair[t * kUsed + j]] * y[pair[t * kUsed + j] * kWidth + d];
      EXPECT_EQ(out[t * kWidth + d], s);
    }
}

}  // namespace
}  // namespace fathom
