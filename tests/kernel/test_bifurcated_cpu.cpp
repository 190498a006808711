// cpu::bifurcated_decode (every ISA variant of the inner kernel, and the AVX-512 and AMX many-rows
// GEMM kernels for passes of more than kManyRows rows; 1 and 2 threads) against
// ref::bifurcated_attention and against cpu::paged_attention run once per sequence, over head dim
// 64/128/256, GQA group 1/3/4/8, f32/f16/INT8 KV, b = 1, 2, 5, 16 sequences, shared prefixes of
// 1, 15, 16, 17, 300 tokens (inside, at and across block edges, several chunks), own suffixes of
// 0..40 tokens, nested prefixes (one shared by all, others shared by subsets, listed out of
// order) and two independent groups in one call; blocks of 32 and 48 tokens (AMX calls spanning two
// 256-key pieces). Shared blocks are physically shared; a block holding both shared and own tokens
// is a per-sequence copy, as after copy-on-write. Unwritten slots past a sequence's end hold NaN
// (f32 / f16).
// Tolerances (max |cpu − other|, |v| ~ 1), the same as test_attention's: f32 and f16 5e-6 (both
// sides read the same stored values; only accumulation order and chunk cuts differ), INT8 1e-5
// (the kernel forms scale·(q·x_q) + min·Σq in f32, see test_attention); the AMX rows kernel: f16
// 5e-5, INT8 1e-4 (q and p split into two bf16 terms each are exact to 2^-17,
// kernels/cpu/attention_rows_amx.cpp; the error grows with head_dim and INT8's logit cancels; worst
// seen ~1.7e-5 f16 and ~2.9e-5 INT8, at d 256). Outputs with 1 and 2
// threads must be bitwise equal. KV bytes must equal (Σ segment lengths + Σ suffix lengths) ·
// 2 · kv_row_bytes · n_kv_heads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_partial.h"
#include "kernels/cpu/sparse_attention.h"
#include "kernels/ref/bifurcated.h"
#include "paged_kv_fixture.h"

namespace fathom {
namespace {

struct SegmentSpec {
  int32_t begin, end;
  std::vector<int32_t> members;
};

// b sequences over one paged pool. Token t of sequence i is the shared row of the segment that
// covers it for i, else i's own row.
struct Group {
  int32_t d = 0, n_kv = 2, group = 1, n_heads = 0, block_size = 16;
  testing::PagedKvFixture pool;
  std::vector<std::vector<int32_t>> tables;  // per sequence
  std::vector<PagedKvView> views;
  std::vector<ref::SharedSegment> segments;
  std::vector<int32_t> pos;                  // per sequence: the query position (length − 1)
  std::vector<int32_t> suffix_len;
  std::vector<float> q;                      // [b][n_heads][d]
  int64_t expect_bytes = 0;
  float softcap = 0.0f;                      // > 0: soft-capped logits (LogitScale)
  std::vector<float> sinks;                  // [n_heads] attention sinks, or empty

