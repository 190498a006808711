// CUDA decode-attention kernels run on the CPU through kernels/cuda/emu, against kernels/ref:
//   paged_decode_attention   vs ref::paged_attention
//   sparq_decode_attention   vs ref::sparq_attention
//   hip_estimate_mask / hip_sparse_attention vs ref::hip_estimate_mask / ref::hip_sparse_attention
//   bifurcated_attention     vs ref::bifurcated_attention
//   swa_attention            vs ref::swa_attention (output) and double softmax weights (weights)
//   swa_select / swa_fold    vs a naive max-pool + ref::swa_select, and the fold's two float ops:
//                            bit for bit (comparisons, one multiply and one add per position)
// plus, for every launch, the bytes its launcher reports vs the bytes the emulated grid touched
// (attention_common.h instruments every global load and store under emulation).
// The .cu files are compiled by the host compiler into fathom_cuda_emu: exactly the source nvcc builds.
//
// Tolerances, |kernel − ref| <= atol (outputs are convex combinations of |v| ~ 1 rows, so an
// absolute bound; no pass-rate thresholds). Both sides dequantize the same stored f16 / INT8
// values with the same formula, so every KV dtype has the same bound; the slack over f32
// rounding covers expf vs exp, the split merges and float vs double logits:
//   dtype      dense   sparq (own selection)   hip (own mask)   bifurcated   swa (out, weights)
//   f32        1e-5    2e-5                    1e-5             1e-5         1e-5, 1e-5·heads
//   f16        1e-5    2e-5                    1e-5             1e-5         1e-5, 1e-5·heads
//   int8       1e-5    2e-5                    1e-5             1e-5         1e-5, 1e-5·heads
// Selections (SparQ I1/I2, HiP blocks) are computed in float by the kernels and in double by
// ref, so near-ties may flip: the tests check overlap with ref's selection (stated per test) and
// the output over the kernel's own selection, recomputed by ref.
#include "kernels/cuda/bifurcated_attention.h"
#include "kernels/cuda/hip_attention.h"
#include "kernels/cuda/paged_decode_attention.h"
#include "kernels/cuda/sparq_attention.h"
#include "kernels/cuda/swa_attention.h"
#include "kernels/cuda/swa_mass.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kernels/ref/attention.h"
#include "kernels/ref/bifurcated.h"
#include "kernels/ref/hip.h"
#include "kernels/ref/swa.h"
#include "kernels/ref/sparq.h"
#include "tests/kernel/cuda_device_kv.h"

namespace fathom {
namespace {

using testing::PagedKvFixture;
using testing::make_paged_kv;

using testing::DeviceBuffer;
using testing::DeviceKv;

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
  float softcap = 0.0f;  // > 0: soft-capped logits (Gemma 2)
  bool sinks = false;    // attention sinks (gpt-oss), N(1, 1) per head
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
  args.softcap = c.softcap;
  std::vector<float> sinks(n_heads);
  std::normal_distribution<float> sink(1.0f, 1.0f);
  for (float& x : sinks) x = sink(rng);
  if (c.sinks) args.sinks = sinks.data();
  ref::paged_attention(f.view(), args);

