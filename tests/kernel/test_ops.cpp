// The element-wise exp work of kernels/cpu/ops.h at every SIMD level against double precision.
// Gated activations (cpu::silu_mul, cpu::gelu_tanh_mul) against the same formulas in double, over inputs from 1e-6 to 200 in magnitude
// (both signs, where exp and tanh saturate), lengths that leave a masked tail, and in place.
// Tolerance: |got - want| <= 4e-7 |want| + 1.2e-7 |g u|: the AVX-512 path computes exp with a
// polynomial (~2 ulp) and one division, the scalar path uses libm; the second term is f32
// rounding of 1 + tanh(y) near -1 (GELU of a large negative g is a tiny difference that neither
// path resolves, the scalar one returns 0).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"
#include "kernels/ref/dequant.h"

namespace fathom {
namespace {

double silu_ref(double g) { return g / (1.0 + std::exp(-g)); }
double gelu_ref(double g) { return 0.5 * g * (1.0 + std::tanh(0.7978845608028654 * (g + 0.044715 * g * g * g))); }

std::vector<float> inputs(int64_t n, std::mt19937& rng) {
  std::uniform_real_distribution<double> log_mag(std::log(1e-6), std::log(200.0));
  std::vector<float> x(n);
  for (float& v : x) v = static_cast<float>((rng() % 2 ? 1 : -1) * std::exp(log_mag(rng)));
  if (n > 3) x[0] = 0.0f, x[1] = -0.0f, x[2] = 88.0f, x[3] = -88.0f;
  return x;
}

TEST(Ops, GatedActivationsMatchDoubleReferenceAtEveryLevel) {
  std::mt19937 rng(3);
  for (const char* level : {"portable", "avx2", "avx512"}) {
    if (!cpu::set_simd_level_for_testing(level)) continue;
    for (const bool gelu : {false, true}) {
      double worst = 0;
      for (const int64_t n : {1, 15, 16, 17, 1536, 4099}) {
        const std::vector<float> g = inputs(n, rng), u = inputs(n, rng);
        std::vector<float> y = g;
        if (gelu) cpu::gelu_tanh_mul(y.data(), u.data(), n);
        else cpu::silu_mul(y.data(), u.data(), n);
        for (int64_t i = 0; i < n; ++i) {
          const double want = (gelu ? gelu_ref(g[i]) : silu_ref(g[i])) * u[i];
          const double err = std::fabs(y[i] - want);
          const double tol = 4e-7 * std::fabs(want) + 1.2e-7 * std::fabs(static_cast<double>(g[i]) * u[i]);
          ASSERT_LE(err, tol)
              << level << (gelu ? " gelu" : " silu") << " n " << n << " i " << i << " g " << g[i] << " u " << u[i]
              << " got " << y[i] << " want " << want;
          worst = std::max(worst, err / (tol + 1e-30));
        }
      }
      std::printf("[activation] %-8s %-9s worst error / tolerance %.3f\n", level, gelu ? "gelu_tanh" : "silu", worst);
    }
  }
  if (!cpu::set_simd_level_for_testing("avx512")) cpu::set_simd_level_for_testing("avx2");
}

// gpt-oss's clamped SwiGLU against transformers' formula in double: gate clamped above at 7, up
// to [-7, 7], (u + 1)·g·σ(1.702 g). Inputs span both clamps (|x| up to 200).
TEST(Ops, ClampedSwigluMatchesDoubleReference) {
  std::mt19937 rng(9);
  for (const int64_t n : {1, 17, 4099}) {
    const std::vector<float> g = inputs(n, rng), u = inputs(n, rng);
    std::vector<float> y = g;
    cpu::swiglu_oai_mul(y.data(), u.data(), n);
    int clamped = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double gc = std::min<double>(g[i], 7.0), uc = std::clamp<double>(u[i], -7.0, 7.0);
      clamped += g[i] > 7.0f || std::fabs(u[i]) > 7.0f;
      const double want = (uc + 1.0) * gc / (1.0 + std::exp(-1.702 * gc));
      ASSERT_LE(std::fabs(y[i] - want), 4e-7 * std::fabs(want) + 1e-7 * std::fabs(gc * (uc + 1.0)))
          << "g " << g[i] << " u " << u[i] << " got " << y[i] << " want " << want;
    }
    if (n > 100) {
      EXPECT_GT(clamped, 0);
    }
  }
}

// Softmax pieces (the sampler): exp_scaled_inplace writes exp((x - max) / T) and returns the sum;
// sum_exp returns Σ exp(x - max). Per element |got - want| <= (4e-7 + 1.2e-7 |arg|) want (the
// f32 argument's rounding; 0 below e^-87.5 is allowed: within 1e-38), sums within 1e-6
// relative; -inf gives exactly 0.
TEST(Ops, SoftmaxWeightsMatchDoubleAtEveryLevel) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  for (const char* level : {"portable", "avx2", "avx512"}) {
    if (!cpu::set_simd_level_for_testing(level)) continue;
    for (const int64_t n : {1, 17, 262144 + 5}) {
      std::vector<float> x(n);
      for (float& v : x) v = normal(rng);
      if (n > 1) {
        x[0] = -std::numeric_limits<float>::infinity();  // a banned token
        x[n - 1] = 30.0f;                                // the max
      }
      const float mx = *std::max_element(x.begin(), x.end());
      for (const float temperature : {0.7f, 1.0f, 2.5f}) {
        std::vector<float> w = x;
        const double sum = cpu::exp_scaled_inplace(w.data(), n, mx, 1.0f / temperature);
        double want_sum = 0.0;
        for (int64_t i = 0; i < n; ++i) {
          const double arg = (static_cast<double>(x[i]) - mx) / temperature;
          const double want = std::exp(arg);
          want_sum += want;
          // The argument is formed in f32: |arg| * 2^-23 of relative error on top of the exp's own.
          const double tol = std::isinf(arg) ? 0.0 : (4e-7 + std::fabs(arg) * 1.2e-7) * want + 1e-38;
          ASSERT_LE(std::fabs(w[i] - want), tol)
              << level << " n " << n << " i " << i << " x " << x[i];
        }
        if (n > 1) {
          EXPECT_EQ(w[0], 0.0f) << level;
        }
        EXPECT_NEAR(sum, want_sum, 1e-6 * want_sum) << level << " n " << n;
      }
      double want = 0.0;
      for (float v : x) want += std::exp(static_cast<double>(v) - mx);
      EXPECT_NEAR(cpu::sum_exp(x.data(), n, mx), want, 1e-6 * want) << level << " n " << n;
    }
  }
  if (!cpu::set_simd_level_for_testing("avx512")) cpu::set_simd_level_for_testing("avx2");
}

