// CUDA kernels run on the CPU through kernels/cuda/emu and compared with their references:
//   rms_norm               vs cpu::rms_norm (the formula is the spec; ref == cpu for this op)
//   paged_decode_attention vs ref::paged_attention
// The .cu files are included here so the host compiler builds exactly the source nvcc builds.
// Tolerances (|kernel - ref| <= atol + rtol * |ref|, no pass-rate thresholds):
//   rms_norm, f32:            atol 1e-6, rtol 2e-6 (f32 sum of squares vs the double spec)
//   attention, f32 and f16 KV: atol 1e-5 (outputs are convex combinations of |v| ~ 1 rows; both
//                              sides read identical f16 values, so f16 KV has the f32 bound;
//                              the slack over test_attention covers expf vs exp and the
//                              split merge's extra rounding)
#include "kernels/cuda/paged_decode_attention.cu"
#include "kernels/cuda/rms_norm.cu"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/ref/attention.h"

namespace fathom {
namespace {

// Device buffer on the emulated device, filled from / read back into host vectors.
template <typename T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t n = 0;
  explicit DeviceBuffer(size_t count) : n(count) { EXPECT_EQ(cudaMalloc(&ptr, std::max<size_t>(1, n) * sizeof(T)), cudaSuccess); }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) {
    cudaMemcpy(ptr, host.data(), n * sizeof(T), cudaMemcpyHostToDevice);
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  std::vector<T> download() const {
    std::vector<T> host(n);
    cudaMemcpy(host.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost);
    return host;
  }
};

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

struct AttnCase {
  int32_t head_dim, group, seq_len, n_q, window, keys_per_split;
  KvDtype dtype;
};

void run_attention_case(const AttnCase& c, std::mt19937& rng) {
  const int32_t block_size = 16, n_kv_heads = 2, n_heads = c.group * n_kv_heads;
  const int32_t n_blocks = (c.seq_len + block_size - 1) / block_size, physical = n_blocks + 3;
  std::vector<int32_t> perm(physical);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);  // logical order != physical order
  std::vector<int32_t> table(perm.begin(), perm.begin() + n_blocks);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t elems = static_cast<int64_t>(physical) * n_kv_heads * block_size * c.head_dim;
  std::vector<float> kf(elems), vf(elems), q(static_cast<size_t>(c.n_q) * n_heads * c.head_dim);
  for (float& x : kf) x = normal(rng);
  for (float& x : vf) x = normal(rng);
  for (float& x : q) x = normal(rng);
  const size_t bytes = kv_dtype_bytes(c.dtype);
  std::vector<uint8_t> k(elems * bytes), v(elems * bytes);
  cpu::kv_store(kf.data(), k.data(), c.dtype, elems);
  cpu::kv_store(vf.data(), v.data(), c.dtype, elems);

  PagedKvView host_kv;
  host_kv.k = k.data();
  host_kv.v = v.data();
  host_kv.dtype = c.dtype;
  host_kv.block_table = table.data();
  host_kv.block_size = block_size;
  host_kv.n_kv_heads = n_kv_heads;
  host_kv.head_dim = c.head_dim;
  AttentionArgs args;
  args.q = q.data();
  args.n_q = c.n_q;
  args.n_heads = n_heads;
  args.pos0 = c.seq_len - c.n_q;
  args.window = c.window;
  args.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  std::vector<float> want(q.size());
  args.out = want.data();
  ref::paged_attention(host_kv, args);

