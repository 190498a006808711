// cpu::matmul against a double-precision reference computed from ref::dequantize_row, for
// every weight format, every SIMD level this machine has, both precisions, 1 and 2 threads,
// over a shape grid with odd sizes (M in {1,3,4,17,64}, N in {1,7,83,256}, K: one block,
// several blocks, ~769 rounded up to the block size).
//
// Tolerances, with S = sum_k |x[m][k]| |W[n][k]| (per output element):
//   kF32: |y - ref| <= 1e-5 * S. Weights are exact after dequantization; the only error is
//     f32 rounding in products and sums (<= ~K * 2^-24 * S in the worst case, far less in
//     practice because the kernels sum in many independent partial sums).
//   kQ8:  |y - ref| <= 1.001 * B + 1e-5 * S with B = sum over 32-blocks b of
//     (max_{k in b} |x[m][k]| / 127) / 2 * sum_{k in b} |W[n][k]|: each activation is
//     rounded to a multiple of d_b = max|x| / 127, i.e. moved by at most d_b / 2, and the
//     integer dot product of the quantized values is exact, so the result is
//     sum_k W[n][k] * xhat[k] up to f32 rounding of the block scales (the 1e-5 * S term).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "kernels/ref/dequant.h"

namespace fathom {
namespace {

const char* kLevels[] = {"portable", "avx2", "avx512"};

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

// N rows of K elements: random quant bytes with random scales of magnitude 2^-7..2^-2
// (mins too), or normal values for the float formats.
std::vector<uint8_t> random_weights(GgmlType t, int64_t N, int64_t K, std::mt19937& rng) {
  const size_t row = ggml_row_size(t, K);
  std::vector<uint8_t> w(row * N);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  if (t == GgmlType::F32) {
    for (size_t i = 0; i < w.size(); i += 4) {
      const float f = normal(rng);
      std::memcpy(&w[i], &f, 4);
    }
    return w;
  }
  if (t == GgmlType::F16 || t == GgmlType::BF16) {
    for (size_t i = 0; i < w.size(); i += 2) {
      const float f = normal(rng);
      uint32_t u;
      std::memcpy(&u, &f, 4);
      const uint16_t h = t == GgmlType::F16 ? ref::fp32_to_fp16(f) : static_cast<uint16_t>(u >> 16);
      std::memcpy(&w[i], &h, 2);
    }
    return w;
  }
  for (auto& b : w) b = static_cast<uint8_t>(rng());
  if (t == GgmlType::MXFP4) {  // the E8M0 scale: 2^-7 .. 2^-2 (the values are doubled: e8m0_half)
    for (size_t blk = 0; blk < w.size(); blk += 17) w[blk] = static_cast<uint8_t>(121 + rng() % 6);
    return w;
  }
  std::uniform_real_distribution<float> expo(-7.0f, -2.0f);
  const int64_t ts = ggml_info(t).type_size;
  for (size_t blk = 0; blk < w.size(); blk += ts)
    for (int off : f16_fields(t)) {
      const float s = std::exp2(expo(rng)) * (rng() % 2 ? 1.0f : -1.0f);
      const uint16_t h = ref::fp32_to_fp16(s);
      std::memcpy(&w[blk + off], &h, 2);
    }
  return w;
}

struct Worst {
  double f32_dot = 0;   // max |err| / S, kF32, M <= 4 (dot kernels)
  double f32_gemm = 0;  // max |err| / S, kF32, M > 4 (dequantized tile GEMM)
  double q8 = 0;        // max |err| / (1.001 B + 1e-5 S), kQ8 (must stay <= 1)
  double q8_rel = 0;    // max |err| / S, kQ8 (for information)
  double q8_rel_plain = 0;  // the same without the outlier row (m = 2): normal activations
  int packed_calls = 0;     // kQ8 calls over PackedWeights panels
  double packed_vs_stored = 0;  // max |packed - stored kQ8| / S (must stay <= 1e-5)
};

void check_format(GgmlType t, Worst* worst_out) {
  std::mt19937 rng(static_cast<uint32_t>(t) * 7919u + 1);
  const int64_t bs = ggml_info(t).block_size;
  std::vector<int64_t> ks = {bs, bs == 1 ? 48 : 3 * bs, (769 + bs - 1) / bs * bs};
  // Packed kernels take up to 8 rows a call, stored ones 4: 15 = 8 + 7 (4 + 4 + 4 + 3), 6 = 4 + 2.
  const int64_t Ms[] = {1, 3, 6, 15, 64};
  const int64_t Ns[] = {1, 7, 83, 256};
  ThreadPool pool1(1), pool2(2);
  for (int64_t K : ks) {
    const int64_t Nmax = 256;
    const auto W = random_weights(t, Nmax, K, rng);
    std::vector<float> Wf(Nmax * K);
    for (int64_t n = 0; n < Nmax; ++n)
      ref::dequantize_row(t, W.data() + n * ggml_row_size(t, K), Wf.data() + n * K, K);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(64 * K);
    for (auto& v : x) v = normal(rng);
    for (int64_t k = 0; k < std::min<int64_t>(K, 32); ++k) x[K + k] = 0.0f;  // a zero block (row 1)
    for (int64_t k = 0; k < K; k += 97) x[2 * K + k] *= 100.0f;              // outliers (row 2)
    for (int64_t M : Ms)
      for (int64_t N : Ns) {
        // Reference and error scales: ref[m][n], S[m][n], B[m][n].
        std::vector<double> ref(M * N), S(M * N), B(M * N);
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = 0; n < N; ++n) {
            double r = 0, s = 0, b = 0;
            const float* xr = &x[m * K];
            const float* wr = &Wf[n * K];
            for (int64_t k0 = 0; k0 < K; k0 += 32) {
              double amax = 0, wabs = 0;
              for (int64_t k = k0; k < std::min(K, k0 + 32); ++k) {
                r += static_cast<double>(xr[k]) * wr[k];
                s += std::fabs(static_cast<double>(xr[k]) * wr[k]);
                amax = std::max(amax, std::fabs(static_cast<double>(xr[k])));
                wabs += std::fabs(wr[k]);
              }
              b += amax / 127.0 / 2.0 * wabs;
            }
            ref[m * N + n] = r;
            S[m * N + n] = s;
            B[m * N + n] = b;
          }
        // kQ8 also over the panels of PackedWeights where this level has a packed kernel.
        std::unique_ptr<cpu::PackedWeights> packed;
        if (cpu::PackedWeights::supported(t)) packed = std::make_unique<cpu::PackedWeights>(t, W.data(), N, K);
        struct Variant {
          cpu::Precision p;
          const cpu::PackedWeights* packed;
        };
        std::vector<Variant> variants{{cpu::Precision::kF32, nullptr}, {cpu::Precision::kQ8, nullptr}};
        if (packed) variants.push_back({cpu::Precision::kQ8, packed.get()});
        for (ThreadPool* pool : {&pool1, &pool2}) {
          std::vector<float> stored_q8;  // the kQ8 result over the stored layout, for the packed one
          for (const Variant& v : variants) {
            const cpu::Precision p = v.p;
            std::vector<float> y(M * N, std::nanf(""));
            cpu::matmul(*pool, t, W.data(), N, K, x.data(), M, y.data(), p, v.packed);
            if (p == cpu::Precision::kQ8 && !v.packed) stored_q8 = y;
            if (v.packed) {
              ++worst_out->packed_calls;
              // Same integer dot products as the stored kernels; only f32 summation order (and the
              // stored kernels' float removal of the unsigned offset) differ.
              for (int64_t i = 0; i < M * N; ++i) {
                const double diff = std::fabs(static_cast<double>(y[i]) - stored_q8[i]);
                worst_out->packed_vs_stored = std::max(worst_out->packed_vs_stored, diff / (S[i] + 1e-30));
                if (!(diff <= 1e-5 * S[i] + 1e-30)) {
                  ADD_FAILURE() << ggml_type_name(t) << " packed vs stored kQ8, M " << M << " N " << N << " K " << K
                                << " at " << i << ": " << y[i] << " vs " << stored_q8[i];
                  return;
                }
              }
            }
            const bool q8 = p == cpu::Precision::kQ8 && bs > 1;
            for (int64_t i = 0; i < M * N; ++i) {
              const double err = std::fabs(y[i] - ref[i]);
              const double tol = q8 ? 1.001 * B[i] + 1e-5 * S[i] : 1e-5 * S[i];
              if (!(err <= tol + 1e-30)) {
                ADD_FAILURE() << ggml_type_name(t) << " level " << cpu::simd_level() << (q8 ? " kQ8" : " kF32")
                              << (v.packed ? " packed" : "")
                              << " threads " << pool->size() << " M " << M << " N " << N << " K " << K
                              << " at m " << i / N << " n " << i % N << ": got " << y[i] << " want "
                              << ref[i] << " err " << err << " tol " << tol;
                return;
              }
              if (q8) {
                worst_out->q8 = std::max(worst_out->q8, err / (1.001 * B[i] + 1e-5 * S[i] + 1e-30));
                worst_out->q8_rel = std::max(worst_out->q8_rel, err / (S[i] + 1e-30));
                if (i / N != 2) worst_out->q8_rel_plain = std::max(worst_out->q8_rel_plain, err / (S[i] + 1e-30));
              } else {
                double& w = M <= 4 ? worst_out->f32_dot : worst_out->f32_gemm;
                w = std::max(w, err / (S[i] + 1e-30));
              }
            }
          }
        }
      }
  }
}

class MatmulTest : public ::testing::TestWithParam<GgmlType> {};

TEST_P(MatmulTest, MatchesDoubleReferenceAtEveryLevel) {
  const GgmlType t = GetParam();
  for (const char* level : kLevels) {
    if (!cpu::set_simd_level_for_testing(level)) {
      std::printf("[matmul] %-5s level %-8s not supported here, skipped\n", ggml_type_name(t), level);
      continue;
    }
    Worst w;
    check_format(t, &w);
    std::printf("[matmul] %-5s %-8s worst kF32 err/S: dot %.2e, gemm %.2e | kQ8 err/bound %.3f, err/S %.2e"
                " (%.2e without the outlier row) | %d packed calls, |packed - stored|/S %.1e\n",
                ggml_type_name(t), level, w.f32_dot, w.f32_gemm, w.q8, w.q8_rel, w.q8_rel_plain, w.packed_calls,
                w.packed_vs_stored);
  }
  if (!cpu::set_simd_level_for_testing("avx512")) cpu::set_simd_level_for_testing("avx2");
}

INSTANTIATE_TEST_SUITE_P(AllFormats, MatmulTest,
                         ::testing::Values(GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q4_0,
                                           GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0,
                                           GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K,
                                           GgmlType::Q6_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS, GgmlType::MXFP4),
                         [](const ::testing::TestParamInfo<GgmlType>& i) { return std::string(ggml_type_name(i.param)); });

// kQ8 rows are bitwise independent of the batch: row m of an M-row call equals the 1-row call
// on that activation row, at 1 and 2 threads, and a weight row's result does not depend on
// where in the matrix (which chunk, which kernel call, which panel lane) it sits — for the
// stored layout and for PackedWeights. Batch invariance and exact
// recompute-preemption rely on this.
TEST_P(MatmulTest, Q8RowsAreBitwiseIndependentOfBatchThreadsAndPosition) {
  const GgmlType t = GetParam();
  const int64_t bs = ggml_info(t).block_size;
  if (bs == 1) GTEST_SKIP() << "float formats have no kQ8 path";
  std::mt19937 rng(static_cast<uint32_t>(t) + 99);
  // M = 70: packed calls of 64 rows (accumulators in memory) and 6, or of 8 rows (registers) and 6.
  const int64_t K = (600 + bs - 1) / bs * bs, N = 83, M = 70;
  const auto W = random_weights(t, N, K, rng);
  const size_t row = ggml_row_size(t, K);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(M * K);
  for (auto& v : x) v = normal(rng);
  ThreadPool pool1(1), pool2(2);
  for (const char* level : kLevels) {
    if (!cpu::set_simd_level_for_testing(level)) continue;
    // The stored layout, then (where this level has a kernel for it) PackedWeights panels.
    for (const bool use_packed : {false, true}) {
      if (use_packed && !cpu::PackedWeights::supported(t)) continue;
      std::unique_ptr<cpu::PackedWeights> packed, packed_tail;
      if (use_packed) {
        packed = std::make_unique<cpu::PackedWeights>(t, W.data(), N, K);
        packed_tail = std::make_unique<cpu::PackedWeights>(t, W.data() + 5 * row, N - 5, K);
      }
      const char* layout = use_packed ? " packed" : " stored";
      std::vector<float> full(M * N), full8(M * N);
      cpu::matmul(pool2, t, W.data(), N, K, x.data(), M, full.data(), cpu::Precision::kQ8, packed.get());
      const int rows_before = cpu::set_packed_rows_per_call_for_testing(8);
      cpu::matmul(pool2, t, W.data(), N, K, x.data(), M, full8.data(), cpu::Precision::kQ8, packed.get());
      cpu::set_packed_rows_per_call_for_testing(rows_before);
      ASSERT_EQ(std::memcmp(full.data(), full8.data(), full.size() * 4), 0) << ggml_type_name(t) << " " << level << layout;
      for (int64_t m : {0, 3, 12, 16, 63, 64, 69}) {
        for (ThreadPool* pool : {&pool1, &pool2}) {
          std::vector<float> one(N);
          cpu::matmul(*pool, t, W.data(), N, K, &x[m * K], 1, one.data(), cpu::Precision::kQ8, packed.get());
          for (int64_t n = 0; n < N; ++n)
            ASSERT_EQ(std::memcmp(&one[n], &full[m * N + n], 4), 0) << ggml_type_name(t) << " " << level << layout
                                                                    << " m " << m << " n " << n << " threads " << pool->size();
        }
        // Rows 5.. as their own matrix: each row lands at another position in the chunks
        // (and, packed, in another panel and lane).
        std::vector<float> tail(N - 5);
        cpu::matmul(pool1, t, W.data() + 5 * row, N - 5, K, &x[m * K], 1, tail.data(), cpu::Precision::kQ8,
                    packed_tail.get());
        for (int64_t n = 5; n < N; ++n)
          ASSERT_EQ(std::memcmp(&tail[n - 5], &full[m * N + n], 4), 0) << ggml_type_name(t) << " " << level << layout
                                                                      << " n " << n;
      }
    }
  }
  if (!cpu::set_simd_level_for_testing("avx512")) cpu::set_simd_level_for_testing("avx2");
}

// matmul_group gives exactly what separate matmul calls give, for mixed formats and both
// precisions (kQ8: one shared quantization and one job; kF32: the calls in sequence), with the
// stored layouts, with every target packed (where the level packs, block-major activations for
// M > 1) and with some packed (row-major activations for all).
TEST(Matmul, GroupEqualsSeparateCalls) {
  std::mt19937 rng(5);
  const int64_t K = 512;
  const GgmlType types[] = {GgmlType::Q4_1, GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::Q4_K};
  const int64_t Ns[] = {576, 7, 192, 33};
  std::vector<std::vector<uint8_t>> ws;
  std::vector<std::unique_ptr<cpu::PackedWeights>> packs;
  for (int i = 0; i < 4; ++i) {
    ws.push_back(random_weights(types[i], Ns[i], K, rng));
    packs.push_back(cpu::PackedWeights::supported(types[i])
                        ? std::make_unique<cpu::PackedWeights>(types[i], ws[i].data(), Ns[i], K)
                        : nullptr);
  }
  std::normal_distribution<float> normal(0.0f, 1.0f);
  ThreadPool pool(2);
  for (const int packed_targets : {0, 4, 2})
    for (int64_t M : {1, 3, 9, 70})
      for (cpu::Precision p : {cpu::Precision::kQ8, cpu::Precision::kF32}) {
        std::vector<float> x(M * K);
        for (auto& v : x) v = normal(rng);
        std::vector<std::vector<float>> got(4), want(4);
        cpu::MatmulTarget targets[4];
        for (int i = 0; i < 4; ++i) {
          const cpu::PackedWeights* packed = i < packed_targets ? packs[i].get() : nullptr;
          got[i].assign(M * Ns[i], std::nanf(""));
          want[i].assign(M * Ns[i], 0.0f);
          targets[i] = {types[i], ws[i].data(), Ns[i], got[i].data(), packed};
          cpu::matmul(pool, types[i], ws[i].data(), Ns[i], K, x.data(), M, want[i].data(), p, packed);
        }
        cpu::matmul_group(pool, targets, 4, K, x.data(), M, p);
        for (int i = 0; i < 4; ++i)
          ASSERT_EQ(std::memcmp(got[i].data(), want[i].data(), got[i].size() * 4), 0)
              << "target " << i << " M " << M << (p == cpu::Precision::kQ8 ? " kQ8" : " kF32") << " packed targets "
              << packed_targets;
      }
}

// Where the CPU and OS allow AMX-INT8, batched Q4_K, Q6_K and Q8_0 run on tiles (5-16 rows a call) and
// fewer rows on the AVX-512 VNNI kernels: every row must be the same bits both ways, for every
// call size (1-16 rows, partial tiles), a partial last panel, K of one and of several
// super-blocks, both activation layouts a matmul_group can give, and the panel-end stores.
TEST(Matmul, AmxRowsAreTheVnniRows) {
  if (!cpu::set_simd_level_for_testing("avx512") || !cpu::set_amx_matmul_for_testing(true))
    GTEST_SKIP() << "no AMX-INT8 here (CPU or OS)";
  std::mt19937 rng(21);
  ThreadPool pool(2);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const GgmlType t : {GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0})
    for (const int64_t K : {256, 1024, 1312}) {  // 1312: Q8_0's 41 blocks, a last step of one
      if (K % ggml_info(t).block_size != 0) continue;
      const int64_t N = 37;  // 3 panels, the last with 5 rows
      const auto W = random_weights(t, N, K, rng);
      const cpu::PackedWeights packed(t, W.data(), N, K);
      const int64_t M = 53;  // calls of 16, 16, 16 and 5 rows
      std::vector<float> x(M * K);
      for (auto& v : x) v = normal(rng);
      for (const int rows : {0, 5, 7, 13}) {
        const int before = cpu::set_packed_rows_per_call_for_testing(rows);
        std::vector<float> amx(M * N), vnni(M * N);
        ASSERT_STREQ(cpu::amx_matmul(), "amx");
        cpu::matmul(pool, t, W.data(), N, K, x.data(), M, amx.data(), cpu::Precision::kQ8, &packed);
        cpu::set_amx_matmul_for_testing(false);
        cpu::matmul(pool, t, W.data(), N, K, x.data(), M, vnni.data(), cpu::Precision::kQ8, &packed);
        cpu::set_amx_matmul_for_testing(true);
        cpu::set_packed_rows_per_call_for_testing(before);
        for (int64_t i = 0; i < M * N; ++i)
          ASSERT_EQ(std::memcmp(&amx[i], &vnni[i], 4), 0)
              << ggml_type_name(t) << " K " << K << " rows a call " << rows << " m " << i / N << " n " << i % N
              << ": " << amx[i] << " vs " << vnni[i];
      }
      // A group of two packed targets quantizes once, block-major where the table reads it.
      std::vector<float> g0(M * N), g1(M * N), one(M * N);
      cpu::MatmulTarget targets[2] = {{t, W.data(), N, g0.data(), &packed}, {t, W.data(), N, g1.data(), &packed}};
      cpu::matmul_group(pool, targets, 2, K, x.data(), M, cpu::Precision::kQ8);
      cpu::set_amx_matmul_for_testing(false);
      cpu::matmul(pool, t, W.data(), N, K, x.data(), M, one.data(), cpu::Precision::kQ8, &packed);
      cpu::set_amx_matmul_for_testing(true);
      ASSERT_EQ(std::memcmp(g0.data(), one.data(), one.size() * 4), 0) << ggml_type_name(t) << " group, K " << K;
      ASSERT_EQ(std::memcmp(g1.data(), one.data(), one.size() * 4), 0) << ggml_type_name(t) << " group, K " << K;
    }
}

