// Bifurcated (group) decode attention on the CPU (ALGORITHMS.md "Bifurcated attention"): every
// shared segment's K/V is read once per kv head for all member query rows (members × G rows of
// the partial kernel), every sequence's own suffix separately, and the partial states are merged
// exactly. Work items are (pass, kv head, key chunk), pulled by the threads from a shared counter;
// each writes its own partial slots, so the result does not depend on the thread count. Chunks
// start at absolute multiples of kKeyChunk and a row folds its partials in position order
// (segments sorted by begin, chunk by chunk, then the suffix), so it does not depend on the order
// the segments are listed in either.
#include <algorithm>
#include <atomic>
#include <functional>
#include <numeric>
#include <stdexcept>
#include <string>

#include "kernels/cpu/attention_partial.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/sparse_attention.h"

namespace fathom::cpu {
namespace {

// Keys [begin, end) of one view, read once per kv head for the rows of `seqs` (rows are
// [member][group], member m's row j is query head g·group + j of sequence seqs[m]).
struct Pass {
  const PagedKvView* kv = nullptr;
  int32_t begin = 0, end = 0;
  std::vector<int32_t> seqs;
  int32_t chunk = 0, chunk0 = 0, n_chunks = 0;  // chunk size (keys), first chunk index, count
  int64_t slot0 = 0;                            // first slot: [n_kv][n_chunks][rows]
  int32_t rows(int32_t group) const { return static_cast<int32_t>(seqs.size()) * group; }
};

struct Item {
  int32_t pass, head, chunk;  // chunk: local index within the pass
  int64_t cost;               // rows × keys, to hand out the heavy items first
};

struct Member {
  int32_t pass, index;  // pass and member position in it
};

}  // namespace

namespace {
// The kernel for a pass of more than kManyRows rows on AVX-512 CPUs. One layer's 16k keys at
// d 128, one thread, KV evicted (bench/results/bifurcated.md has the end-to-end effect): with the
// Kᵀ plane the per-row-group Kᵀ kernel beats the rows GEMM at every row count measured (6-192),
// and AMX beats the Kᵀ kernel from ~24 rows at d 128, ~48 at d 64 (R = 48: 5.4 vs 8.3 ms, d 128).
constexpr int32_t kAmxMinRows = 32;
void many_rows_avx512(const PagedKvView& kv, int32_t head, const PartialRows& rows, int32_t t0, int32_t t1,
                      LogitScale scale, float* acc, float* m, float* l, float* scratch) {
  static const PartialAttentionFn amx = partial_attention_rows_amx();
  static const PartialAttentionFn gemm = partial_attention_rows_avx512();
  static const PartialAttentionFn per_row = partial_attention_avx512();  // the Kᵀ kernel when the plane is there
  const PartialAttentionFn fn = kv.k_t == nullptr ? gemm : amx && rows.count >= kAmxMinRows ? amx : per_row;
  fn(kv, head, rows, t0, t1, scale, acc, m, l, scratch);
}
}  // namespace

int64_t bifurcated_decode(ThreadPool& pool, const std::vector<ref::SharedSegment>& segments, const PagedKvView* seq_kv,
                          const DecodeArgs* seq_args, int32_t n_seqs, const ChunkSourceFor& source_for) {
  static const PartialAttentionFn kernel = best_partial_attention();
  static const PartialAttentionFn many_rows =
      std::string(simd_level()) == "avx512" && partial_attention_rows_avx512() ? &many_rows_avx512 : nullptr;
  return bifurcated_decode_with(kernel, many_rows, pool, segments, seq_kv, seq_args, n_seqs, source_for);
}

int64_t bifurcated_decode_with(PartialAttentionFn kernel, PartialAttentionFn many_rows, ThreadPool& pool,
                               const std::vector<ref::SharedSegment>& segments, const PagedKvView* seq_kv,
                               const DecodeArgs* seq_args, int32_t n_seqs, const ChunkSourceFor& source_for) {
  if (n_seqs == 0) return 0;
  const int32_t d = seq_kv[0].head_dim, n_kv = seq_kv[0].n_kv_heads;
  const int32_t group = seq_args[0].n_heads / n_kv;
  const LogitScale scale = seq_args[0].logit_scale();
  const int64_t row_bytes = static_cast<int64_t>(kv_row_bytes(seq_kv[0].dtype, d));

  // Segments in position order (stable: equal begins keep their listed order), then the suffixes.
  std::vector<int32_t> order(segments.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return segments[a].begin < segments[b].begin; });
  std::vector<int32_t> covered(n_seqs, 0), suffix_begin(n_seqs, 0);
  std::vector<Pass> passes;
  for (int32_t s : order) {
    const ref::SharedSegment& seg = segments[s];
    for (int32_t i : seg.members) {
      if (i < 0 || i >= n_seqs) throw std::invalid_argument("bifurcated: member index out of range");
      if (seg.end > seq_args[i].pos + 1) throw std::invalid_argument("bifurcated: segment past the query");
      covered[i] += seg.end - seg.begin;
      suffix_begin[i] = std::max(suffix_begin[i], seg.end);
    }
    if (seg.end > seg.begin && !seg.members.empty()) passes.push_back({seg.kv, seg.begin, seg.end, seg.members});
  }
  for (int32_t i = 0; i < n_seqs; ++i) {
    if (covered[i] != suffix_begin[i]) throw std::invalid_argument("bifurcated: segments do not tile a prefix");
    if (suffix_begin[i] <= seq_args[i].pos) passes.push_back({&seq_kv[i], suffix_begin[i], seq_args[i].pos + 1, {i}});
  }