  DeviceBuffer<uint8_t> dk(k), dv(v);
  DeviceBuffer<int32_t> dtable(table);
  DeviceBuffer<float> dq(q), dout(q.size());
  PagedKvView dev_kv = host_kv;
  dev_kv.k = dk.ptr;
  dev_kv.v = dv.ptr;
  dev_kv.block_table = dtable.ptr;
  AttentionArgs dev_args = args;
  dev_args.q = dq.ptr;
  dev_args.out = dout.ptr;
  const cuda::DecodeAttentionPlan plan = cuda::plan_paged_decode_attention(dev_kv, dev_args, c.keys_per_split);
  DeviceBuffer<float> workspace(plan.workspace_floats);
  ASSERT_EQ(cuda::paged_decode_attention(dev_kv, dev_args, plan, plan.workspace_floats ? workspace.ptr : nullptr,
                                         nullptr),
            cudaSuccess);
  const std::vector<float> got = dout.download();
  WorstError worst;
  for (size_t i = 0; i < got.size(); ++i) worst.add(got[i], want[i], 1e-5, 0.0, static_cast<int64_t>(i));
  std::printf("attention %s d=%d group=%d S=%d n_q=%d window=%d chunk=%d splits=%d: worst |err| %.3g\n",
              kv_dtype_name(c.dtype), c.head_dim, c.group, c.seq_len, c.n_q, c.window, c.keys_per_split,
              plan.n_splits, worst.abs);
  EXPECT_LE(worst.excess, 0.0) << kv_dtype_name(c.dtype) << " d=" << c.head_dim << " group=" << c.group
                               << " S=" << c.seq_len << " n_q=" << c.n_q << " window=" << c.window
                               << " chunk=" << c.keys_per_split << " at " << worst.index;
}

TEST(CudaKernels, PagedDecodeAttentionMatchesRef) {
  std::mt19937 rng(11);
  const AttnCase cases[] = {
      // Sequence lengths: 1, below one block, exactly one block, odd multi-block, long.
      {64, 1, 1, 1, 0, 256, KvDtype::kF32},
      {64, 4, 7, 1, 0, 256, KvDtype::kF32},
      {128, 3, 16, 1, 0, 256, KvDtype::kF16},
      {128, 8, 83, 1, 0, 256, KvDtype::kF32},
      {128, 4, 83, 1, 0, 32, KvDtype::kF16},    // 3 splits, the last one partial
      {64, 2, 513, 1, 0, 64, KvDtype::kF32},    // 9 splits
      {256, 2, 300, 1, 0, 128, KvDtype::kF16},
      {256, 1, 769, 1, 0, 256, KvDtype::kF32},
      // Odd head dims (lane tails inside a warp), GQA group 1.
      {80, 1, 37, 1, 0, 16, KvDtype::kF32},
      {7, 2, 50, 1, 0, 256, KvDtype::kF16},
      {33, 3, 129, 1, 0, 40, KvDtype::kF32},
      {200, 2, 61, 1, 0, 20, KvDtype::kF16},
      // Sliding window, and several queries (a chunk past some queries' ranges is empty).
      {64, 2, 200, 1, 50, 16, KvDtype::kF32},
      {64, 2, 200, 1, 17, 256, KvDtype::kF16},
      {64, 4, 70, 5, 0, 16, KvDtype::kF32},
      {128, 2, 45, 4, 20, 8, KvDtype::kF16},
      // Keys fewer than the block's 4 warps, and chunks of one key.
      {32, 1, 3, 1, 0, 1, KvDtype::kF32},
      {32, 2, 2, 2, 0, 256, KvDtype::kF16},
  };
  for (const AttnCase& c : cases) run_attention_case(c, rng);
}

TEST(CudaKernels, PagedDecodeAttentionRejectsUnsupportedShapes) {
  PagedKvView kv;
  kv.n_kv_heads = 2;
  kv.head_dim = 257;
  AttentionArgs args;
  args.n_q = 1;
  args.n_heads = 4;
  const cuda::DecodeAttentionPlan plan = cuda::plan_paged_decode_attention(kv, args);
  EXPECT_EQ(cuda::paged_decode_attention(kv, args, plan, nullptr, nullptr), cudaErrorInvalidValue);
  kv.head_dim = 64;
  args.n_heads = 3;  // not a multiple of n_kv_heads
  EXPECT_EQ(cuda::paged_decode_attention(kv, args, plan, nullptr, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace fathom
