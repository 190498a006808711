#pragma once
// b sequences over one paged pool, some sharing context segments (bifurcated attention's input):
// shared blocks are physically shared, a block holding both shared and own tokens is a
// per-sequence copy (as after copy-on-write), nested segments and independent groups allowed, and
// slots past a sequence's end are NaN (f32 / f16) so a kernel that reads a dead key shows it.
// Used by the op-test grid (test_backend_ops) and test_bifurcated_cpu_paths.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include "kernels/paged_kv.h"
#include "kernels/ref/bifurcated.h"
#include "tests/kernel/paged_kv_fixture.h"

namespace fathom::testing {

struct SegmentSpec {
  int32_t begin, end;
  std::vector<int32_t> members;
};

// b sequences over one paged pool. Token t of sequence i is the shared row of the segment that
// covers it for i, else i's own row.
struct Group {
  int32_t d = 0, n_kv = 2, group = 1, n_heads = 0, block_size = 16;
  PagedKvFixture pool;
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

inline Group make_group(int32_t d, int32_t group, KvDtype dtype, const std::vector<SegmentSpec>& specs,
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
  g.pool = make_paged_kv(d, g.n_kv, bs, dtype, physical * bs, 0, rng);
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

}  // namespace fathom::testing