// RMS norm against double at every level: rows of lengths that leave a masked tail (and the
// models' 576, 640 and head 64 / 256), magnitudes 1e-3..1e3, in place and not. Both levels sum the
// squares in double and scale in f32 (x · inv, then · w): within 3 f32 roundings of the exact value.
TEST(Ops, RmsNormMatchesDoubleAtEveryLevel) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> log_mag(std::log(1e-3), std::log(1e3));
  for (const char* level : {"portable", "avx2", "avx512"}) {
    if (!cpu::set_simd_level_for_testing(level)) continue;
    for (const int64_t n : {1, 7, 8, 31, 33, 64, 256, 576, 640, 1000}) {
      const int64_t rows = 3;
      std::vector<float> x(rows * n), w(n), y(rows * n);
      for (float& v : x) v = static_cast<float>((rng() % 2 ? 1 : -1) * std::exp(log_mag(rng)));
      for (float& v : w) v = static_cast<float>(0.5 + (rng() % 1000) * 1e-3);
      for (const bool in_place : {false, true}) {
        std::vector<float> io = x;
        cpu::rms_norm(io.data(), w.data(), in_place ? io.data() : y.data(), rows, n, 1e-6f);
        const std::vector<float>& got = in_place ? io : y;
        for (int64_t r = 0; r < rows; ++r) {
          double ss = 0;
          for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[r * n + i]) * x[r * n + i];
          const double inv = 1.0 / std::sqrt(ss / static_cast<double>(n) + 1e-6);
          for (int64_t i = 0; i < n; ++i) {
            const double want = x[r * n + i] * inv * w[i];
            ASSERT_LE(std::fabs(got[r * n + i] - want), 3.6e-7 * std::fabs(want))
                << level << " n " << n << " row " << r << " i " << i;
          }
        }
      }
    }
  }
  if (!cpu::set_simd_level_for_testing("avx512")) cpu::set_simd_level_for_testing("avx2");
}

// The f16 KV store (cpu::kv_store) gives exactly ref::fp32_to_fp16's bits at every level: every
// finite f32 exponent (normal, f16-subnormal, underflow to 0, overflow to inf) with random
// mantissas, exact ties, ±0, ±inf, lengths that leave a masked tail.
TEST(Ops, F16KvStoreIsBitExactAtEveryLevel) {
  std::mt19937 rng(9);
  std::vector<float> x;
  for (uint32_t e = 0; e < 255; ++e)
    for (int j = 0; j < 24; ++j) {
      uint32_t mant = rng() & 0x7FFFFFu;
      if (j < 4) mant = (mant & ~0x1FFFu) | 0x1000u;  // exactly halfway between two f16 values
      const uint32_t bits = (static_cast<uint32_t>(j % 2) << 31) | (e << 23) | mant;
      float f;
      std::memcpy(&f, &bits, 4);
      x.push_back(f);
    }
  for (float f : {0.0f, -0.0f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                  65504.0f, 65520.0f, 6.1035156e-05f, 5.9604645e-08f, 2.9802322e-08f})
    x.push_back(f);
  for (const char* level : {"portable", "avx2", "avx512"}) {
    if (!cpu::set_simd_level_for_testing(level)) continue;
    for (const int64_t n : {int64_t{1}, int64_t{15}, int64_t{17}, static_cast<int64_t>(x.size())}) {
      std::vector<uint16_t> got(n, 0xFFFF);
      cpu::kv_store(x.data(), got.data(), KvDtype::kF16, n);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(got[i], ref::fp32_to_fp16(x[i])) << level << " n " << n << " x " << x[i];
    }
  }
  if (!cpu::set_simd_level_for_testing("avx512")) cpu::set_simd_level_for_testing("avx2");
}

}  // namespace
}  // namespace fathom
