// BlockPool reference counting and BlockTable growth/release.
#include <gtest/gtest.h>

#include <set>

#include "engine/kv/block_pool.h"
#include "engine/kv/block_table.h"

namespace fathom {
namespace {

KvLayout small_layout(KvDtype dtype = KvDtype::kF16) { return KvLayout{2, 3, 8, 4, dtype}; }

TEST(BlockPool, AllocatesEveryBlockOnceThenRunsOut) {
  BlockPool pool(small_layout(), 5);
  std::set<int32_t> seen;
  for (int i = 0; i < 5; ++i) {
    const int32_t b = pool.allocate();
    ASSERT_GE(b, 0);
    EXPECT_TRUE(seen.insert(b).second);
  }
  EXPECT_EQ(pool.allocate(), -1);
  EXPECT_EQ(pool.free_blocks(), 0);
}

TEST(BlockPool, SharedBlockIsFreedByTheLastRelease) {
  BlockPool pool(small_layout(), 2);
  const int32_t b = pool.allocate();
  pool.retain(b);
  EXPECT_EQ(pool.ref_count(b), 2);
  pool.release(b);
  EXPECT_EQ(pool.free_blocks(), 1);
  pool.release(b);
  EXPECT_EQ(pool.free_blocks(), 2);
  EXPECT_THROW(pool.release(b), std::logic_error);
}

TEST(BlockPool, TilesOfDifferentBlocksLayersAndHeadsDoNotOverlap) {
  const KvLayout layout = small_layout(KvDtype::kF32);
  BlockPool pool(layout, 3);
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
  EXPECT_EQ(layout.block_bytes(), layout.block_elems() * 4 * 2 * 2);
}

TEST(BlockTable, GrowsByBlocksAndReleasesOnDestruction) {
  BlockPool pool(small_layout(), 4);  // block_size 4
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