  DeviceKv dkv(f);
  DeviceBuffer<float> dq(q), dout(q.size());
  const PagedKvView kv = dkv.view(f);
  AttentionArgs dargs = args;
  dargs.q = dq.ptr;
  dargs.out = dout.ptr;
  DeviceBuffer<float> dsinks(sinks);
  if (c.sinks) dargs.sinks = dsinks.ptr;
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

// Soft-capped logits (cap 1 over logits ~ N(0, 1): most of them bent) and attention sinks, one
// split and several (the merge kernel adds the sink), prefill rows and a window.
TEST(CudaAttention, DenseSoftCapsAndSinksMatchRef) {
  std::mt19937 rng(12);
  const DenseCase cases[] = {{64, 4, 83, 1, 0, 256, 1.0f},         {256, 2, 300, 1, 0, 64, 1.0f},
                             {128, 2, 45, 4, 20, 8, 1.0f},         {64, 4, 83, 1, 0, 256, 0.0f, true},
                             {256, 2, 300, 1, 0, 64, 0.0f, true},  {128, 2, 45, 4, 20, 8, 0.0f, true}};
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


std::vector<float> random_q(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> q(n);
  for (float& x : q) x = normal(rng);
  return q;
}

size_t overlap(std::vector<int32_t> a, std::vector<int32_t> b) {
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  std::vector<int32_t> both;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(both));
  return both.size();
}

// ---- SparQ ----------------------------------------------------------------------------------

struct SparqCase {
  int32_t head_dim, group, seq_len, k, l, r;
  bool reallocation, with_k_t, key_spread = false;
};

void run_sparq_case(const SparqCase& c, KvDtype dtype, std::mt19937& rng) {
  const int32_t n_kv = 2, n_heads = c.group * n_kv, d = c.head_dim, S = c.seq_len, pos = S - 1;
  PagedKvFixture f = make_paged_kv(d, n_kv, 16, dtype, S, 2, rng);
  std::vector<float> q = random_q(static_cast<size_t>(n_heads) * d, rng);
  if (c.key_spread) {  // keys as Gemma 3's: the first half of the components mean 3, spread 0.01
    for (size_t i = 0; i < f.kf.size(); ++i)
      if (static_cast<int32_t>(i % d) < d / 2) f.kf[i] = 3.0f + 0.01f * f.kf[i];
    f.store();
    for (size_t i = 0; i < q.size(); ++i)  // and the query largest along them: the weights decide
      if (static_cast<int32_t>(i % d) < d / 2) q[i] *= 3.0f;
  }
  std::vector<float> want(q.size());
  DecodeArgs args{q.data(), want.data(), n_heads, pos, 1.0f / std::sqrt(static_cast<float>(d))};
  std::vector<float> v_mean(static_cast<size_t>(n_kv) * d);  // what the kernel derives from v_sum
  for (int32_t g = 0; g < n_kv; ++g)
    for (int32_t c2 = 0; c2 < d; ++c2)
      v_mean[g * d + c2] = f.v_sum[(static_cast<size_t>(f.table[pos / 16]) * n_kv + g) * d + c2] / static_cast<float>(S);
  // With key_spread, the spread the kernel derives from the moments' M2 at pos.
  const std::vector<float> spread =
      c.key_spread ? ref::sparq_key_spread_of_moments(f.view(), S) : std::vector<float>(static_cast<size_t>(n_kv) * d, 1.0f);
  const ref::SparqStats st = ref::sparq_attention(f.view(), args, ref::SparqParams{c.k, c.l, c.r, c.reallocation},
                                                  v_mean.data(), c.key_spread ? spread.data() : nullptr);

  DeviceKv dkv(f);
  DeviceBuffer<float> dq(q), dout(q.size());
  const PagedKvView kv = dkv.view(f, c.with_k_t);
  DecodeArgs dargs{dq.ptr, dout.ptr, n_heads, pos, args.scale};
  const cuda::SparqPlan plan =
      cuda::plan_sparq_decode_attention(kv, dargs, cuda::SparqConfig{c.k, c.l, c.r, c.reallocation, c.key_spread}, 96, 24);
  ASSERT_EQ(plan.k, st.k);
  ASSERT_EQ(plan.l, st.l);
  ASSERT_EQ(plan.r, st.r);
  DeviceBuffer<int32_t> workspace(plan.workspace_words);
  cuda::attn_common::reset_byte_counters();
  ASSERT_EQ(cuda::sparq_decode_attention(kv, dargs, plan, workspace.ptr, nullptr), cudaSuccess);
  expect_bytes("sparq", cuda::sparq_decode_attention_bytes(kv, dargs, plan));
  const std::vector<float> got = dout.download();
  const std::vector<int32_t> words = workspace.download();
  auto word_f = [&](size_t i) {
    float x;
    std::memcpy(&x, &words[i], 4);
    return x;
  };

  // Recompute the output over the kernel's own I1 / I2 with ref's formulas (double).
  const PagedKvView host_kv = f.view();
  std::vector<float> own(q.size()), krow(d);
  size_t i2_overlap = 0, i2_total = 0;
  double alpha_err = 0;
  for (int32_t g = 0; g < n_kv; ++g) {
    const std::vector<int32_t> i1(words.begin() + plan.i1 + g * plan.r, words.begin() + plan.i1 + (g + 1) * plan.r);
    const std::vector<int32_t> i2(words.begin() + plan.i2 + g * plan.k, words.begin() + plan.i2 + (g + 1) * plan.k);
    for (int32_t t = S - plan.l; t < S; ++t)  // the forced window is always there
      EXPECT_NE(std::find(i2.begin(), i2.end(), t), i2.end()) << "forced position " << t << " missing";
    EXPECT_EQ(std::set<int32_t>(i2.begin(), i2.end()).size(), static_cast<size_t>(plan.k)) << "duplicates in I2";
    i2_overlap += overlap(i2, st.selected[g]);
    {  // I1: the top r of Σ_j |q_j[c]|·√σ[c] (σ = 1 without key_spread), in rank order.
      std::vector<double> a(d, 0.0);
      for (int32_t j = 0; j < c.group; ++j)
        for (int32_t c2 = 0; c2 < d; ++c2)
          a[c2] += std::fabs(q[(static_cast<size_t>(g) * c.group + j) * d + c2]) * std::sqrt(static_cast<double>(spread[g * d + c2]));
      std::vector<int32_t> order(d);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int32_t x, int32_t y) { return a[x] > a[y]; });
      EXPECT_EQ(i1, std::vector<int32_t>(order.begin(), order.begin() + plan.r)) << "I1 of kv head " << g;
    }
    i2_total += plan.k;
    for (int32_t j = 0; j < c.group; ++j) {
      const int32_t h = g * c.group + j;
      const float* qh = q.data() + static_cast<size_t>(h) * d;
      const float* sg = &spread[static_cast<size_t>(g) * d];
      double l1 = 0, l1_r = 0;
      for (int32_t c2 = 0; c2 < d; ++c2) l1 += std::fabs(qh[c2]) * std::sqrt(static_cast<double>(sg[c2]));
      for (int32_t c2 : i1) l1_r += std::fabs(qh[c2]) * std::sqrt(static_cast<double>(sg[c2]));
      const double factor = args.scale * (l1_r > 0 ? std::sqrt(l1 / l1_r) : 1.0);
      std::vector<double> s_hat(S);
      for (int32_t t = 0; t < S; ++t) {
        ref::load_kv_row(host_kv, host_kv.k, t, g, krow.data());
        double dot = 0;
        for (int32_t c2 : i1) dot += static_cast<double>(qh[c2]) * krow[c2];
        s_hat[t] = dot * factor;
      }
      const double mx = *std::max_element(s_hat.begin(), s_hat.end());
      double all = 0, chosen = 0;
      for (int32_t t = 0; t < S; ++t) all += std::exp(s_hat[t] - mx);
      for (int32_t t : i2) chosen += std::exp(s_hat[t] - mx);
      const double alpha = chosen / all;
      alpha_err = std::max(alpha_err, std::fabs(alpha - word_f(plan.alpha + h)));
      ref::AttentionState y;
      ref::partial_attention(host_kv, g, qh, 1, args.scale, i2.data(), plan.k, &y);
      const double a = c.reallocation ? alpha : 1.0;
      for (int32_t c2 = 0; c2 < d; ++c2)
        own[static_cast<size_t>(h) * d + c2] = static_cast<float>(a * y.o[c2] + (1.0 - a) * v_mean[g * d + c2]);
    }
  }
  const double err_own = max_abs_diff(got, own), err_ref = max_abs_diff(got, want);
  std::printf("sparq %s d=%d group=%d S=%d k=%d l=%d r=%d realloc=%d k_t=%d spread=%d: I2 overlap %zu/%zu, |err| "
              "own %.3g ref %.3g, |alpha err| %.3g\n",
              kv_dtype_name(dtype), d, c.group, S, plan.k, plan.l, plan.r, c.reallocation, c.with_k_t, c.key_spread,
              i2_overlap, i2_total, err_own, err_ref, alpha_err);
  EXPECT_LE(err_own, 2e-5) << kv_dtype_name(dtype) << " d=" << d << " group=" << c.group << " S=" << S;
  EXPECT_LE(alpha_err, 2e-5);
  // Float vs double selection: at most 1 in 16 positions (and 2 in any case) may differ.
  EXPECT_GE(i2_overlap + std::max<size_t>(2, i2_total / 16), i2_total);
  if (i2_overlap == i2_total) {
    EXPECT_LE(err_ref, 2e-5);
  }
}

