// cpu::bifurcated_decode's other paths (its numerics against kernels/ref are the op-test grid's,
// tests/kernel/test_backend_ops.cpp): keys read through a tiered cache's staging sources give
// bitwise the resident result, and segments that do not tile a sequence's prefix are rejected
// (the fault path).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/sparse_attention.h"
#include "tests/kernel/bifurcated_fixture.h"

namespace fathom {
namespace {

using testing::Group;
using testing::make_group;

// A tiered cache's staging as bifurcated_decode sees it (cpu::ChunkSourceFor): each source makes
// at most two key chunks of its sequence's view readable per prepare(); every other block of that
// view points at a NaN block, so a read outside what was prepared shows.
struct TwoChunkSource final : cpu::KeyChunkSource {
  TwoChunkSource(const PagedKvView& v, const std::vector<int32_t>& t, int32_t nan, int32_t chunk_blocks)
      : base(v), table(t), nan_block(nan), chunk_blocks(chunk_blocks) {}
  int32_t prepare(int32_t first, int32_t end) override {
    const int32_t last = std::min(end, first + 2);
    pass_table.assign(table.size(), nan_block);
    for (int32_t c = first; c < last; ++c)
      for (int32_t b = c * chunk_blocks; b < std::min<int32_t>((c + 1) * chunk_blocks, table.size()); ++b)
        pass_table[b] = table[b];
    chunks += last - first;
    view_ = base;
    view_.block_table = pass_table.data();
    return last;
  }
  const PagedKvView& view(int32_t) const override { return view_; }
  PagedKvView base;
  const std::vector<int32_t>& table;
  int32_t nan_block, chunk_blocks, chunks = 0;
  std::vector<int32_t> pass_table;
  PagedKvView view_;
};

// Four samples of a 700-token prompt, read through staging sources: bitwise the result over the
// resident views, and the shared prompt staged once for the group (through its first member's
// source), the other members staging only their own suffix's chunks.
TEST(BifurcatedCpu, StagedSourcesGiveTheResidentResult) {
  std::mt19937 rng(12);
  for (KvDtype dtype : {KvDtype::kF32, KvDtype::kF16}) {
    const std::vector<int32_t> suffix = {5, 20, 1, 300};
    Group g = make_group(64, 3, dtype, {{0, 700, {0, 1, 2, 3}}}, suffix, rng);
    // One more physical block, all NaN bytes, for the sources' unprepared blocks.
    const size_t tile = static_cast<size_t>(g.n_kv) * g.block_size * g.d * kv_dtype_bytes(dtype);
    const int32_t nan_block = static_cast<int32_t>(g.pool.k.size() / tile);
    for (std::vector<uint8_t>* plane : {&g.pool.k, &g.pool.v, &g.pool.k_t}) plane->resize(plane->size() + tile, 0xff);
    std::vector<PagedKvView> views = g.views;
    for (int32_t i = 0; i < g.size(); ++i) {
      views[i].k = g.pool.k.data();
      views[i].v = g.pool.v.data();
      views[i].k_t = views[i].k_t != nullptr ? g.pool.k_t.data() : nullptr;
    }
    // The staged run's own views have every block unreadable (a tiered table's host entries):
    // only what the sources prepare can be read.
    std::vector<std::vector<int32_t>> nan_tables(g.size());
    std::vector<PagedKvView> tiered = views;
    for (int32_t i = 0; i < g.size(); ++i) {
      nan_tables[i].assign(g.tables[i].size(), nan_block);
      tiered[i].block_table = nan_tables[i].data();
    }
    std::vector<ref::SharedSegment> segments = g.segments, tiered_segments = g.segments;
    for (size_t k = 0; k < segments.size(); ++k) {
      segments[k].kv = &views[g.segments[k].kv - g.views.data()];
      tiered_segments[k].kv = &tiered[g.segments[k].kv - g.views.data()];
    }
    const int32_t chunk_blocks = cpu::key_chunk_positions(g.block_size) / g.block_size;
    std::vector<TwoChunkSource> sources;
    for (int32_t i = 0; i < g.size(); ++i) sources.emplace_back(views[i], g.tables[i], nan_block, chunk_blocks);

    ThreadPool pool(2);
    std::vector<float> out_resident, out_staged;
    std::vector<DecodeArgs> a = g.args(out_resident), b = g.args(out_staged);
    const int64_t bytes_resident = cpu::bifurcated_decode(pool, segments, views.data(), a.data(), g.size());
    const int64_t bytes_staged = cpu::bifurcated_decode(pool, tiered_segments, tiered.data(), b.data(), g.size(),
                                                        [&](const PagedKvView& v) -> cpu::KeyChunkSource* {
                                                          return &sources[&v - tiered.data()];
                                                        });
    EXPECT_EQ(out_staged, out_resident) << kv_dtype_name(dtype);
    EXPECT_EQ(bytes_staged, bytes_resident);
    const int32_t chunk = chunk_blocks * g.block_size;
    auto chunks_of = [&](int32_t begin, int32_t end) { return (end - 1) / chunk - begin / chunk + 1; };
    EXPECT_EQ(sources[0].chunks, chunks_of(0, 700) + chunks_of(700, 705));  // the shared prompt, then its suffix
    for (int32_t i = 1; i < g.size(); ++i) EXPECT_EQ(sources[i].chunks, chunks_of(700, 700 + suffix[i])) << i;
  }
}

TEST(BifurcatedCpu, RejectsSegmentsThatDoNotTile) {
  std::mt19937 rng(5);
  const Group g = make_group(64, 2, KvDtype::kF32, {{0, 40, {0, 1}}}, {3, 4}, rng);
  ThreadPool pool(2);
  std::vector<float> out;
  std::vector<DecodeArgs> a = g.args(out);
  std::vector<ref::SharedSegment> gap = g.segments;
  gap[0].begin = 16;  // [0, 16) covered by nothing
  EXPECT_THROW(cpu::bifurcated_decode(pool, gap, g.views.data(), a.data(), g.size()), std::invalid_argument);
  std::vector<ref::SharedSegment> past = g.segments;
  past[0].end = g.pos[0] + 2;  // beyond sequence 0's query
  EXPECT_THROW(cpu::bifurcated_decode(pool, past, g.views.data(), a.data(), g.size()), std::invalid_argument);
}

}  // namespace
}  // namespace fathom