  int32_t size() const { return static_cast<int32_t>(pos.size()); }
  std::vector<DecodeArgs> args(std::vector<float>& out) const {
    out.assign(q.size(), NAN);
    std::vector<DecodeArgs> a(size());
    for (int32_t i = 0; i < size(); ++i)
      a[i] = DecodeArgs{q.data() + static_cast<int64_t>(i) * n_heads * d, out.data() + static_cast<int64_t>(i) * n_heads * d,
                        n_heads, pos[i], 1.0f / std::sqrt(static_cast<float>(d)), softcap,
                        sinks.empty() ? nullptr : sinks.data()};
    return a;
  }
};

Group make_group(int32_t d, int32_t group, KvDtype dtype, const std::vector<SegmentSpec>& specs,
                 const std::vector<int32_t>& suffix, std::mt19937& rng, bool with_k_t = true, int32_t block_size = 16) {
  Group g;
  g.d = d;
  g.group = group;
  g.block_size = block_size;
  g.n_heads = group * g.n_kv;
  const int32_t b = static_cast<int32_t>(suffix.size()), bs = g.block_size;
  // Token identity: (segment index, t) for shared tokens, (−1 − i, t) for own ones.
  std::vector<int32_t> covered_to(b, 0);
  for (const SegmentSpec& s : specs)
    for (int32_t i : s.members) covered_to[i] = std::max(covered_to[i], s.end);
  auto token = [&](int32_t i, int32_t t) {
    for (int32_t s = 0; s < static_cast<int32_t>(specs.size()); ++s)
      if (t >= specs[s].begin && t < specs[s].end &&
          std::find(specs[s].members.begin(), specs[s].members.end(), i) != specs[s].members.end())
        return std::make_pair(s, t);
    return std::make_pair(-1 - i, t);
  };
  std::map<std::vector<std::pair<int32_t, int32_t>>, int32_t> block_ids;  // block content -> physical
  std::vector<std::vector<int32_t>> logical(b);
  for (int32_t i = 0; i < b; ++i) {
    const int32_t len = covered_to[i] + suffix[i];
    g.pos.push_back(len - 1);
    g.suffix_len.push_back(suffix[i]);
    for (int32_t j = 0; j * bs < len; ++j) {
      std::vector<std::pair<int32_t, int32_t>> key;
      for (int32_t t = j * bs; t < std::min(len, (j + 1) * bs); ++t) key.push_back(token(i, t));
      auto it = block_ids.emplace(key, static_cast<int32_t>(block_ids.size())).first;
      logical[i].push_back(it->second);
    }
  }
  const int32_t physical = static_cast<int32_t>(block_ids.size());
  g.pool = testing::make_paged_kv(d, g.n_kv, bs, dtype, physical * bs, 0, rng);
  // Physical block of unique block u: the fixture's shuffled table; copy shared rows so every
  // slot holding the same token holds the same master row.
  std::map<std::pair<int32_t, int32_t>, std::pair<int32_t, int32_t>> first_slot;  // token -> (phys, slot)
  for (int32_t i = 0; i < b; ++i) {
    g.tables.emplace_back();
    for (int32_t j = 0; j < static_cast<int32_t>(logical[i].size()); ++j) {
      const int32_t phys = g.pool.table[logical[i][j]];
      g.tables[i].push_back(phys);
      for (int32_t t = j * bs; t < std::min(g.pos[i] + 1, (j + 1) * bs); ++t) {
        auto [it, fresh] = first_slot.emplace(token(i, t), std::make_pair(phys, t % bs));
        if (fresh) continue;
        for (int32_t h = 0; h < g.n_kv; ++h) {
          const size_t src = ((static_cast<size_t>(it->second.first) * g.n_kv + h) * bs + it->second.second) * d;
          const size_t dst = ((static_cast<size_t>(phys) * g.n_kv + h) * bs + t % bs) * d;
          std::copy_n(&g.pool.kf[src], d, &g.pool.kf[dst]);
          std::copy_n(&g.pool.vf[src], d, &g.pool.vf[dst]);
        }
      }
    }
  }
  // Slots past a sequence's last position in its last block were never written: NaN there (f32 /
  // f16; INT8 rows carry parameters the kernels read for whole 16-key groups), so a kernel that
  // lets a dead key's K or V reach the sums fails.
  if (dtype != KvDtype::kI8)
    for (int32_t i = 0; i < b; ++i)
      for (int32_t t = g.pos[i] + 1; t < (g.pos[i] / bs + 1) * bs; ++t)
        for (int32_t h = 0; h < g.n_kv; ++h) {
          const size_t at = ((static_cast<size_t>(g.tables[i].back()) * g.n_kv + h) * bs + t % bs) * d;
          std::fill_n(&g.pool.kf[at], d, NAN);
          std::fill_n(&g.pool.vf[at], d, NAN);
        }
  g.pool.store();
  for (int32_t i = 0; i < b; ++i) {
    PagedKvView v = g.pool.view(with_k_t, false);
    v.block_table = g.tables[i].data();
    g.views.push_back(v);
  }
  int64_t rows_read = 0;
  for (const SegmentSpec& s : specs) {
    g.segments.push_back({&g.views[s.members[0]], s.begin, s.end, s.members});
    rows_read += s.end - s.begin;
  }
  for (int32_t x : suffix) rows_read += x;
  g.expect_bytes = rows_read * 2 * static_cast<int64_t>(kv_row_bytes(dtype, d)) * g.n_kv;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  g.q.resize(static_cast<size_t>(b) * g.n_heads * d);
  for (float& x : g.q) x = normal(rng);
  return g;
}

float tolerance(KvDtype dtype, bool amx = false) {
  // AMX: q and p (INT8: p·v_scale) as two bf16 terms each, exact to 2^-17; INT8's logit
  // scale·(q·x) + min·Σq cancels, so its error is larger (worst seen 1.7e-5 f16, 2.9e-5 INT8).
  if (amx && dtype == KvDtype::kF16) return 5e-5f;
  if (amx && dtype == KvDtype::kI8) return 1e-4f;
  switch (dtype) {
    case KvDtype::kF32: return 5e-6f;
    case KvDtype::kF16: return 5e-6f;
    case KvDtype::kI8: return 1e-5f;
  }
  return 0.0f;
}

float max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float e = 0;
  for (size_t i = 0; i < a.size(); ++i) e = std::max(e, std::fabs(a[i] - b[i]));
  return std::isnan(e) ? INFINITY : e;
}

struct Worst {
  float vs_ref[3] = {0, 0, 0}, vs_dense[3] = {0, 0, 0};
  float amx_vs_ref[3] = {0, 0, 0}, amx_vs_dense[3] = {0, 0, 0};
  int runs = 0;
};

// Runs every ISA variant on 1 and 2 threads and checks against the reference and dense attention.
void check(const Group& g, KvDtype dtype, Worst& worst, const char* what) {
  static ThreadPool pool1(1), pool2(2);
  std::vector<float> expect, dense, got1, got2;
  std::vector<DecodeArgs> a = g.args(expect);
  const int64_t ref_bytes = ref::bifurcated_attention(g.segments, g.views.data(), a.data(), g.size());
  if (dtype != KvDtype::kI8) {  // the reference counts elements only, without INT8's row parameters
    EXPECT_EQ(ref_bytes, g.expect_bytes) << what;
  }
  // Dense: each sequence alone through its own view.
  std::vector<DecodeArgs> ad = g.args(dense);
  for (int32_t i = 0; i < g.size(); ++i)
    cpu::paged_attention(pool2, g.views[i], AttentionArgs{ad[i].q, ad[i].out, 1, g.n_heads, g.pos[i], 0, ad[i].scale, ad[i].softcap,
                                                          ad[i].sinks});
  const int di = static_cast<int>(dtype);
  const std::pair<cpu::PartialAttentionFn, cpu::PartialAttentionFn> variants[] = {
      {cpu::partial_attention_portable(), nullptr},
      {cpu::partial_attention_avx2(), nullptr},
      {cpu::partial_attention_avx512(), nullptr},
      {cpu::partial_attention_avx512(), cpu::partial_attention_rows_avx512()},
      {cpu::partial_attention_avx512(), cpu::partial_attention_rows_amx()}};
  for (size_t vi = 0; vi < std::size(variants); ++vi) {
    const auto [kernel, many_rows] = variants[vi];
    const bool amx = vi + 1 == std::size(variants);
    if (!kernel || (amx && !many_rows)) continue;
    std::vector<DecodeArgs> a1 = g.args(got1), a2 = g.args(got2);
    const int64_t b1 =
        cpu::bifurcated_decode_with(kernel, many_rows, pool1, g.segments, g.views.data(), a1.data(), g.size());
    const int64_t b2 =
        cpu::bifurcated_decode_with(kernel, many_rows, pool2, g.segments, g.views.data(), a2.data(), g.size());
    ASSERT_EQ(b1, g.expect_bytes) << what;
    ASSERT_EQ(b2, g.expect_bytes) << what;
    for (size_t x = 0; x < got1.size(); ++x) ASSERT_EQ(got1[x], got2[x]) << what << " 1 vs 2 threads, elem " << x;
    const float e_ref = max_diff(got1, expect), e_dense = max_diff(got1, dense);
    float* w_ref = amx ? &worst.amx_vs_ref[di] : &worst.vs_ref[di];
    float* w_dense = amx ? &worst.amx_vs_dense[di] : &worst.vs_dense[di];
    *w_ref = std::max(*w_ref, e_ref);
    *w_dense = std::max(*w_dense, e_dense);
    ASSERT_LE(e_ref, tolerance(dtype, amx)) << what << " vs ref";
    ASSERT_LE(e_dense, tolerance(dtype, amx)) << what << " vs dense";
    worst.runs += 2;
  }
  std::vector<DecodeArgs> ab = g.args(got1);
  ASSERT_EQ(cpu::bifurcated_decode(pool2, g.segments, g.views.data(), ab.data(), g.size()), g.expect_bytes);
  ASSERT_LE(max_diff(got1, expect), tolerance(dtype, cpu::partial_attention_rows_amx() != nullptr))
      << what << " (dispatched kernel)";
}

void print(const char* name, const Worst& w) {
  std::printf("%s: %d runs; worst |cpu - ref| f32 %.3g f16 %.3g int8 %.3g; |bifurcated - dense| f32 %.3g f16 %.3g "
              "int8 %.3g\n",
              name, w.runs, w.vs_ref[0], w.vs_ref[1], w.vs_ref[2], w.vs_dense[0], w.vs_dense[1], w.vs_dense[2]);
  std::printf("%s, AMX rows kernel: worst |cpu - ref| f16 %.3g int8 %.3g (f32 takes the AVX-512 kernel: %.3g); "
              "|bifurcated - dense| f16 %.3g int8 %.3g\n",
              name, w.amx_vs_ref[1], w.amx_vs_ref[2], w.amx_vs_ref[0], w.amx_vs_dense[1], w.amx_vs_dense[2]);
}

TEST(BifurcatedCpu, OnePrefixMatchesReferenceAndDenseOnGrid) {
  std::mt19937 rng(2024);
  std::uniform_int_distribution<int32_t> suffix_len(0, 40);
  Worst worst;
  for (int32_t d : {64, 128, 256})
    for (int32_t G : {1, 3, 4, 8})
      for (KvDtype dtype : {KvDtype::kF32, KvDtype::kF16, KvDtype::kI8})
        for (int32_t b : {1, 2, 5, 16})
          for (int32_t prefix : {1, 15, 16, 17, 300}) {
            std::vector<int32_t> members(b), suffix(b);
            for (int32_t i = 0; i < b; ++i) {
              members[i] = i;
              suffix[i] = suffix_len(rng);
            }
            suffix[0] = 0;                    // a sequence whose query is the last shared token
            if (b > 1) suffix[b - 1] = 40;
            // Kᵀ plane as the engine keeps it, except for two prefix lengths (the row kernels).
            const Group g = make_group(d, G, dtype, {{0, prefix, members}}, suffix, rng, prefix != 15 && prefix != 17);
            char what[160];
            std::snprintf(what, sizeof what, "d=%d G=%d %s b=%d prefix=%d", d, G, kv_dtype_name(dtype), b, prefix);
            check(g, dtype, worst, what);
            if (::testing::Test::HasFatalFailure()) return;
          }
  print("one prefix", worst);
}

// Soft-capped logits (Gemma 2) and attention sinks (gpt-oss) through every variant, the many-rows
// kernels included (b = 16).
TEST(BifurcatedCpu, SoftCapsAndSinksMatchReferenceAndDense) {
  std::mt19937 rng(5150);
  Worst worst;
  for (int32_t d : {64, 256})
    for (int32_t G : {1, 4})
      for (KvDtype dtype : {KvDtype::kF32, KvDtype::kF16, KvDtype::kI8})
        for (int32_t b : {2, 16})
          for (int32_t prefix : {17, 300}) {
            std::vector<int32_t> members(b), suffix(b, 9);
            for (int32_t i = 0; i < b; ++i) members[i] = i;
            Group g = make_group(d, G, dtype, {{0, prefix, members}}, suffix, rng, prefix != 17);
            if (b == 2) {
              g.softcap = 1.0f;
            } else {
              std::normal_distribution<float> sink(1.0f, 1.0f);
              for (int32_t h = 0; h < g.n_heads; ++h) g.sinks.push_back(sink(rng));
            }
            char what[160];
            std::snprintf(what, sizeof what, "capped/sinks d=%d G=%d %s b=%d prefix=%d", d, G, kv_dtype_name(dtype), b, prefix);
            check(g, dtype, worst, what);
            if (::testing::Test::HasFatalFailure()) return;
          }
  print("soft-capped (b 2), sinks (b 16)", worst);
}

TEST(BifurcatedCpu, NestedPrefixesAndSeveralGroups) {
  std::mt19937 rng(77);
  Worst worst;
  for (int32_t d : {64, 128})
    for (int32_t G : {1, 3, 8})
      for (KvDtype dtype : {KvDtype::kF32, KvDtype::kF16, KvDtype::kI8}) {
        // System prompt [0, 37) shared by all 6; document A [37, 300) by {0, 2, 4}; document B
        // [37, 90) by {1, 3}, then B' [90, 333) by {3} alone; sequence 5 has only the system
        // prompt. Listed out of position order.
        const std::vector<SegmentSpec> nested = {
            {37, 300, {0, 2, 4}}, {90, 333, {3}}, {0, 37, {0, 1, 2, 3, 4, 5}}, {37, 90, {1, 3}}};
        const Group g = make_group(d, G, dtype, nested, {5, 0, 17, 40, 1, 23}, rng);
        char what[160];
        std::snprintf(what, sizeof what, "nested d=%d G=%d %s", d, G, kv_dtype_name(dtype));
        check(g, dtype, worst, what);
        if (::testing::Test::HasFatalFailure()) return;
        // Two independent groups plus a sequence that shares nothing, in one call.
        const std::vector<SegmentSpec> groups = {{0, 520, {0, 1, 2}}, {0, 64, {3, 4}}};
        const Group g2 = make_group(d, G, dtype, groups, {3, 16, 0, 9, 31, 70}, rng);
        std::snprintf(what, sizeof what, "two groups d=%d G=%d %s", d, G, kv_dtype_name(dtype));
        check(g2, dtype, worst, what);
        if (::testing::Test::HasFatalFailure()) return;
      }
  print("nested / several groups", worst);
}

// Blocks of 32 and 48 tokens: a 48-token block makes split-K chunks of 288 keys, so the AMX
// kernel's calls span two 256-key pieces (the online rescale between them); 48 rows (b = 16,
// G = 3) is past the dispatcher's AMX threshold.
TEST(BifurcatedCpu, OtherBlockSizesAndSeveralPiecesPerCall) {
  std::mt19937 rng(31);
  Worst worst;
  for (int32_t bs : {32, 48})
    for (int32_t d : {64, 128})
      for (KvDtype dtype : {KvDtype::kF32, KvDtype::kF16, KvDtype::kI8}) {
        std::vector<int32_t> members(16), suffix(16);
        for (int32_t i = 0; i < 16; ++i) {
          members[i] = i;
          suffix[i] = (i * 7) % 41;
        }
        const Group g = make_group(d, 3, dtype, {{0, 700, members}}, suffix, rng, true, bs);
        char what[160];
        std::snprintf(what, sizeof what, "block %d d=%d %s b=16 prefix=700", bs, d, kv_dtype_name(dtype));
        check(g, dtype, worst, what);
        if (::testing::Test::HasFatalFailure()) return;
      }
  print("block sizes 32 / 48", worst);
}

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