  // Slots and work items.
  int64_t slots = 0, bytes = 0;
  std::vector<Item> items;
  std::vector<std::vector<Member>> members_of(n_seqs);  // per sequence, in pass (= position) order
  for (int32_t p = 0; p < static_cast<int32_t>(passes.size()); ++p) {
    Pass& ps = passes[p];
    const int32_t bs = ps.kv->block_size;
    ps.chunk = (kKeyChunk + bs - 1) / bs * bs;
    ps.chunk0 = ps.begin / ps.chunk;
    ps.n_chunks = (ps.end - 1) / ps.chunk - ps.chunk0 + 1;
    ps.slot0 = slots;
    slots += static_cast<int64_t>(n_kv) * ps.n_chunks * ps.rows(group);
    bytes += static_cast<int64_t>(ps.end - ps.begin) * 2 * row_bytes * n_kv;
    for (int32_t m = 0; m < static_cast<int32_t>(ps.seqs.size()); ++m) members_of[ps.seqs[m]].push_back({p, m});
    for (int32_t h = 0; h < n_kv; ++h)
      for (int32_t c = 0; c < ps.n_chunks; ++c) {
        const int32_t t0 = std::max(ps.begin, (ps.chunk0 + c) * ps.chunk);
        const int32_t t1 = std::min(ps.end, (ps.chunk0 + c + 1) * ps.chunk);
        items.push_back({p, h, c, static_cast<int64_t>(ps.rows(group)) * (t1 - t0)});
      }
  }
  std::vector<float> acc(slots * d), m(slots), l(slots);
  // Runs items [first, last) (heaviest first), pass p's keys read through view_of(p, chunk).
  auto run_items = [&](std::vector<Item>::iterator first, std::vector<Item>::iterator last,
                       const std::function<const PagedKvView&(int32_t pass, int32_t chunk)>& view_of) {
    std::stable_sort(first, last, [](const Item& a, const Item& b) { return a.cost > b.cost; });
    std::atomic<int64_t> next{0};
    const int64_t n = last - first;
    pool.run_on_all([&](int, int) {
      std::vector<const float*> q;
      std::vector<int32_t> lo, hi;
      std::vector<float> scratch;
      for (int64_t w = next.fetch_add(1); w < n; w = next.fetch_add(1)) {
        const Item& it = first[w];
        const Pass& ps = passes[it.pass];
        const int32_t rows = ps.rows(group);
        q.clear();
        for (int32_t i : ps.seqs)
          for (int32_t j = 0; j < group; ++j) q.push_back(seq_args[i].q + static_cast<int64_t>(it.head * group + j) * d);
        lo.assign(rows, ps.begin);
        hi.assign(rows, ps.end - 1);
        scratch.resize(2 * static_cast<size_t>(ps.kv->block_size) * d + ps.kv->block_size);
        const int32_t t0 = std::max(ps.begin, (ps.chunk0 + it.chunk) * ps.chunk);
        const int32_t t1 = std::min(ps.end, (ps.chunk0 + it.chunk + 1) * ps.chunk);
        const int64_t slot = ps.slot0 + (static_cast<int64_t>(it.head) * ps.n_chunks + it.chunk) * rows;
        const PartialRows pr{rows, q.data(), lo.data(), hi.data(), {}};
        (rows > kManyRows && many_rows ? many_rows : kernel)(view_of(it.pass, ps.chunk0 + it.chunk), it.head, pr, t0, t1,
                                                              scale, &acc[slot * d], &m[slot], &l[slot], scratch.data());
      }
    });
  };
  // Passes over views a source stages: chunk range by chunk range, as it makes them readable (each
  // item writes its own slots, so the order changes nothing). The rest in one round.
  std::vector<KeyChunkSource*> source(passes.size(), nullptr);
  if (source_for)
    for (size_t p = 0; p < passes.size(); ++p) source[p] = source_for(*passes[p].kv);
  const auto staged = std::stable_partition(items.begin(), items.end(), [&](const Item& it) { return source[it.pass] == nullptr; });
  run_items(items.begin(), staged, [&](int32_t p, int32_t) -> const PagedKvView& { return *passes[p].kv; });
  std::stable_sort(staged, items.end(), [](const Item& a, const Item& b) {
    return a.pass != b.pass ? a.pass < b.pass : a.chunk < b.chunk;
  });
  for (auto it = staged; it != items.end();) {
    const int32_t p = it->pass;
    const Pass& ps = passes[p];
    const int32_t end = source[p]->prepare(ps.chunk0 + it->chunk, ps.chunk0 + ps.n_chunks);
    if (end <= ps.chunk0 + it->chunk) throw std::logic_error("KeyChunkSource::prepare made no chunk readable");
    const auto wave_end =
        std::find_if(it, items.end(), [&](const Item& x) { return x.pass != p || ps.chunk0 + x.chunk >= end; });
    run_items(it, wave_end, [&](int32_t, int32_t chunk) -> const PagedKvView& { return source[p]->view(chunk); });
    it = wave_end;
  }

  // Merge: per (sequence, kv head), every row folds its partials in position order.
  pool.parallel_for(static_cast<int64_t>(n_seqs) * n_kv, [&](int64_t begin, int64_t end, int) {
    for (int64_t w = begin; w < end; ++w) {
      const int32_t i = static_cast<int32_t>(w / n_kv), h = static_cast<int32_t>(w % n_kv);
      for (int32_t j = 0; j < group; ++j) {
        RowState s{seq_args[i].out + static_cast<int64_t>(h * group + j) * d, -INFINITY, 0.0f};
        for (const Member& mb : members_of[i]) {
          const Pass& ps = passes[mb.pass];
          for (int32_t c = 0; c < ps.n_chunks; ++c) {
            const int64_t slot = ps.slot0 + (static_cast<int64_t>(h) * ps.n_chunks + c) * ps.rows(group) +
                                 static_cast<int64_t>(mb.index) * group + j;
            fold_partial(s, &acc[slot * d], m[slot], l[slot], d);
          }
        }
        const float l_all = with_sink(s.l, s.m, seq_args[i].sinks, h * group + j);
        for (int32_t x = 0; x < d; ++x) s.acc[x] /= l_all;
      }
    }
  });
  return bytes;
}

}  // namespace fathom::cpu
