// The CUDA attention kernels over a KV cache split between the device tier and the host tier
// (kernels/cuda/attention_common.h: a block table entry e < 0 is slot -(e + 1) of the host
// tier's planes, mapped pinned memory on a GPU, read in place). Run on the CPU through
// kernels/cuda/emu. For every kernel the CUDA backend launches — dense (decode and a prefill
// chunk, with and without a sliding window), SparQ (with and without transposed K, with the mean-V
// reallocation reading the V sum of a host block), HiP (mask estimation and sparse attention,
// per query head and per kv head), SWA (output and weights) and bifurcated groups — and every KV
// dtype, the output over two tiers must be bitwise the output over one: each tier's copy of a
// block the other tier holds is poisoned with NaN bytes, so reading a block from the wrong tier
// shows. The bytes the kernels count as read from the host tier: exactly the dense formula
// (host keys · kv heads · head tiles · K and V rows), > 0 for the gathers, 0 with every block on
// the device.
#include "kernels/cuda/bifurcated_attention.h"
#include "kernels/cuda/hip_attention.h"
#include "kernels/cuda/paged_decode_attention.h"
#include "kernels/cuda/hot_rows.h"
#include "kernels/cuda/sparq_attention.h"
#include "kernels/cuda/swa_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "tests/kernel/cuda_device_kv.h"

