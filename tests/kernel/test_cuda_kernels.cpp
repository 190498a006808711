// CUDA kernels run on the CPU through kernels/cuda/emu and compared with their references:
//   rms_norm               vs cpu::rms_norm (the formula is the spec; ref == cpu for this op)
// The .cu files are compiled by the host compiler into fathom_cuda_emu: exactly the source nvcc builds.
// Tolerances (|kernel - ref| <= atol + rtol * |ref|, no pass-rate thresholds):
//   rms_norm, f32:            atol 1e-6, rtol 2e-6 (f32 sum of squares vs the double spec)
// The attention kernels are tested in test_cuda_attention.cpp.
#include "kernels/cuda/rms_norm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "kernels/cpu/ops.h"

#include "tests/kernel/cuda_device_buffer.h"

namespace fathom {
namespace {

using testing::DeviceBuffer;

struct WorstError {
  double abs = 0, excess = -1e30;  // excess: |err| - bound, > 0 is a failure
  int64_t index = -1;
  void add(double got, double want, double atol, double rtol, int64_t i) {
    const double err = std::fabs(got - want), e = err - (atol + rtol * std::fabs(want));
    abs = std::max(abs, err);
    if (e > excess || !std::isfinite(got)) {
      excess = std::isfinite(got) ? e : 1e30;
      index = i;
    }
  }
};

TEST(CudaKernels, RmsNormMatchesCpu) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const double atol = 1e-6, rtol = 2e-6;
  struct Shape {
    int64_t rows, n;
  };
  for (const Shape s : {Shape{1, 1}, Shape{3, 7}, Shape{2, 31}, Shape{5, 83}, Shape{4, 255}, Shape{3, 256},
                        Shape{2, 257}, Shape{7, 769}, Shape{2, 2048}, Shape{1, 5125}}) {
    std::vector<float> x(s.rows * s.n), w(s.n), want(s.rows * s.n);
    for (float& v : x) v = normal(rng) * 3.0f;
    for (float& v : w) v = 1.0f + 0.1f * normal(rng);
    cpu::rms_norm(x.data(), w.data(), want.data(), s.rows, s.n, 1e-6f);
    DeviceBuffer<float> dx(x), dw(w), dy(x.size());
    ASSERT_EQ(cuda::rms_norm(dx.ptr, dw.ptr, dy.ptr, s.rows, s.n, 1e-6f, nullptr), cudaSuccess);
    const std::vector<float> got = dy.download();
    WorstError worst;
    for (size_t i = 0; i < got.size(); ++i) worst.add(got[i], want[i], atol, rtol, static_cast<int64_t>(i));
    std::printf("rms_norm rows=%ld n=%ld: worst |err| %.3g\n", static_cast<long>(s.rows), static_cast<long>(s.n),
                worst.abs);
    EXPECT_LE(worst.excess, 0.0) << "rows=" << s.rows << " n=" << s.n << " at " << worst.index;
  }
  // In place.
  std::vector<float> x(3 * 100), w(100, 0.5f), want(300);
  for (float& v : x) v = normal(rng);
  cpu::rms_norm(x.data(), w.data(), want.data(), 3, 100, 1e-5f);
  DeviceBuffer<float> dx(x), dw(w);
  ASSERT_EQ(cuda::rms_norm(dx.ptr, dw.ptr, dx.ptr, 3, 100, 1e-5f, nullptr), cudaSuccess);
  const std::vector<float> got = dx.download();
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], atol + rtol * std::fabs(want[i]));
}

}  // namespace
}  // namespace fathom
