// CUDA bifurcated decode attention run on the CPU through kernels/cuda/emu, against
// ref::bifurcated_attention, plus, for every launch, the bytes its launcher reports vs the bytes
// the emulated grid touched. (The other attention kernels are in the op-test grid,
// tests/kernel/test_backend_ops.cpp; this one moves there next.)
// Tolerance |kernel − ref| <= 1e-5 for every KV dtype: both sides dequantize the same stored values
// with the same formula; the slack over f32 rounding covers expf vs exp and the split merges.
#include "kernels/cuda/bifurcated_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/ref/bifurcated.h"
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

std::vector<float> random_q(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> q(n);
  for (float& x : q) x = normal(rng);
  return q;
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