// Model load packs each matrix's panels on the backend's pool: the same bytes as one thread.
TEST(Matmul, PackingOnAPoolWritesTheSameBytes) {
  std::mt19937 rng(9);
  const int64_t K = 512, N = 197;  // 13 panels, the last one partial
  ThreadPool pool(2);
  for (const GgmlType t : {GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::Q4_1}) {
    if (!cpu::PackedWeights::supported(t)) continue;
    const std::vector<uint8_t> w = random_weights(t, N, K, rng);
    const size_t bytes = cpu::PackedWeights::bytes_for(t, N, K);
    std::vector<uint8_t> one(bytes + 64, 0xAB), many(bytes + 64, 0xAB);  // padding is not written
    uint8_t* a = one.data() + (64 - reinterpret_cast<uintptr_t>(one.data()) % 64) % 64;
    uint8_t* b = many.data() + (64 - reinterpret_cast<uintptr_t>(many.data()) % 64) % 64;
    cpu::PackedWeights serial(t, w.data(), N, K, a), parallel(t, w.data(), N, K, b, &pool);
    EXPECT_EQ(std::memcmp(a, b, bytes), 0) << ggml_type_name(t);
  }
}

TEST(Matmul, EmptyShapesAreNoOps) {
  ThreadPool pool(2);
  float y = 7.0f;
  const float x[32] = {};
  const uint8_t w[34] = {};
  cpu::matmul(pool, GgmlType::Q8_0, w, 0, 32, x, 1, &y);
  cpu::matmul(pool, GgmlType::Q8_0, w, 1, 32, x, 0, &y);
  EXPECT_EQ(y, 7.0f);
}

TEST(Matmul, RejectsUnsupportedTypeAndBadK) {
  ThreadPool pool(1);
  float y[4];
  const float x[64] = {};
  const uint8_t w[256] = {};
  EXPECT_THROW(cpu::matmul(pool, GgmlType::IQ2_XXS, w, 1, 256, x, 1, y), std::exception);
  EXPECT_THROW(cpu::matmul(pool, GgmlType::Q8_0, w, 1, 33, x, 1, y), std::exception);
}

}  // namespace
}  // namespace fathom
