#include "kernels/ref/hip.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

namespace fathom::ref {
namespace {

struct Chunk {
  int32_t lo, hi;  // key blocks [lo, hi)
};

// Distinct rows of one kv head touched by any head of the group, per tensor.
int64_t count_rows(const std::vector<char>& touched) {
  return std::count(touched.begin(), touched.end(), 1);
}

}  // namespace

HipMask hip_estimate_mask(const PagedKvView& kv, const DecodeArgs& args, const HipParams& p, HipBytes* bytes) {
  const int32_t d = kv.head_dim, group = args.n_heads / kv.n_kv_heads, bs = p.block_size_k;
  const int64_t elem = static_cast<int64_t>(kv_dtype_bytes(kv.dtype));
  HipMask mask;
  mask.pos = args.pos;
  mask.block_starts.assign(args.n_heads, {});
  const int32_t t_mid = args.pos - p.window - p.sink;  // T′
  if (t_mid <= p.mask_k) return mask;
  if (bs <= 0 || p.mask_k < bs) throw std::invalid_argument("hip: need mask_k >= block_size_k > 0");
  mask.dense = false;
  const int32_t n_blocks = (t_mid + bs - 1) / bs, n_keep = p.mask_k / bs;
  const int32_t end = p.sink + t_mid;  // middle region [sink, end)
  std::vector<float> krow(d);
  // A unit is one mask: a query head, or with per_kv_head the group's G query heads.
  const int32_t units = p.per_kv_head ? 1 : group, rows_per_unit = p.per_kv_head ? group : 1;
  for (int32_t g = 0; g < kv.n_kv_heads; ++g) {
    std::vector<std::vector<Chunk>> chunks(units);
    for (int32_t j = 0; j < units; ++j)
      for (int32_t i = 0; i < n_keep; ++i)
        chunks[j].push_back({static_cast<int32_t>(static_cast<int64_t>(i) * n_blocks / n_keep),
                             static_cast<int32_t>(static_cast<int64_t>(i + 1) * n_blocks / n_keep)});
    for (;;) {
      // Units keep different halves (of unequal size), so each stops on its own.
      std::vector<char> split(units, 0);
      for (int32_t j = 0; j < units; ++j)
        for (const Chunk& c : chunks[j]) split[j] |= c.hi - c.lo > 1;
      if (std::count(split.begin(), split.end(), 1) == 0) break;
      std::vector<char> touched(end, 0);  // K rows read by this iteration, for the group
      for (int32_t j = 0; j < units; ++j) {
        if (!split[j]) continue;
        const float* q = args.q + static_cast<int64_t>(g * group + j * rows_per_unit) * d;  // [rows_per_unit][d]
        std::vector<Chunk> halves;
        for (const Chunk& c : chunks[j]) {
          const int32_t mid = c.lo + (c.hi - c.lo) / 2;
          if (mid > c.lo) halves.push_back({c.lo, mid});
          halves.push_back({mid, c.hi});
        }
        std::vector<double> score(halves.size());
        for (size_t h = 0; h < halves.size(); ++h) {
          const int32_t rep = (halves[h].lo + halves[h].hi - 1) / 2;  // centre block
          double best = -INFINITY;
          for (int32_t t = p.sink + rep * bs; t < std::min(end, p.sink + (rep + 1) * bs); ++t) {
            load_kv_row(kv, kv.k, t, g, krow.data());
            touched[t] = 1;
            for (int32_t r = 0; r < rows_per_unit; ++r) {
              double dot = 0;
              for (int32_t c = 0; c < d; ++c) dot += static_cast<double>(q[r * d + c]) * krow[c];
              best = std::max(best, dot);
            }
          }
          score[h] = best;
        }
        std::vector<int32_t> order(halves.size());
        std::iota(order.begin(), order.end(), 0);
        const int32_t keep = std::min<int32_t>(n_keep, static_cast<int32_t>(halves.size()));
        std::partial_sort(order.begin(), order.begin() + keep, order.end(), [&](int32_t x, int32_t y) {
          return score[x] != score[y] ? score[x] > score[y] : x < y;
        });
        order.resize(keep);
        std::sort(order.begin(), order.end());
        chunks[j].clear();
        for (int32_t h : order) chunks[j].push_back(halves[h]);
      }
      if (bytes != nullptr) bytes->k_bytes += count_rows(touched) * d * elem;
    }
    for (int32_t j = 0; j < group; ++j)
      for (const Chunk& c : chunks[p.per_kv_head ? 0 : j]) mask.block_starts[g * group + j].push_back(p.sink + c.lo * bs);
  }
  return mask;
}

std::vector<int32_t> hip_attended_positions(const HipMask& mask, const HipParams& p, int32_t pos, int32_t head) {
  const int32_t S = pos + 1;
  std::vector<int32_t> out;
  if (mask.dense) {
    out.resize(S);
    std::iota(out.begin(), out.end(), 0);
    return out;
  }
  for (int32_t t = 0; t < std::min(p.sink, S); ++t) out.push_back(t);
  for (int32_t b : mask.block_starts[head])
    for (int32_t t = b; t < std::min(b + p.block_size_k, S); ++t) out.push_back(t);
  for (int32_t t = std::max(0, pos - p.window); t < S; ++t) out.push_back(t);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

void hip_sparse_attention(const PagedKvView& kv, const DecodeArgs& args, const HipParams& p,
                          const HipMask& mask, HipBytes* bytes) {
  const int32_t d = kv.head_dim, group = args.n_heads / kv.n_kv_heads, S = args.pos + 1;
  const int64_t elem = static_cast<int64_t>(kv_dtype_bytes(kv.dtype));
  AttentionState st;
  for (int32_t g = 0; g < kv.n_kv_heads; ++g) {
    std::vector<char> touched(S, 0);
    for (int32_t j = 0; j < group; ++j) {
      const int32_t h = g * group + j;
      const std::vector<int32_t> pos = hip_attended_positions(mask, p, args.pos, h);
      for (int32_t t : pos) touched[t] = 1;
      partial_attention(kv, g, args.q + static_cast<int64_t>(h) * d, 1, args.scale, pos.data(),
                        static_cast<int64_t>(pos.size()), &st);
      std::copy(st.o.begin(), st.o.end(), args.out + static_cast<int64_t>(h) * d);
    }
    if (bytes != nullptr) {
      bytes->k_bytes += count_rows(touched) * d * elem;
      bytes->v_bytes += count_rows(touched) * d * elem;
    }
  }
}

HipBytes hip_attention(const PagedKvView& kv, const DecodeArgs& args, const HipParams& p) {
  HipBytes bytes;
  const HipMask mask = hip_estimate_mask(kv, args, p, &bytes);
  hip_sparse_attention(kv, args, p, mask, &bytes);
  return bytes;
}

}  // namespace fathom::ref