TEST(CudaAttention, SparqMatchesRef) {
  std::mt19937 rng(23);
  const SparqCase cases[] = {
      // k >= S (everything), S = 1, below a block, one block.
      {64, 1, 1, 128, -1, -1, true, true},     {64, 4, 7, 128, -1, -1, true, true},
      {128, 3, 16, 8, 2, -1, true, true},
      // Odd multi-block, multi-chunk scores (96 keys per chunk) and gather splits (24).
      {128, 8, 83, 32, 8, 16, true, true},     {64, 3, 300, 40, 10, 8, false, true},
      {256, 4, 257, 50, -1, 32, true, false},  {256, 1, 700, 64, 16, -1, true, true},
      {128, 4, 513, 100, 25, 5, true, false},  {64, 8, 129, 17, 1, 1, false, true},
      // Step 1 weighted by the keys' spread from the moments.
      {64, 3, 300, 40, 10, 8, true, true, true},  {256, 1, 700, 64, 16, -1, true, false, true},
      {128, 8, 83, 32, 8, 16, false, true, true},
  };
  for (KvDtype dtype : kDtypes)
    for (const SparqCase& c : cases) run_sparq_case(c, dtype, rng);
}

// ---- HiP ------------------------------------------------------------------------------------

struct HipCase {
  int32_t head_dim, group, seq_len, mask_k, block_size_k, sink, window, reuse_steps;
  bool per_kv_head = false;
};