namespace fathom {
namespace {

using testing::DeviceBuffer;
using testing::DeviceKv;
using testing::PagedKvFixture;
using testing::TieredDeviceKv;
using testing::make_paged_kv;

constexpr KvDtype kDtypes[] = {KvDtype::kF32, KvDtype::kF16, KvDtype::kI8};

// Logical blocks 0, 2, 3, 5, 6, ... in the host tier (two of every three, the last one included
// when `last_on_host`).
std::vector<bool> host_pattern(size_t blocks, bool last_on_host) {
  std::vector<bool> on_host(blocks);
  for (size_t i = 0; i < blocks; ++i) on_host[i] = i % 3 != 1;
  on_host.back() = last_on_host;
  return on_host;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<float> random_vector(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& e : x) e = normal(rng);
  return x;
}

// One decode query over a random cache: 2 kv heads of `group` query heads, position seq_len - 1.
struct DecodeCase {
  PagedKvFixture f;
  std::vector<float> q;
  int32_t n_heads, pos;
  float scale;
};

DecodeCase decode_case(int32_t d, int32_t group, int32_t seq_len, KvDtype dtype, std::mt19937& rng) {
  const int32_t n_kv = 2;
  DecodeCase c{make_paged_kv(d, n_kv, 16, dtype, seq_len, 2, rng), {}, group * n_kv, seq_len - 1,
               1.0f / std::sqrt(static_cast<float>(d))};
  c.q = random_vector(static_cast<size_t>(c.n_heads) * d, rng);
  return c;
}

// Runs `launch` over one view and returns what it wrote to the output buffer.
using Launch = std::function<void(const PagedKvView&, float* out)>;

struct Compared {
  bool same;
  unsigned long long host_bytes;
};

Compared compare_tiers(const PagedKvFixture& f, const std::vector<bool>& on_host, size_t out_floats,
                       const Launch& launch, bool with_k_t = true) {
  DeviceKv resident(f);
  DeviceBuffer<float> out_resident(out_floats), out_tiered(out_floats);
  launch(resident.view(f, with_k_t), out_resident.ptr);
  TieredDeviceKv tiered(f, on_host);
  launch(tiered.view(f, with_k_t), out_tiered.ptr);
  const std::vector<float> a = out_resident.download(), b = out_tiered.download();
  for (float x : a) EXPECT_TRUE(std::isfinite(x));
  return {same_bits(a, b), tiered.host_bytes()};
}

TEST(CudaTieredAttention, DenseOverBothTiersIsBitwiseResident) {
  std::mt19937 rng(5);
  struct Case {
    int32_t d, group, seq_len, n_q, window;
  };
  const Case cases[] = {{64, 3, 300, 1, 0}, {128, 8, 83, 1, 0}, {256, 1, 530, 1, 0},
                        {64, 4, 200, 7, 0}, {64, 2, 300, 1, 90}, {128, 2, 140, 5, 40}};
  for (KvDtype dtype : kDtypes) {
    for (const Case& c : cases) {
      const int32_t n_kv = 2, n_heads = c.group * n_kv;
      const PagedKvFixture f = make_paged_kv(c.d, n_kv, 16, dtype, c.seq_len, 3, rng);
      const std::vector<bool> on_host = host_pattern(f.table.size(), c.n_q == 1);
      const std::vector<float> q = random_vector(static_cast<size_t>(c.n_q) * n_heads * c.d, rng);
      DeviceBuffer<float> dq(q);
      AttentionArgs args;
      args.q = dq.ptr;
      args.n_q = c.n_q;
      args.n_heads = n_heads;
      args.pos0 = c.seq_len - c.n_q;
      args.window = c.window;
      args.scale = 1.0f / std::sqrt(static_cast<float>(c.d));
      cuda::DecodeAttentionPlan plan;
      const Compared r = compare_tiers(f, on_host, q.size(), [&](const PagedKvView& kv, float* out) {
        AttentionArgs a = args;
        a.out = out;
        plan = cuda::plan_paged_decode_attention(kv, a, 64);
        DeviceBuffer<float> ws(plan.workspace_floats);
        ASSERT_EQ(cuda::paged_decode_attention(kv, a, plan, plan.workspace_floats ? ws.ptr : nullptr, nullptr),
                  cudaSuccess);
      });
      EXPECT_TRUE(r.same) << kv_dtype_name(dtype) << " d=" << c.d << " S=" << c.seq_len << " n_q=" << c.n_q;
      // Every host key of each query's range, once per kv head and head tile, K and V.
      int64_t host_keys = 0;
      for (int32_t qi = 0; qi < c.n_q; ++qi) {
        const int32_t pos = args.pos0 + qi, lo = c.window > 0 ? std::max(0, pos - c.window + 1) : 0;
        for (int32_t t = lo; t <= pos; ++t) host_keys += on_host[t / 16] ? 1 : 0;
      }
      const int64_t want = host_keys * n_kv * plan.head_tiles * 2 * static_cast<int64_t>(kv_row_bytes(dtype, c.d));
      EXPECT_EQ(r.host_bytes, static_cast<unsigned long long>(want)) << kv_dtype_name(dtype) << " d=" << c.d;
    }
  }
}

// A device hot-row cache of the host tier (kernels/cuda/hot_rows.h, the CUDA backend's HiP rows):
// copy_kv_rows copies the even rows of every host block into the device tier (the slot's own rows
// there, which the tiered fixture had poisoned), the host copies of those rows are then poisoned
// too, and PagedKvView::host_rows maps them. Dense attention (decode, 2 kv heads) reads each cached
// row from the device — bitwise the resident output — and only the odd host rows in place.
TEST(CudaTieredAttention, HotRowCacheServesMappedHostRows) {
  std::mt19937 rng(8);
  for (KvDtype dtype : kDtypes) {
    const int32_t d = 64, n_kv = 2, group = 3, S = 300, bs = 16, n_heads = group * n_kv;
    const PagedKvFixture f = make_paged_kv(d, n_kv, bs, dtype, S, 3, rng);
    const std::vector<bool> on_host = host_pattern(f.table.size(), false);
    TieredDeviceKv tiered(f, on_host);
    const int32_t slots = static_cast<int32_t>(f.k.size() / (kv_dtype_bytes(dtype) * n_kv * bs * d));
    std::vector<int32_t> map(static_cast<size_t>(slots) * bs * n_kv, -1);
    std::vector<cuda::KvRowCopy> copies;
    for (size_t i = 0; i < f.table.size(); ++i) {
      if (!on_host[i]) continue;
      for (int32_t g = 0; g < n_kv; ++g)
        for (int32_t off = 0; off < bs; off += 2) {
          const int64_t row = (static_cast<int64_t>(f.table[i]) * n_kv + g) * bs + off;
          map[(static_cast<size_t>(f.table[i]) * bs + off) * n_kv + g] = static_cast<int32_t>(row);
          copies.push_back({row, row, 3});
        }
    }
    PagedKvView kv = tiered.view(f);
    DeviceBuffer<cuda::KvRowCopy> dcopies(copies);
    cuda::KvCacheLayer to;
    to.k = const_cast<void*>(kv.k);
    to.v = const_cast<void*>(kv.v);
    to.k_rows = const_cast<KvInt8Row*>(kv.k_rows);
    to.v_rows = const_cast<KvInt8Row*>(kv.v_rows);
    to.head_dim = d;
    ASSERT_EQ(cuda::copy_kv_rows(kv.host_tier, to, dtype, dcopies.ptr, static_cast<int32_t>(copies.size()), nullptr),
              cudaSuccess);
    const size_t row_bytes = d * kv_dtype_bytes(dtype);
    for (const cuda::KvRowCopy& c : copies) {  // the cached rows' host copies: NaN from now on
      for (const void* plane : {kv.host_tier.k, kv.host_tier.v})
        std::memset(static_cast<uint8_t*>(const_cast<void*>(plane)) + c.src * row_bytes, 0xff, row_bytes);
      if (dtype == KvDtype::kI8)
        for (const KvInt8Row* params : {kv.host_tier.k_rows, kv.host_tier.v_rows})
          const_cast<KvInt8Row*>(params)[c.src] = KvInt8Row{std::nanf(""), std::nanf("")};
    }
    DeviceBuffer<int32_t> dmap(map);
    kv.host_rows = dmap.ptr;

    const std::vector<float> q = random_vector(static_cast<size_t>(n_heads) * d, rng);
    DeviceBuffer<float> dq(q), out_resident(q.size()), out_cached(q.size());
    auto run = [&](const PagedKvView& view, float* out) -> int32_t {
      AttentionArgs a;
      a.q = dq.ptr;
      a.out = out;
      a.n_q = 1;
      a.n_heads = n_heads;
      a.pos0 = S - 1;
      a.scale = 1.0f / std::sqrt(static_cast<float>(d));
      const cuda::DecodeAttentionPlan plan = cuda::plan_paged_decode_attention(view, a, 64);
      DeviceBuffer<float> ws(plan.workspace_floats);
      EXPECT_EQ(cuda::paged_decode_attention(view, a, plan, plan.workspace_floats ? ws.ptr : nullptr, nullptr),
                cudaSuccess);
      return plan.head_tiles;
    };
    DeviceKv resident(f);
    run(resident.view(f), out_resident.ptr);
    const int32_t head_tiles = run(kv, out_cached.ptr);
    EXPECT_TRUE(same_bits(out_resident.download(), out_cached.download())) << kv_dtype_name(dtype);
    int64_t odd_host_keys = 0;
    for (int32_t t = 0; t < S; ++t) odd_host_keys += on_host[t / bs] && t % 2 == 1 ? 1 : 0;
    EXPECT_EQ(tiered.host_bytes(), static_cast<unsigned long long>(odd_host_keys * n_kv * head_tiles * 2 *
                                                                   static_cast<int64_t>(kv_row_bytes(dtype, d))))
        << kv_dtype_name(dtype);
  }
}

TEST(CudaTieredAttention, AllDeviceCountsNoHostBytes) {
  std::mt19937 rng(6);
  const PagedKvFixture f = make_paged_kv(64, 2, 16, KvDtype::kF16, 100, 2, rng);
  const std::vector<float> q = random_vector(4 * 64, rng);
  DeviceBuffer<float> dq(q);
  const Compared r = compare_tiers(f, std::vector<bool>(f.table.size(), false), q.size(),
                                   [&](const PagedKvView& kv, float* out) {
                                     AttentionArgs a{dq.ptr, out, 1, 4, 99, 0, 0.125f};
                                     const cuda::DecodeAttentionPlan plan = cuda::plan_paged_decode_attention(kv, a);
                                     DeviceBuffer<float> ws(plan.workspace_floats);
                                     ASSERT_EQ(cuda::paged_decode_attention(kv, a, plan, ws.ptr, nullptr), cudaSuccess);
                                   });
  EXPECT_TRUE(r.same);
  EXPECT_EQ(r.host_bytes, 0u);
}

TEST(CudaTieredAttention, SparqOverBothTiersIsBitwiseResident) {
  std::mt19937 rng(7);
  struct Case {
    int32_t d, group, seq_len, k, l, r;
    bool with_k_t, last_on_host;
  };
  // The last block on the host: the reallocation reads its V sum there, and step 1 with the
  // keys' spread its K moments (the backend keeps a written block on the device, the kernel must
  // not depend on it).
  const Case cases[] = {{64, 3, 300, 40, 10, 8, true, true}, {128, 8, 83, 32, 8, 16, false, false},
                        {256, 1, 530, 64, 16, 32, true, false}};
  for (KvDtype dtype : kDtypes) {
    for (const bool key_spread : {false, true})
    for (const Case& c : cases) {
      const DecodeCase dc = decode_case(c.d, c.group, c.seq_len, dtype, rng);
      DeviceBuffer<float> dq(dc.q);
      const Compared r = compare_tiers(
          dc.f, host_pattern(dc.f.table.size(), c.last_on_host), dc.q.size(),
          [&](const PagedKvView& kv, float* out) {
            const DecodeArgs a{dq.ptr, out, dc.n_heads, dc.pos, dc.scale};
            const cuda::SparqPlan plan =
                cuda::plan_sparq_decode_attention(kv, a, cuda::SparqConfig{c.k, c.l, c.r, true, key_spread}, 96, 24);
            DeviceBuffer<int32_t> ws(plan.workspace_words);
            ASSERT_EQ(cuda::sparq_decode_attention(kv, a, plan, ws.ptr, nullptr), cudaSuccess);
          },
          c.with_k_t);
      EXPECT_TRUE(r.same) << kv_dtype_name(dtype) << " d=" << c.d << " S=" << c.seq_len << " spread " << key_spread;
      EXPECT_GT(r.host_bytes, 0u);
    }
  }
}

TEST(CudaTieredAttention, HipOverBothTiersIsBitwiseResident) {
  std::mt19937 rng(8);
  struct Case {
    int32_t d, group, seq_len, mask_k;
    bool per_kv_head;
  };
  const Case cases[] = {{64, 3, 300, 32, false}, {128, 4, 513, 64, true}, {256, 2, 400, 48, true}};
  for (KvDtype dtype : kDtypes) {
    for (const Case& c : cases) {
      const DecodeCase dc = decode_case(c.d, c.group, c.seq_len, dtype, rng);
      DeviceBuffer<float> dq(dc.q);
      const cuda::HipConfig hc{c.mask_k, 2, 16, 32, c.per_kv_head};
      std::vector<std::vector<int32_t>> masks;
      const Compared r = compare_tiers(dc.f, host_pattern(dc.f.table.size(), false), dc.q.size(),
                                       [&](const PagedKvView& kv, float* out) {
        const DecodeArgs a{dq.ptr, out, dc.n_heads, dc.pos, dc.scale};
        const cuda::HipMaskInfo info = cuda::plan_hip_mask(kv, a, hc);
        ASSERT_FALSE(info.dense);
        DeviceBuffer<int32_t> starts(static_cast<size_t>(dc.n_heads) * info.n_keep);
        ASSERT_EQ(cuda::hip_estimate_mask(kv, a, hc, info, starts.ptr, nullptr), cudaSuccess);
        masks.push_back(starts.download());
        const cuda::HipAttentionPlan plan = cuda::plan_hip_sparse_attention(kv, a, hc, info, 20);
        DeviceBuffer<float> ws(plan.workspace_floats);
        ASSERT_EQ(cuda::hip_sparse_attention(kv, a, hc, info, starts.ptr, plan, ws.ptr, nullptr), cudaSuccess);
      });
      ASSERT_EQ(masks.size(), 2u);
      EXPECT_EQ(masks[0], masks[1]) << "the mask over both tiers differs";
      EXPECT_TRUE(r.same) << kv_dtype_name(dtype) << " d=" << c.d << " S=" << c.seq_len;
      EXPECT_GT(r.host_bytes, 0u);
    }
  }
}

TEST(CudaTieredAttention, SwaOverBothTiersIsBitwiseResident) {
  std::mt19937 rng(9);
  for (KvDtype dtype : kDtypes) {
    for (const int32_t d : {64, 256}) {
      const DecodeCase dc = decode_case(d, 4, 300, dtype, rng);
      std::vector<int32_t> kept;
      for (int32_t t = 0; t <= dc.pos; t += 3) kept.push_back(t);  // blocks of both tiers
      DeviceBuffer<float> dq(dc.q);
      DeviceBuffer<int32_t> dkept(kept);
      std::vector<std::vector<float>> weights;
      const Compared r = compare_tiers(dc.f, host_pattern(dc.f.table.size(), false), dc.q.size(),
                                       [&](const PagedKvView& kv, float* out) {
        const DecodeArgs a{dq.ptr, out, dc.n_heads, dc.pos, dc.scale};
        const cuda::SwaPlan plan = cuda::plan_swa_attention(kv, a, static_cast<int32_t>(kept.size()), 24);
        DeviceBuffer<float> w(kept.size()), ws(plan.workspace_floats);
        ASSERT_EQ(cuda::swa_attention(kv, a, dkept.ptr, plan, w.ptr, ws.ptr, nullptr), cudaSuccess);
        weights.push_back(w.download());
      });
      ASSERT_EQ(weights.size(), 2u);
      EXPECT_TRUE(same_bits(weights[0], weights[1])) << kv_dtype_name(dtype) << " d=" << d << ": weights";
      EXPECT_TRUE(r.same) << kv_dtype_name(dtype) << " d=" << d;
      EXPECT_GT(r.host_bytes, 0u);
    }
  }
}

TEST(CudaTieredAttention, BifurcatedOverBothTiersIsBitwiseResident) {
  std::mt19937 rng(10);
  for (KvDtype dtype : kDtypes) {
    const int32_t d = 128, n_kv = 2, group = 4, n_heads = group * n_kv, bs = 16, n_seqs = 3;
    // A shared prefix of 10 blocks, then 2 own blocks per sequence: one sequence's logical blocks
    // are the fixture's table, the others take their own blocks from the spare ones.
    const int32_t prefix = 10, own = 2, S = (prefix + own) * bs;
    const PagedKvFixture f = make_paged_kv(d, n_kv, bs, dtype, S, (n_seqs - 1) * own, rng);
    std::vector<int32_t> spare(f.k.size() / (kv_dtype_bytes(dtype) * n_kv * bs * d));
    std::iota(spare.begin(), spare.end(), 0);
    std::erase_if(spare, [&](int32_t b) { return std::find(f.table.begin(), f.table.end(), b) != f.table.end(); });
    const std::vector<bool> on_host = host_pattern(f.table.size(), false);
    const std::vector<float> q = random_vector(static_cast<size_t>(n_seqs) * n_heads * d, rng);
    DeviceBuffer<float> dq(q);
    // The prefix and sequence 0's blocks: the fixture's table (tier-tagged in the tiered run); the
    // other sequences' own blocks: spare slots, in the device tier.
    const Compared r = compare_tiers(f, on_host, q.size(), [&](const PagedKvView& kv, float* out) {
      std::vector<int32_t> physical(f.table.size());
      const bool tiered = kv.host_tier.k != nullptr;
      for (size_t i = 0; i < physical.size(); ++i)
        physical[i] = tiered && on_host[i] ? -f.table[i] - 1 : f.table[i];
      std::vector<std::vector<int32_t>> tables(n_seqs, std::vector<int32_t>(physical.begin(), physical.begin() + prefix));
      for (int32_t i = 0; i < n_seqs; ++i)
        for (int32_t b = 0; b < own; ++b)
          tables[i].push_back(i == 0 ? physical[prefix + b] : spare[(i - 1) * own + b]);
      std::vector<DeviceBuffer<int32_t>*> dtables;
      std::vector<cuda::BifSequence> seqs;
      for (int32_t i = 0; i < n_seqs; ++i) {
        dtables.push_back(new DeviceBuffer<int32_t>(tables[i]));
        seqs.push_back({dtables.back()->ptr, S - 1 - 5 * i});
      }
      std::vector<int32_t> members(n_seqs);
      std::iota(members.begin(), members.end(), 0);
      const std::vector<cuda::BifSegment> segs{{dtables[0]->ptr, 0, prefix * bs, members}};
      const cuda::BifurcatedPlan plan = cuda::plan_bifurcated_attention(segs, seqs, n_heads, kv, 40);
      DeviceBuffer<uint8_t> dplan(plan.device_bytes);
      DeviceBuffer<float> ws(plan.workspace_floats);
      EXPECT_EQ(cuda::bifurcated_attention(plan, kv, dq.ptr, out, dplan.ptr, ws.ptr, 0.1f, nullptr, nullptr), cudaSuccess);
      for (auto* t : dtables) delete t;
    });
    EXPECT_TRUE(r.same) << kv_dtype_name(dtype);
    EXPECT_GT(r.host_bytes, 0u);
  }
}

}  // namespace
}  // namespace fathom
