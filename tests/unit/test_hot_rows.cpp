// The hot-row cache's bookkeeping (engine/kv/hot_rows.h), shared by the CPU and CUDA backends: what it
// copies, what it maps, what it evicts, and the changes a device mirror of its map receives.
#include "engine/kv/hot_rows.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

namespace fathom {
namespace {

constexpr int32_t kLayers = 2, kHeads = 2, kBs = 16, kHostBlocks = 8, kFirstSlot = 10, kSlots = 2;

struct Copied {
  int32_t host_slot, g, offset;
  int64_t device_row;
  bool k, v;
};

// A sequence whose blocks all sit in the host tier, logical block i in host slot i.
std::vector<int32_t> host_table() {
  std::vector<int32_t> t(kHostBlocks);
  for (int32_t i = 0; i < kHostBlocks; ++i) t[i] = -i - 1;
  return t;
}

std::vector<int32_t> range(int32_t lo, int32_t hi) {
  std::vector<int32_t> v(hi - lo);
  std::iota(v.begin(), v.end(), lo);
  return v;
}

TEST(HotRows, CopiesMissesOnceAndMapsThemInsideItsSlots) {
  HotRows cache(kLayers, kHeads, kBs, kHostBlocks, kFirstSlot, kSlots);
  const std::vector<int32_t> table = host_table(), pos = {3, 17, 40};
  std::vector<Copied> copied;
  auto copy = [&](int32_t slot, int32_t g, int32_t off, int64_t row, bool k, bool v) {
    copied.push_back({slot, g, off, row, k, v});
    return int64_t{10};
  };
  cache.fetch(1, table.data(), 1, pos.data(), 3, /*need_v=*/false, copy);
  ASSERT_EQ(copied.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(copied[i].host_slot, pos[i] / kBs);
    EXPECT_EQ(copied[i].offset, pos[i] % kBs);
    EXPECT_EQ(copied[i].g, 1);
    EXPECT_TRUE(copied[i].k);
    EXPECT_FALSE(copied[i].v);
    // A row of kv head 1 in one of the cache's slots: [slot][n_kv_heads][block_size].
    const int64_t slot = copied[i].device_row / (kHeads * kBs), head = copied[i].device_row / kBs % kHeads;
    EXPECT_GE(slot, kFirstSlot);
    EXPECT_LT(slot, kFirstSlot + kSlots);
    EXPECT_EQ(head, 1);
    EXPECT_EQ(cache.map(1)[(static_cast<int64_t>(pos[i] / kBs) * kBs + pos[i] % kBs) * kHeads + 1],
              copied[i].device_row);
    EXPECT_EQ(cache.map(0)[(static_cast<int64_t>(pos[i] / kBs) * kBs + pos[i] % kBs) * kHeads + 1], -1);  // other layer
  }
  HotRows::Counts c = cache.take_counts();
  EXPECT_EQ(c.misses, 3);
  EXPECT_EQ(c.hits, 0);
  EXPECT_EQ(c.bytes, 30);
  // V now too: only the V parts are copied; then everything hits.
  copied.clear();
  cache.fetch(1, table.data(), 1, pos.data(), 3, /*need_v=*/true, copy);
  ASSERT_EQ(copied.size(), 3u);
  for (const Copied& x : copied) EXPECT_TRUE(!x.k && x.v);
  copied.clear();
  cache.fetch(1, table.data(), 1, pos.data(), 3, /*need_v=*/true, copy);
  EXPECT_TRUE(copied.empty());
  c = cache.take_counts();
  EXPECT_EQ(c.misses, 3);
  EXPECT_EQ(c.hits, 3);
}

TEST(HotRows, SkipsDeviceBlocksAndThrowsWhenOneCallCannotFit) {
  HotRows cache(kLayers, kHeads, kBs, kHostBlocks, kFirstSlot, kSlots);
  std::vector<int32_t> table = host_table();
  table[0] = 3;  // logical block 0 on the device
  int64_t copies = 0;
  auto copy = [&](int32_t, int32_t, int32_t, int64_t, bool, bool) { return ++copies, int64_t{0}; };
  const std::vector<int32_t> device_pos = range(0, kBs);
  cache.fetch(0, table.data(), 0, device_pos.data(), kBs, true, copy);
  EXPECT_EQ(copies, 0);
  const int32_t cap = cache.capacity();
  EXPECT_EQ(cap, kSlots * kBs);
  const std::vector<int32_t> fits = range(kBs, kBs + cap), too_many = range(kBs, kBs + cap + 1);
  cache.fetch(0, table.data(), 0, fits.data(), cap, true, copy);
  EXPECT_EQ(copies, cap);
  // Its first `cap` rows are cached (hits, now all asked for by this call): the next has no victim.
  EXPECT_THROW(cache.fetch(0, table.data(), 0, too_many.data(), cap + 1, true, copy), HotRowsFull);
  EXPECT_EQ(copies, cap);
  // Another kv head has its own pool: unaffected.
  cache.fetch(0, table.data(), 1, fits.data(), cap, true, copy);
  EXPECT_EQ(copies, 2 * cap);
}

TEST(HotRows, InvalidationAndEvictionReachTheChangeLog) {
  HotRows cache(kLayers, kHeads, kBs, kHostBlocks, kFirstSlot, kSlots, /*track_changes=*/true);
  const std::vector<int32_t> table = host_table();
  auto copy = [](int32_t, int32_t, int32_t, int64_t, bool, bool) { return int64_t{0}; };
  const std::vector<int32_t> pos = {5, 20};
  cache.fetch(1, table.data(), 0, pos.data(), 2, true, copy);
  std::vector<HotRows::Change> ch = cache.take_changes();
  ASSERT_EQ(ch.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const int64_t key = (static_cast<int64_t>(pos[i] / kBs) * kBs + pos[i] % kBs) * kHeads;
    EXPECT_EQ(ch[i].index, 1 * cache.map_size() + key);
    EXPECT_EQ(ch[i].value, cache.map(1)[key]);
    EXPECT_GE(ch[i].value, 0);
  }
  cache.invalidate_host_slot(1);  // position 20's block
  ch = cache.take_changes();
  ASSERT_EQ(ch.size(), 1u);
  EXPECT_EQ(ch[0].index, 1 * cache.map_size() + (1 * kBs + 4) * kHeads);
  EXPECT_EQ(ch[0].value, -1);
  EXPECT_EQ(cache.map(1)[(1 * kBs + 4) * kHeads], -1);
  EXPECT_GE(cache.map(1)[5 * kHeads], 0);  // the other block's row stays
  // Filling the pool with other rows evicts position 5: its entry goes back to -1 in the log.
  const std::vector<int32_t> others = range(2 * kBs, 2 * kBs + cache.capacity());
  cache.fetch(1, table.data(), 0, others.data(), cache.capacity(), true, copy);
  ch = cache.take_changes();
  EXPECT_TRUE(std::any_of(ch.begin(), ch.end(), [&](const HotRows::Change& c) {
    return c.index == 1 * cache.map_size() + 5 * kHeads && c.value == -1;
  }));
  EXPECT_EQ(cache.map(1)[5 * kHeads], -1);
  // clear() forgets every row and the log: the next fetch of a cached row copies it again.
  cache.take_counts();
  cache.clear();
  EXPECT_TRUE(cache.take_changes().empty());
  EXPECT_EQ(cache.map(1)[(2 * kBs) * kHeads], -1);
  cache.fetch(1, table.data(), 0, others.data(), 1, true, copy);
  EXPECT_EQ(cache.take_counts().misses, 1);
}

// A set larger than the cache, fetched in capacity-sized batches step after step: in the same
// order every step, CLOCK evicts each batch's rows just before they are wanted again; alternating
// the order (sparse::attend's `reverse`) reuses the last batch's rows first.
TEST(HotRows, AlternatingBatchOrderHitsWhereACycleMisses) {
  const std::vector<int32_t> table = host_table();
  auto copy = [](int32_t, int32_t, int32_t, int64_t, bool, bool) { return int64_t{0}; };
  auto hits_over_steps = [&](bool alternate) {
    HotRows cache(1, 1, kBs, kHostBlocks, 0, kSlots);
    const int32_t cap = cache.capacity();
    std::vector<std::vector<int32_t>> batches = {range(0, cap), range(cap, 2 * cap), range(2 * cap, 2 * cap + cap / 2)};
    for (int step = 0; step < 10; ++step) {
      std::vector<std::vector<int32_t>> order = batches;
      if (alternate && step % 2 == 1) std::reverse(order.begin(), order.end());
      for (const std::vector<int32_t>& b : order)
        cache.fetch(0, table.data(), 0, b.data(), static_cast<int32_t>(b.size()), true, copy);
    }
    return cache.take_counts().hits;
  };
  const int64_t cyclic = hits_over_steps(false), alternating = hits_over_steps(true);
  EXPECT_EQ(cyclic, 0);
  EXPECT_GE(alternating, 9 * kSlots * kBs / 2);  // at least the last batch's rows, every step after the first
  std::printf("hits over 10 steps: in order %lld, alternating %lld\n", static_cast<long long>(cyclic),
              static_cast<long long>(alternating));
}

}  // namespace
}  // namespace fathom