void run_hip_case(const HipCase& c, KvDtype dtype, std::mt19937& rng) {
  const int32_t n_kv = 2, n_heads = c.group * n_kv, d = c.head_dim;
  const int32_t est_pos = c.seq_len - 1, pos = est_pos + c.reuse_steps;  // mask estimated, then reused
  const PagedKvFixture f = make_paged_kv(d, n_kv, 16, dtype, pos + 1, 2, rng);
  const std::vector<float> q_est = random_q(static_cast<size_t>(n_heads) * d, rng);
  const std::vector<float> q = random_q(static_cast<size_t>(n_heads) * d, rng);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const ref::HipParams rp{c.mask_k, c.block_size_k, c.sink, c.window, c.per_kv_head};
  const cuda::HipConfig hc{c.mask_k, c.block_size_k, c.sink, c.window, c.per_kv_head};
  DecodeArgs est_args{q_est.data(), nullptr, n_heads, est_pos, scale};
  const ref::HipMask ref_mask = ref::hip_estimate_mask(f.view(), est_args, rp, nullptr);

  DeviceKv dkv(f);
  const PagedKvView kv = dkv.view(f);
  DeviceBuffer<float> dq_est(q_est), dq(q), dout(q.size());
  DecodeArgs dest{dq_est.ptr, nullptr, n_heads, est_pos, scale};
  const cuda::HipMaskInfo info = cuda::plan_hip_mask(kv, dest, hc);
  ASSERT_EQ(info.dense, ref_mask.dense);
  DeviceBuffer<int32_t> starts(static_cast<size_t>(n_heads) * std::max(1, info.n_keep));
  cuda::attn_common::reset_byte_counters();
  ASSERT_EQ(cuda::hip_estimate_mask(kv, dest, hc, info, starts.ptr, nullptr), cudaSuccess);
  const cuda::AttnBytes est_bound = cuda::hip_estimate_mask_bytes_bound(kv, dest, hc, info);
  const cuda::AttnBytes est_got = cuda::attn_common::counted_bytes();
  EXPECT_LE(est_got.kv_read, est_bound.kv_read);
  EXPECT_LE(est_got.other_read, est_bound.other_read);
  EXPECT_EQ(est_got.written, est_bound.written);

  // The kernel's mask in ref's form, and its overlap with ref's.
  ref::HipMask own = ref_mask;
  size_t same = 0, total = 0;
  if (!info.dense) {
    const std::vector<int32_t> host_starts = starts.download();
    for (int32_t h = 0; h < n_heads; ++h) {
      own.block_starts[h].assign(host_starts.begin() + h * info.n_keep, host_starts.begin() + (h + 1) * info.n_keep);
      EXPECT_TRUE(std::is_sorted(own.block_starts[h].begin(), own.block_starts[h].end()));
      if (c.per_kv_head && h % c.group != 0) {
        EXPECT_EQ(own.block_starts[h], own.block_starts[h - h % c.group]);
      }
      same += overlap(own.block_starts[h], ref_mask.block_starts[h]);
      total += info.n_keep;
    }
  }
  EXPECT_GE(same + std::max<size_t>(2, total / 16), total) << "masks differ beyond near-ties";

  std::vector<float> want(q.size());
  DecodeArgs args{q.data(), want.data(), n_heads, pos, scale};
  ref::hip_sparse_attention(f.view(), args, rp, own, nullptr);
  DecodeArgs dargs{dq.ptr, dout.ptr, n_heads, pos, scale};
  const cuda::HipAttentionPlan plan = cuda::plan_hip_sparse_attention(kv, dargs, hc, info, 20);
  DeviceBuffer<float> workspace(plan.workspace_floats);
  cuda::attn_common::reset_byte_counters();
  ASSERT_EQ(cuda::hip_sparse_attention(kv, dargs, hc, info, starts.ptr, plan, workspace.ptr, nullptr), cudaSuccess);
  const cuda::AttnBytes formula = cuda::hip_sparse_attention_bytes(kv, dargs, hc, info, plan);
  const cuda::AttnBytes got_bytes = cuda::attn_common::counted_bytes();
  // Exact unless a selected block reaches into the window (< block_size_k rows per head skipped).
  const int64_t slack = static_cast<int64_t>(n_heads) * (c.block_size_k - 1);
  EXPECT_LE(got_bytes.kv_read, formula.kv_read);
  EXPECT_GE(got_bytes.kv_read, formula.kv_read - slack * 2 * static_cast<int64_t>(kv_row_bytes(dtype, d)));
  EXPECT_LE(got_bytes.other_read, formula.other_read);
  EXPECT_GE(got_bytes.other_read, formula.other_read - slack * 4);
  EXPECT_EQ(got_bytes.written, formula.written);
  const double err = max_abs_diff(dout.download(), want);
  std::printf("hip%s %s d=%d group=%d pos=%d (mask at %d) mask_k=%d bs=%d dense=%d iters<=%d: mask overlap %zu/%zu, "
              "|err| %.3g, est bytes %lld <= %lld\n",
              c.per_kv_head ? " per kv head" : "", kv_dtype_name(dtype), d, c.group, pos, est_pos, c.mask_k, c.block_size_k, info.dense,
              info.max_iterations, same, total, err, static_cast<long long>(est_got.total()),
              static_cast<long long>(est_bound.total()));
  EXPECT_LE(err, 1e-5) << kv_dtype_name(dtype) << " d=" << d << " group=" << c.group;
}

