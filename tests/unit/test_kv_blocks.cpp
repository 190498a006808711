// The KV page table (BlockAllocator reference counting, BlockTable growth/release) and the CPU
// backend's KV storage (planes, append, whole-block moves).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "engine/attention/policies/sparq.h"
#include "engine/backend/cpu/cpu_policies.h"
#include "engine/backend/cpu/kv_storage.h"
#include "engine/kv/block_allocator.h"
#include "engine/kv/block_table.h"
#include "kernels/cpu/cache_evict.h"
#include "kernels/cpu/huge_buffer.h"
#include "kernels/cpu/sparse_attention.h"
#include "kernels/ref/attention_state.h"
#include "kernels/ref/sparq.h"

namespace fathom {
namespace {

KvLayout small_layout(KvDtype dtype = KvDtype::kF16) { return KvLayout{2, 3, 8, 4, dtype}; }

TEST(BlockAllocator, AllocatesEveryBlockOnceThenRunsOut) {
  BlockAllocator pool(5, 4);
  std::set<int32_t> seen;
  for (int i = 0; i < 5; ++i) {
    const int32_t b = pool.allocate();
    ASSERT_GE(b, 0);
    EXPECT_TRUE(seen.insert(b).second);
  }
  EXPECT_EQ(pool.allocate(), -1);
  EXPECT_EQ(pool.free_blocks(), 0);
}

TEST(BlockAllocator, SharedBlockIsFreedByTheLastRelease) {
  BlockAllocator pool(2, 4);
  const int32_t b = pool.allocate();
  pool.retain(b);
  EXPECT_EQ(pool.ref_count(b), 2);
  pool.release(b);
  EXPECT_EQ(pool.free_blocks(), 1);
  pool.release(b);
  EXPECT_EQ(pool.free_blocks(), 2);
  EXPECT_THROW(pool.release(b), std::logic_error);
}

TEST(BlockAllocator, PlacesBlocksInTheDeviceTierFirstThenTheHostTier) {
  BlockAllocator pool(3, 4, 2);
  ASSERT_EQ(pool.num_blocks(), 5);
  std::vector<int32_t> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(pool.allocate());
  EXPECT_EQ(pool.allocate(), -1);
  std::set<int32_t> device_slots, host_slots;
  for (int i = 0; i < 5; ++i) {
    const KvTier t = pool.tier(ids[i]);
    EXPECT_EQ(t, i < 3 ? KvTier::kDevice : KvTier::kHost) << i;
    EXPECT_TRUE((t == KvTier::kDevice ? device_slots : host_slots).insert(pool.slot(ids[i])).second);
    EXPECT_EQ(pool.physical(ids[i]), t == KvTier::kDevice ? pool.slot(ids[i]) : -pool.slot(ids[i]) - 1);
  }
  EXPECT_EQ(pool.used_slots(KvTier::kDevice), 3);
  EXPECT_EQ(pool.used_slots(KvTier::kHost), 2);
  // A device and a host block trade slots; the ids stay.
  const int32_t d = ids[0], h = ids[3], d_slot = pool.slot(d), h_slot = pool.slot(h);
  pool.exchange(d, h);
  EXPECT_EQ(pool.tier(d), KvTier::kHost);
  EXPECT_EQ(pool.slot(d), h_slot);
  EXPECT_EQ(pool.tier(h), KvTier::kDevice);
  EXPECT_EQ(pool.slot(h), d_slot);
  EXPECT_EQ(pool.block_at_device_slot(d_slot), h);
  // Releasing a device block frees its slot: a host block can move in.
  EXPECT_FALSE(pool.move_to_device(d));
  pool.release(ids[1]);
  EXPECT_EQ(pool.free_slots(KvTier::kDevice), 1);
  EXPECT_EQ(pool.block_at_device_slot(d_slot), h);
  EXPECT_TRUE(pool.move_to_device(d));
  EXPECT_EQ(pool.tier(d), KvTier::kDevice);
  EXPECT_EQ(pool.free_slots(KvTier::kHost), 1);
  EXPECT_TRUE(pool.move_to_host(d));
  EXPECT_EQ(pool.free_slots(KvTier::kDevice), 1);
  for (int32_t b : {ids[0], ids[2], ids[3], ids[4]}) pool.release(b);
  EXPECT_EQ(pool.free_blocks(), 5);
  EXPECT_EQ(pool.free_slots(KvTier::kDevice), 3);
  EXPECT_EQ(pool.free_slots(KvTier::kHost), 2);
}

TEST(CpuKvStorage, TilesOfDifferentBlocksLayersAndHeadsDoNotOverlap) {
  const KvLayout layout = small_layout(KvDtype::kF32);
  CpuKvStorage pool(layout, 3);
  const size_t tile_bytes = layout.tile_elems() * 4;
  std::set<const void*> starts;
  for (int32_t l = 0; l < layout.n_layers; ++l)
    for (int32_t b = 0; b < 3; ++b)
      for (int32_t h = 0; h < layout.n_kv_heads; ++h) {
        auto* k = static_cast<std::byte*>(pool.k_tile(l, b, h));
        auto* v = static_cast<std::byte*>(pool.v_tile(l, b, h));
        EXPECT_TRUE(starts.insert(k).second);
        EXPECT_TRUE(starts.insert(v).second);
        std::fill(k, k + tile_bytes, std::byte{1});  // ASan/valgrind would flag an overrun
      }
  // K and V, plus one f32 running V sum and two K moments per kv head, per layer.
  EXPECT_EQ(layout.block_bytes(), (layout.block_elems() * 4 * 2 + 3 * 8 * 4 * 3) * 2);
}

// Appends the rows of one sequence and checks every plane through the view a kernel gets: the
// stored K/V (f32, f16, INT8 within its step), K^T == K, the running V sums and K moments
// (mean, M2) across blocks against double two-pass sums of the appended keys, and that a swap (read_block / write_block) and a copy-on-write (copy_block) carry every plane.
TEST(CpuKvStorage, AppendFillsEveryPlaneAndBlocksMoveWhole) {
  for (KvDtype dtype : {KvDtype::kF32, KvDtype::kF16, KvDtype::kI8}) {
    KvLayout layout = small_layout(dtype);  // 2 layers, 3 kv heads, d 8, block 4
    layout.transposed_k = true;
    CpuKvStorage pool(layout, 6);
    const std::vector<int32_t> table = {4, 1, 3};  // 10 positions over three blocks
    std::vector<float> k(3 * 8), v(3 * 8), sum(3 * 8, 0.0f);
    std::vector<std::vector<float>> ks, vs;
    for (int32_t pos = 0; pos < 10; ++pos) {
      for (int i = 0; i < 24; ++i) {
        k[i] = std::sin(0.37f * (pos * 24 + i));
        v[i] = std::cos(0.91f * (pos * 24 + i)) * 2.0f;
      }
      ks.push_back(k);
      vs.push_back(v);
      for (int32_t layer = 0; layer < 2; ++layer) pool.append(layer, table.data(), pos, k.data(), v.data());
    }
    const float tol = dtype == KvDtype::kF32 ? 0.0f : dtype == KvDtype::kF16 ? 1e-3f : 4.0f / 255.0f / 2.0f + 1e-6f;
    for (int32_t layer = 0; layer < 2; ++layer) {
      const PagedKvView view = pool.view(layer, table.data());
      ASSERT_NE(view.k_t, nullptr);
      ASSERT_NE(view.v_sum, nullptr);
      ASSERT_NE(view.k_moments, nullptr);
      for (int32_t h = 0; h < 3; ++h) {
        std::vector<float> run(8, 0.0f);
        std::vector<double> k_sum(8, 0.0);
        for (int32_t pos = 0; pos < 10; ++pos) {
          std::vector<float> kr(8), vr(8);
          ref::load_kv_row(view, view.k, pos, h, kr.data());
          ref::load_kv_row(view, view.v, pos, h, vr.data());
          const size_t elem = kv_dtype_bytes(dtype);
          const auto* kt = static_cast<const std::byte*>(view.k_t) + view.tile_offset(pos / 4, h) * elem;
          const auto* kk = static_cast<const std::byte*>(view.k) + view.tile_offset(pos / 4, h) * elem;
          for (int c = 0; c < 8; ++c) {
            EXPECT_NEAR(kr[c], ks[pos][h * 8 + c], tol) << kv_dtype_name(dtype) << " pos " << pos;
            EXPECT_NEAR(vr[c], vs[pos][h * 8 + c], 2 * tol) << kv_dtype_name(dtype) << " pos " << pos;
            EXPECT_EQ(std::memcmp(kt + (c * 4 + pos % 4) * elem, kk + ((pos % 4) * 8 + c) * elem, elem), 0);
            run[c] += vs[pos][h * 8 + c];
            k_sum[c] += ks[pos][h * 8 + c];
            // A block's sums cover the sequence up to the last row written in it.
            if (pos % 4 == 3 || pos == 9) {
              EXPECT_NEAR(view.v_sum[view.sum_index(pos, h) + c], run[c], 1e-5f) << "running V sum at pos " << pos;
              const double mean = k_sum[c] / (pos + 1);
              double m2 = 0;
              for (int32_t t = 0; t <= pos; ++t) m2 += (ks[t][h * 8 + c] - mean) * (ks[t][h * 8 + c] - mean);
              const float* moments = view.k_moments + view.key_moments_index(pos, h);
              EXPECT_NEAR(moments[c], mean, 1e-6) << "running K mean at pos " << pos;
              EXPECT_NEAR(moments[8 + c], m2, 1e-5 * (1 + m2)) << "running K M2 at pos " << pos;
            }
          }
        }
      }
    }
    // Swap block 1 out and into block 5; copy block 3 onto block 0: every plane follows.
    std::vector<std::byte> bytes(layout.block_bytes());
    pool.read_block(1, bytes.data());
    pool.write_block(5, bytes.data());
    pool.copy_block(3, 0);
    EXPECT_THROW(pool.copy_block(3, 6), std::logic_error) << "block ids are checked";
    const std::vector<int32_t> moved = {4, 5, 0};
    for (int32_t layer = 0; layer < 2; ++layer) {
      const PagedKvView a = pool.view(layer, table.data()), b = pool.view(layer, moved.data());
      for (int32_t pos = 0; pos < 10; ++pos)
        for (int32_t h = 0; h < 3; ++h) {
          std::vector<float> ra(8), rb(8);
          ref::load_kv_row(a, a.k, pos, h, ra.data());
          ref::load_kv_row(b, b.k, pos, h, rb.data());
          EXPECT_EQ(ra, rb);
          ref::load_kv_row(a, a.v, pos, h, ra.data());
          ref::load_kv_row(b, b.v, pos, h, rb.data());
          EXPECT_EQ(ra, rb);
          EXPECT_EQ(std::memcmp(&a.v_sum[a.sum_index(pos, h)], &b.v_sum[b.sum_index(pos, h)], 8 * sizeof(float)), 0);
          EXPECT_EQ(std::memcmp(&a.k_moments[a.key_moments_index(pos, h)], &b.k_moments[b.key_moments_index(pos, h)],
                                16 * sizeof(float)),
                    0);
        }
    }
  }
}

// SparQ's key spread as served: the running moments give the keys' spread over [0, pos] (against
// a double two-pass over the stored keys) even along components with a large mean and a tiny
// spread (Gemma 3's QK-normed keys; Σk² − n·mean² in f32 loses them), and cpu_sparse_decode runs
// SparQ with that spread when the policy asks for it (the default) and with the paper's rule when
// it does not — which choose different dimensions here.
TEST(CpuKvStorage, SparqServesTheKeySpreadOfTheRunningMoments) {
  const int32_t d = 64, bs = 16, S = 600, blocks = (S + bs - 1) / bs, H = 3;
  KvLayout layout{1, 1, d, bs, KvDtype::kF32};
  layout.transposed_k = true;
  CpuKvStorage pool(layout, blocks + 2);
  std::vector<int32_t> table(blocks);
  for (int32_t i = 0; i < blocks; ++i) table[i] = (i * 7) % (blocks + 2);  // scattered, distinct
  std::mt19937 rng(11);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::vector<float> k(d), v(d);
  for (int32_t pos = 0; pos < S; ++pos) {
    for (int32_t c = 0; c < d; ++c) {
      // The first half: mean 4, spread 0.005; the second: mean 0, spread 1.
      k[c] = c < d / 2 ? 4.0f + 0.005f * n01(rng) : n01(rng);
      v[c] = n01(rng);
    }
    pool.append(0, table.data(), pos, k.data(), v.data());
  }
  const PagedKvView kv = pool.view(0, table.data());
  const std::vector<float> served = ref::sparq_key_spread_of_moments(kv, S), exact = ref::sparq_key_spread(kv, S);
  for (int32_t c = 0; c < d; ++c) EXPECT_NEAR(served[c], exact[c], 1e-3 * exact[c]) << "component " << c;

  // A query largest along the low-spread half: the paper's rule reads those dimensions.
  std::vector<float> q(static_cast<size_t>(H) * d);
  for (int32_t i = 0; i < H * d; ++i) q[i] = (i % d < d / 2 ? 3.0f : 1.0f) * n01(rng);
  ThreadPool threads(2);
  AttentionPolicy p{policy_kind("sparq")};
  const ref::SparqParams params = sparq::resolve(p, S, d);
  ASSERT_LT(params.k, S);
  for (bool key_spread : {true, false}) {
    p.set(sparq::kKeySpread, key_spread);
    std::vector<float> out_served(q.size()), out_kernel(q.size());
    const DecodeArgs a{q.data(), out_served.data(), H, S - 1, 1.0f / std::sqrt(static_cast<float>(d))};
    DecodeArgs b = a;
    b.out = out_kernel.data();
    LayerPolicyState state;
    const int64_t bytes = cpu_sparse_decode(threads, kv, a, p, state);
    cpu::SparqTrace trace;
    const cpu::SparqResult res = cpu::sparq_decode(threads, kv, b, params, &trace, key_spread ? served.data() : nullptr);
    EXPECT_EQ(out_served, out_kernel) << "key_spread " << key_spread;
    EXPECT_EQ(bytes, res.kv_bytes + (key_spread ? 4 * d : 0)) << "the moments' M2 row is counted";
    const int32_t low_spread_dims = static_cast<int32_t>(
        std::count_if(trace.dims[0].begin(), trace.dims[0].end(), [&](int32_t c) { return c < d / 2; }));
    if (key_spread) EXPECT_EQ(low_spread_dims, 0) << "√σ weighting reads the components along which keys differ";
    else EXPECT_EQ(low_spread_dims, res.r) << "the paper's rule reads the query's largest components";
  }
}

// Eviction writes dirty lines back before dropping them: the planes read the same afterwards
// (the break-even probe evicts a layer between timed steps and reads it again).
TEST(CpuKvStorage, EvictingALayerFromTheCachesKeepsItsBytes) {
  KvLayout layout = small_layout(KvDtype::kF16);
  layout.transposed_k = true;
  CpuKvStorage pool(layout, 3);
  const std::vector<int32_t> table = {2, 0, 1};
  std::vector<float> k(3 * 8), v(3 * 8);
  for (int32_t pos = 0; pos < 11; ++pos) {
    for (int i = 0; i < 24; ++i) k[i] = 0.1f * (pos + i), v[i] = -0.2f * (pos - i);
    for (int32_t layer = 0; layer < 2; ++layer) pool.append(layer, table.data(), pos, k.data(), v.data());
  }
  std::vector<std::byte> before(layout.block_bytes() * 3), after(before.size());
  for (int32_t b = 0; b < 3; ++b) pool.read_block(b, before.data() + b * layout.block_bytes());
  pool.evict_layer_from_cache(0, 3);
  for (int part = 0; part < 3; ++part) pool.evict_layer_from_cache(1, 2, part, 3);  // a pool's threads' shares
  pool.evict_layer_from_cache(7, 3);  // past the layers: nothing
  for (int32_t b = 0; b < 3; ++b) pool.read_block(b, after.data() + b * layout.block_bytes());
  EXPECT_EQ(before, after);
  EXPECT_NE(std::count(before.begin(), before.end(), std::byte{0}), static_cast<std::ptrdiff_t>(before.size()));
  const char text[] = "an unaligned range";
  cpu::evict_from_cache(text + 3, sizeof(text) - 3);
  EXPECT_STREQ(text, "an unaligned range");
}

// The recompute scratch: shared blocks name one memory for every layer (what layer 0 appends
// there, layer 1's view reads, every plane), while the layers' own blocks stay apart; the
// shared ones start after a page-aligned count of own blocks.
TEST(CpuKvStorage, SharedBlocksAreOneMemoryForEveryLayer) {
  for (KvDtype dtype : {KvDtype::kF32, KvDtype::kF16, KvDtype::kI8}) {
    KvLayout layout = small_layout(dtype);  // 2 layers, 3 kv heads, d 8, block 4
    layout.transposed_k = true;
    CpuKvStorage pool(layout, 5, 2);
    ASSERT_GE(pool.first_shared(), 5);
    EXPECT_EQ(pool.num_blocks(), pool.first_shared() + 2);
    for (int p = 0; p < kKvPlanes; ++p)
      EXPECT_EQ(layout.plane_bytes(static_cast<KvPlane>(p)) * pool.first_shared() % 4096, 0u) << p;
    const int32_t s0 = pool.first_shared();
    const std::vector<int32_t> shared = {s0 + 1, s0}, own = {3, 0};
    std::vector<float> k(24), v(24);
    for (int32_t pos = 0; pos < 6; ++pos) {
      for (int i = 0; i < 24; ++i) {
        k[i] = std::sin(0.3f * (pos * 24 + i));
        v[i] = std::cos(0.7f * (pos * 24 + i));
      }
      pool.append(0, shared.data(), pos, k.data(), v.data());  // layer 0 only
      pool.append(0, own.data(), pos, k.data(), v.data());
    }
    const PagedKvView l0 = pool.view(0, shared.data()), l1 = pool.view(1, shared.data());
    const PagedKvView own1 = pool.view(1, own.data());
    for (int32_t pos = 0; pos < 6; ++pos)
      for (int32_t h = 0; h < 3; ++h) {
        std::vector<float> a(8), b(8), c(8);
        ref::load_kv_row(l0, l0.k, pos, h, a.data());
        ref::load_kv_row(l1, l1.k, pos, h, b.data());
        ref::load_kv_row(own1, own1.k, pos, h, c.data());
        EXPECT_EQ(a, b) << "layer 1 reads what layer 0 wrote to a shared block";
        EXPECT_EQ(c, std::vector<float>(8, 0.0f)) << "layer 1's own blocks were not written";
        ref::load_kv_row(l0, l0.v, pos, h, a.data());
        ref::load_kv_row(l1, l1.v, pos, h, b.data());
        EXPECT_EQ(a, b);
        EXPECT_EQ(std::memcmp(&l0.v_sum[l0.sum_index(pos, h)], &l1.v_sum[l1.sum_index(pos, h)], 8 * sizeof(float)), 0);
        EXPECT_EQ(std::memcmp(&l0.k_moments[l0.key_moments_index(pos, h)], &l1.k_moments[l1.key_moments_index(pos, h)],
                              16 * sizeof(float)),
                  0);
      }
    EXPECT_EQ(std::memcmp(pool.k_tile(0, s0, 2), pool.k_tile(1, s0, 2), layout.tile_elems() * kv_dtype_bytes(dtype)), 0);
    EXPECT_NE(pool.k_tile(0, 3, 0), pool.k_tile(1, 3, 0));
  }
}

// The KV planes' storage: zeroed, 2 MiB aligned (so transparent huge pages can back it),
// writable end to end, and moved without copying or double unmapping.
TEST(HugePageBuffer, IsZeroedAlignedWritableAndMovable) {
  const size_t bytes = (size_t{5} << 20) + 123;  // not a whole number of huge pages
  HugePageBuffer a(bytes);
  ASSERT_NE(a.data(), nullptr);
  EXPECT_EQ(a.size(), bytes);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % (size_t{2} << 20), 0u);
  size_t nonzero = 0;
  for (size_t i = 0; i < bytes; i += 997) nonzero += a.data()[i] != std::byte{0};
  EXPECT_EQ(nonzero, 0u);
  a.data()[0] = std::byte{1};
  a.data()[bytes - 1] = std::byte{2};
  std::byte* const p = a.data();
  HugePageBuffer b(std::move(a));
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(a.size(), 0u);
  HugePageBuffer c;
  c = std::move(b);
  EXPECT_EQ(c.data()[0], std::byte{1});
  EXPECT_EQ(c.data()[bytes - 1], std::byte{2});
  EXPECT_EQ(HugePageBuffer(0).data(), nullptr);
}

TEST(BlockTable, GrowsByBlocksAndReleasesOnDestruction) {
  BlockAllocator pool(4, 4);  // block_size 4
  {
    BlockTable table(pool);
    EXPECT_TRUE(table.reserve(1));
    EXPECT_EQ(table.blocks().size(), 1u);
    EXPECT_TRUE(table.reserve(4));
    EXPECT_EQ(table.blocks().size(), 1u);
    EXPECT_TRUE(table.reserve(9));
    EXPECT_EQ(table.blocks().size(), 3u);
    EXPECT_FALSE(table.reserve(20));  // needs 5 blocks, only 4 exist
    EXPECT_EQ(table.blocks().size(), 3u) << "a failed reserve allocates nothing";
    EXPECT_EQ(pool.free_blocks(), 1);
  }
  EXPECT_EQ(pool.free_blocks(), 4);
}

}  // namespace
}  // namespace fathom