TEST(CudaAttention, HipMatchesRef) {
  std::mt19937 rng(31);
  const HipCase cases[] = {
      // Dense (T' <= mask_k): S = 1, below a block, one block.
      {64, 1, 1, 16, 2, 4, 8, 0},     {64, 4, 7, 16, 2, 4, 8, 0},    {128, 3, 16, 16, 2, 4, 8, 0},
      // Sparse: odd lengths (a partial last key block), several halvings, mask reuse, groups.
      {64, 8, 101, 16, 2, 4, 8, 0},   {128, 4, 300, 32, 2, 16, 32, 3}, {256, 1, 257, 24, 4, 4, 16, 0},
      {128, 3, 513, 64, 2, 16, 64, 7}, {256, 4, 400, 48, 3, 5, 20, 2},
      // One mask per kv head (the group's max): G = 1 equals per head; G up to 2048 / d rows.
      {64, 8, 101, 16, 2, 4, 8, 0, true}, {128, 3, 513, 64, 2, 16, 64, 7, true}, {256, 8, 400, 48, 3, 5, 20, 2, true},
      {64, 1, 300, 32, 2, 16, 32, 3, true},
  };
  for (KvDtype dtype : kDtypes)
    for (const HipCase& c : cases) run_hip_case(c, dtype, rng);
}

// ---- bifurcated -----------------------------------------------------------------------------

struct BifCase {
  int32_t head_dim, group, n_seqs, prefix_blocks, nested_blocks, nested_members;
  std::vector<int32_t> suffix;  // per sequence, tokens after the shared blocks (>= 1)
  float softcap = 0.0f;         // > 0: soft-capped logits (Gemma 2)
  bool sinks = false;           // attention sinks (gpt-oss), N(1, 1) per head
};

void run_bif_case(const BifCase& c, KvDtype dtype, std::mt19937& rng) {
  const int32_t n_kv = 2, n_heads = c.group * n_kv, d = c.head_dim, bs = 16;
  const int32_t shared = c.prefix_blocks + c.nested_blocks;
  int32_t own_blocks = 0;
  for (int32_t s : c.suffix) own_blocks += (s + bs - 1) / bs;
  const int32_t physical = shared + own_blocks + c.n_seqs;  // + a private copy of the nested blocks' slot
  const PagedKvFixture f = make_paged_kv(d, n_kv, bs, dtype, physical * bs, 0, rng);
  // Sequence i: the prefix blocks, the nested blocks (members) or private ones, then its own blocks.
  std::vector<std::vector<int32_t>> tables(c.n_seqs);
  int32_t next = shared;
  std::vector<int32_t> private_nested;
  for (int32_t i = 0; i < c.n_seqs; ++i) {
    for (int32_t b = 0; b < c.prefix_blocks; ++b) tables[i].push_back(f.table[b]);
    for (int32_t b = 0; b < c.nested_blocks; ++b)
      tables[i].push_back(i < c.nested_members ? f.table[c.prefix_blocks + b] : f.table[next++]);
    for (int32_t b = 0; b < (c.suffix[i] + bs - 1) / bs; ++b) tables[i].push_back(f.table[next++]);
  }
  ASSERT_LE(next, physical);
  std::vector<DeviceBuffer<int32_t>*> dtables;
  for (const auto& t : tables) dtables.push_back(new DeviceBuffer<int32_t>(t));

  const std::vector<float> q = random_q(static_cast<size_t>(c.n_seqs) * n_heads * d, rng);
  std::vector<float> want(q.size());
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  std::vector<float> sinks(n_heads);
  std::normal_distribution<float> sink(1.0f, 1.0f);
  for (float& x : sinks) x = sink(rng);
  DeviceBuffer<float> dsinks(sinks);
  std::vector<PagedKvView> seq_kv(c.n_seqs);
  std::vector<DecodeArgs> seq_args(c.n_seqs);
  std::vector<cuda::BifSequence> seqs(c.n_seqs);
  const int32_t prefix_end = c.prefix_blocks * bs, nested_end = shared * bs;
  for (int32_t i = 0; i < c.n_seqs; ++i) {
    seq_kv[i] = f.view();
    seq_kv[i].block_table = tables[i].data();
    const int32_t pos = nested_end + c.suffix[i] - 1;
    seq_args[i] = DecodeArgs{q.data() + static_cast<size_t>(i) * n_heads * d,
                             want.data() + static_cast<size_t>(i) * n_heads * d, n_heads, pos, scale, c.softcap,
                             c.sinks ? sinks.data() : nullptr};
    seqs[i] = cuda::BifSequence{dtables[i]->ptr, pos};
  }
  std::vector<int32_t> all(c.n_seqs), nested(c.nested_members);
  std::iota(all.begin(), all.end(), 0);
  std::iota(nested.begin(), nested.end(), 0);
  std::vector<ref::SharedSegment> ref_segs;
  std::vector<cuda::BifSegment> segs;
  if (c.prefix_blocks > 0) {
    ref_segs.push_back({&seq_kv[0], 0, prefix_end, all});
    segs.push_back({dtables[0]->ptr, 0, prefix_end, all});
  }
  if (c.nested_blocks > 0 && c.nested_members > 1) {
    ref_segs.push_back({&seq_kv[0], prefix_end, nested_end, nested});
    segs.push_back({dtables[0]->ptr, prefix_end, nested_end, nested});
  }
  ref::bifurcated_attention(ref_segs, seq_kv.data(), seq_args.data(), c.n_seqs);

  DeviceKv dkv(f);
  const PagedKvView kv = dkv.view(f);
  DeviceBuffer<float> dq(q), dout(q.size());
  const cuda::BifurcatedPlan plan = cuda::plan_bifurcated_attention(segs, seqs, n_heads, kv, 40);
  DeviceBuffer<uint8_t> dplan(plan.device_bytes);
  DeviceBuffer<float> workspace(plan.workspace_floats);
  cuda::attn_common::reset_byte_counters();
  ASSERT_EQ(cuda::bifurcated_attention(plan, kv, dq.ptr, dout.ptr, dplan.ptr, workspace.ptr,
                                       LogitScale{scale, c.softcap}, c.sinks ? dsinks.ptr : nullptr, nullptr),
            cudaSuccess);
  expect_bytes("bifurcated", cuda::bifurcated_attention_bytes(plan, kv, c.sinks));
  const double err = max_abs_diff(dout.download(), want);
  std::printf("bifurcated %s d=%d group=%d b=%d prefix=%d nested=%d(x%d) units=%zu rows/cta=%d: |err| %.3g\n",
              kv_dtype_name(dtype), d, c.group, c.n_seqs, prefix_end, nested_end - prefix_end, c.nested_members,
              plan.units.size(), plan.rows_per_cta, err);
  EXPECT_LE(err, 1e-5) << kv_dtype_name(dtype) << " d=" << d << " group=" << c.group << " b=" << c.n_seqs;
  for (auto* t : dtables) delete t;
}

TEST(CudaAttention, BifurcatedMatchesRef) {
  std::mt19937 rng(41);
  const BifCase cases[] = {
      // Suffix of 1 token (S = prefix + 1), below a block, one block, odd multi-block.
      {64, 1, 2, 1, 0, 0, {1, 7}},
      {128, 4, 3, 2, 0, 0, {16, 1, 83}},
      // b·G = 64 rows: one row tile (d <= 128) reads the prefix once; d 256: two tiles.
      {128, 4, 16, 3, 1, 5, std::vector<int32_t>(16, 5)},
      {256, 8, 5, 2, 2, 3, {3, 17, 1, 40, 9}},
      {64, 3, 4, 4, 2, 2, {1, 2, 33, 16}},
      {256, 1, 3, 0, 0, 0, {20, 1, 9}},  // no shared segment: per-sequence attention only
      {128, 4, 3, 2, 1, 2, {16, 1, 83}, 1.0f},         // soft-capped logits (Gemma 2)
      {64, 3, 4, 4, 2, 2, {1, 2, 33, 16}, 0.0f, true},  // attention sinks (gpt-oss)
  };
  for (KvDtype dtype : kDtypes)
    for (const BifCase& c : cases) run_bif_case(c, dtype, rng);
}

}  // namespace
}  // namespace fathom

namespace fathom {
namespace {

// ---- SWA ------------------------------------------------------------------------------------

struct SwaCase {
  int32_t head_dim, group, seq_len;
  float ratio;
};

void run_swa_case(const SwaCase& c, KvDtype dtype, std::mt19937& rng) {
  const int32_t n_kv = 2, n_heads = c.group * n_kv, d = c.head_dim, S = c.seq_len, pos = S - 1;
  const PagedKvFixture f = make_paged_kv(d, n_kv, 16, dtype, S, 2, rng);
  const std::vector<float> q = random_q(static_cast<size_t>(n_heads) * d, rng);
  std::uniform_real_distribution<float> uni(0.0f, 1.0f);
  std::vector<float> mass(S);
  for (float& m : mass) m = uni(rng);
  mass[S / 3] = mass[S / 2];  // a tie: the lower position wins on both sides
  std::vector<float> want(q.size());
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  DecodeArgs args{q.data(), want.data(), n_heads, pos, scale};
  const ref::SwaStats st = ref::swa_attention(f.view(), args, ref::SwaParams{c.ratio}, mass.data());
  // Expected weights: softmax over the kept positions per head, in double, summed over heads.
  const int32_t n = static_cast<int32_t>(st.kept.size());
  std::vector<double> want_w(n, 0.0);
  std::vector<float> krow(d);
  for (int32_t h = 0; h < n_heads; ++h) {
    std::vector<double> logit(n);
    for (int32_t i = 0; i < n; ++i) {
      ref::load_kv_row(f.view(), f.view().k, st.kept[i], h / c.group, krow.data());
      double dot = 0;
      for (int32_t e = 0; e < d; ++e) dot += static_cast<double>(q[static_cast<size_t>(h) * d + e]) * krow[e];
      logit[i] = dot * scale;
    }
    const double m = *std::max_element(logit.begin(), logit.end());
    double sum = 0;
    for (double l : logit) sum += std::exp(l - m);
    for (int32_t i = 0; i < n; ++i) want_w[i] += std::exp(logit[i] - m) / sum;
  }

  DeviceKv dkv(f);
  const PagedKvView kv = dkv.view(f);
  DeviceBuffer<float> dq(q), dout(q.size()), dweights(static_cast<size_t>(n));
  DeviceBuffer<int32_t> dkept(st.kept);
  DecodeArgs dargs{dq.ptr, dout.ptr, n_heads, pos, scale};
  const cuda::SwaPlan plan = cuda::plan_swa_attention(kv, dargs, n, 24);
  DeviceBuffer<float> workspace(plan.workspace_floats);
  cuda::attn_common::reset_byte_counters();
  ASSERT_EQ(cuda::swa_attention(kv, dargs, dkept.ptr, plan, dweights.ptr, workspace.ptr, nullptr), cudaSuccess);
  expect_bytes("swa", cuda::swa_attention_bytes(kv, dargs, plan));
  const double err = max_abs_diff(dout.download(), want);
  const std::vector<float> got_w = dweights.download();
  double w_err = 0;
  for (int32_t i = 0; i < n; ++i) w_err = std::max(w_err, std::fabs(got_w[i] - want_w[i]));
  std::printf("swa %s d=%d group=%d S=%d ratio=%.2f kept=%d splits=%d: |err| %.3g, weights |err| %.3g\n",
              kv_dtype_name(dtype), d, c.group, S, c.ratio, n, plan.n_splits, err, w_err);
  EXPECT_LE(err, 1e-5) << kv_dtype_name(dtype) << " d=" << d << " S=" << S;
  EXPECT_LE(w_err, 1e-5 * n_heads) << kv_dtype_name(dtype) << " d=" << d << " S=" << S;
}

TEST(CudaAttention, SwaMatchesRef) {
  std::mt19937 rng(17);
  const SwaCase cases[] = {{64, 3, 1, 0.5f},    {64, 3, 37, 0.25f},  {128, 4, 300, 0.125f},
                           {256, 1, 129, 1.0f}, {80, 8, 200, 0.3f},  {64, 1, 700, 0.125f}};
  for (KvDtype dtype : kDtypes)
    for (const SwaCase& c : cases) run_swa_case(c, dtype, rng);
}

TEST(CudaAttention, SwaRejectsBadArguments) {
  std::mt19937 rng(3);
  const PagedKvFixture f = make_paged_kv(64, 2, 16, KvDtype::kF16, 20, 2, rng);
  DeviceKv dkv(f);
  const PagedKvView kv = dkv.view(f);
  DeviceBuffer<float> q(4 * 64), out(4 * 64), w(8), ws(4096);
  DeviceBuffer<int32_t> kept(std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7});
  DecodeArgs args{q.ptr, out.ptr, 4, 19, 0.125f};
  const cuda::SwaPlan plan = cuda::plan_swa_attention(kv, args, 8);
  EXPECT_EQ(cuda::swa_attention(kv, args, nullptr, plan, w.ptr, ws.ptr, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::swa_attention(kv, args, kept.ptr, cuda::plan_swa_attention(kv, args, 0), w.ptr, ws.ptr, nullptr),
            cudaErrorInvalidValue);
  args.n_heads = 3;  // not a multiple of the kv heads
  EXPECT_EQ(cuda::swa_attention(kv, args, kept.ptr, plan, w.ptr, ws.ptr, nullptr), cudaErrorInvalidValue);
}

// SWA's device-resident mass: the selection equals ref::swa_select over a naive pooling of the same
// mass (coarse values: many exact ties, so the lower-position rule is exercised), and the fold
// equals mass·keep then + weight, bit for bit; at lengths around the CTA's width and radii from 0
// (no pooling) past the length.
TEST(CudaAttention, SwaMassSelectAndFoldMatchHost) {
  std::mt19937 rng(23);
  std::uniform_int_distribution<int> coarse(0, 12);
  for (int32_t n : {1, 2, 7, 255, 256, 257, 1000, 4099})
    for (int32_t radius : {0, 1, 3, 16, 600, 1 << 30})
      for (float ratio : {0.125f, 0.5f, 1.0f}) {
        SCOPED_TRACE("n=" + std::to_string(n) + " radius=" + std::to_string(radius) + " ratio=" + std::to_string(ratio));
        std::vector<float> mass(n);
        for (float& m : mass) m = 0.25f * static_cast<float>(coarse(rng));
        const int32_t r = std::min(radius, n);
        std::vector<float> pooled(n);
        for (int32_t t = 0; t < n; ++t) {
          pooled[t] = mass[std::max(0, t - r)];
          for (int32_t i = std::max(0, t - r); i <= std::min(n - 1, t + r); ++i) pooled[t] = std::max(pooled[t], mass[i]);
        }
        const ref::SwaStats want = ref::swa_select(n, ratio, pooled.data());
        DeviceBuffer<float> dmass(mass), ws(cuda::swa_select_workspace_floats(n));
        DeviceBuffer<int32_t> kept(want.kept.size());
        ASSERT_EQ(cuda::swa_select(dmass.ptr, n, radius, want.k_local, want.k_global, ws.ptr, kept.ptr, nullptr),
                  cudaSuccess);
        ASSERT_EQ(kept.download(), want.kept);

        std::vector<float> weights(want.kept.size());
        for (float& w : weights) w = std::uniform_real_distribution<float>(0.0f, 1.0f)(rng);
        const float keep = 1.0f - 1.0f / static_cast<float>(want.k_local);
        std::vector<float> folded = mass;
        for (float& m : folded) m = m * keep;
        for (size_t i = 0; i < want.kept.size(); ++i) folded[want.kept[i]] = folded[want.kept[i]] + weights[i];
        DeviceBuffer<float> dweights(weights);
        ASSERT_EQ(cuda::swa_fold(dmass.ptr, n, keep, kept.ptr, dweights.ptr, static_cast<int32_t>(weights.size()), nullptr),
                  cudaSuccess);
        ASSERT_EQ(dmass.download(), folded);
      }
  DeviceBuffer<float> m(4), ws(12);
  DeviceBuffer<int32_t> k(4);
  EXPECT_EQ(cuda::swa_select(m.ptr, 4, 1, 0, 2, ws.ptr, k.ptr, nullptr), cudaErrorInvalidValue);  // k_local 0
  EXPECT_EQ(cuda::swa_select(m.ptr, 4, 1, 2, 3, ws.ptr, k.ptr, nullptr), cudaErrorInvalidValue);  // k_global > older
  EXPECT_EQ(cuda::swa_select(m.ptr, 4, -1, 2, 1, ws.ptr, k.ptr, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::swa_fold(m.ptr, 4, 0.5f, nullptr, m.ptr, 2, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace fathom
