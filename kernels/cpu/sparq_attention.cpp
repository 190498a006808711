// SparQ decode attention on the CPU (ALGORITHMS.md; spec: kernels/ref/sparq.cpp).
// Work split: step 1 over (kv head, block range) items — approximate scores, their group sum and
// per-item softmax statistics in one pass; steps 3–4 per kv head, run by the thread that finishes
// the head's last item; step 5 through sparse::attend over (kv head, key chunk) items.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include "kernels/cpu/sparse_attention.h"
#include "kernels/cpu/sparse_common.h"

namespace fathom::cpu {

SparqResult sparq_decode(ThreadPool& pool, const PagedKvView& kv, const DecodeArgs& args, const ref::SparqParams& p,
                         SparqTrace* trace, const float* key_spread) {
  const sparse::Kernels& kern = sparse::kernels();
  const int32_t d = kv.head_dim, n_kv = kv.n_kv_heads, G = args.n_heads / n_kv, S = args.pos + 1, bs = kv.block_size;
  SparqResult res;
  res.r = std::clamp(p.r < 0 ? d / 8 : p.r, 1, d);
  res.k = std::clamp(p.k, 1, S);
  res.l = std::clamp(p.l < 0 ? p.k / 4 : p.l, 1, res.k);  // ≥ 1: the current token is always kept
  const int32_t r = res.r;

  // Step 1 (tiny, serial): I1 per group and the temperature-corrected query components, each
  // component weighted by w[c] (√ of the keys' spread when given, else 1), as the reference.
  std::vector<int32_t> dims(static_cast<size_t>(n_kv) * r);          // [n_kv][r]
  std::vector<float> qr(static_cast<size_t>(n_kv) * G * r);          // [n_kv][G][r]
  std::vector<double> w(d, 1.0);
  for (int32_t g = 0; g < n_kv; ++g) {
    const float* qg = args.q + static_cast<int64_t>(g) * G * d;
    if (key_spread != nullptr)
      for (int32_t c = 0; c < d; ++c) w[c] = std::sqrt(static_cast<double>(key_spread[static_cast<int64_t>(g) * d + c]));
    std::vector<double> a(d, 0.0);
    for (int32_t j = 0; j < G; ++j)
      for (int32_t c = 0; c < d; ++c) a[c] += std::fabs(qg[j * d + c]) * w[c];
    std::vector<int32_t> order(d);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + r, order.end(),
                      [&](int32_t x, int32_t y) { return a[x] != a[y] ? a[x] > a[y] : x < y; });
    std::copy_n(order.begin(), r, &dims[static_cast<size_t>(g) * r]);
    for (int32_t j = 0; j < G; ++j) {
      double l1 = 0, l1_r = 0;
      for (int32_t c = 0; c < d; ++c) l1 += std::fabs(qg[j * d + c]) * w[c];
      for (int32_t i = 0; i < r; ++i) l1_r += std::fabs(qg[j * d + order[i]]) * w[order[i]];
      const double factor = args.scale * (l1_r > 0 ? std::sqrt(l1 / l1_r) : 1.0);
      for (int32_t i = 0; i < r; ++i)
        qr[(static_cast<size_t>(g) * G + j) * r + i] = static_cast<float>(qg[j * d + order[i]] * factor);
    }
  }

  // Step 2: ŝ over all positions, items of `span` blocks; each item also leaves the group sum,
  // its per-row (max, Σexp) and, without v_sum, its partial Σ V.
  const bool compute_vbar = p.reallocation && kv.v_sum == nullptr;
  const int32_t n_blocks = (S + bs - 1) / bs;
  int32_t span = std::max(1, 1024 / bs);
  while (span > 1 && static_cast<int64_t>(n_kv) * ((n_blocks + span - 1) / span) < 4 * pool.size()) span /= 2;
  const int32_t items_per_head = (n_blocks + span - 1) / span, n_items = n_kv * items_per_head;
  // Every element is written below; reused across calls (fresh large buffers page-fault each step).
  // (Named references: the worker lambdas must see this thread's buffers, not their own.)
  static thread_local std::vector<float> approx_buf, summed_buf;
  std::vector<float>& approx = approx_buf;
  std::vector<float>& summed = summed_buf;

  // A tiered view (docs/tiered_kv.md): step 2 reads the r selected dimension rows of each host-tier
  // block's transposed-K tile from the host tier into host_kt ([n_kv][n_host][r][bs], the view's
  // dtype), then scores them through a view whose table maps those blocks to host_kt's tiles (head
  // dim r, identity dims: the same elements in the same order, so the same scores as resident);
  // step 5 gathers its top-k rows through the hot-row cache.
  const bool tiered = kv.prefetcher != nullptr;
  const size_t kt_tile_bytes = static_cast<size_t>(r) * bs * kv_dtype_bytes(kv.dtype);
  std::vector<int32_t> host_index, identity;  // logical block -> its tile in host_kt or -1 (device)
  static thread_local std::vector<uint8_t> host_kt_buf;  // reused: fresh large buffers page-fault each step
  std::vector<uint8_t>& host_kt = host_kt_buf;
  int32_t n_host = 0;
  if (tiered) {
    if (!sparq_reads_host_tier(kv, p.reallocation))
      throw std::invalid_argument("sparq over host-tier blocks needs f32/f16 transposed K and running V sums");
    host_index.assign(n_blocks, -1);
    std::vector<int32_t> host_slot;
    for (int32_t b = 0; b < n_blocks; ++b)
      if (kv.block_table[b] < 0) {
        host_index[b] = n_host++;
        host_slot.push_back(-kv.block_table[b] - 1);
      }
    identity.resize(r);
    std::iota(identity.begin(), identity.end(), 0);
    host_kt.resize(static_cast<size_t>(n_kv) * n_host * kt_tile_bytes);
    std::atomic<int64_t> moved{0};
    pool.parallel_for(static_cast<int64_t>(n_kv) * n_host, [&](int64_t begin, int64_t end, int) {
      int64_t local = 0;
      for (int64_t w = begin; w < end; ++w) {
        const int32_t g = static_cast<int32_t>(w / n_host);
        local += static_cast<int64_t>(kv.prefetcher->read_kt_rows(host_slot[w % n_host], g, &dims[static_cast<size_t>(g) * r],
                                                                  r, &host_kt[static_cast<size_t>(w) * kt_tile_bytes]));
      }
      moved += local;
    });
    kv.prefetcher->count_read(moved.load());
  }
  // Step-1 scores of kv head g for logical blocks [b0, b1), host-tier blocks from host_kt.
  auto scores = [&](int32_t g, int32_t b0, int32_t b1) {
    const int32_t* dims_g = &dims[static_cast<size_t>(g) * r];
    const float* qr_g = &qr[static_cast<size_t>(g) * G * r];
    float* ap = &approx[static_cast<size_t>(g) * G * S];
    float* sum = &summed[static_cast<size_t>(g) * S];
    if (!tiered) {
      kern.sparq_scores(kv, g, dims_g, r, qr_g, G, b0, b1, S, ap, S, sum);
      return;
    }
    PagedKvView hv = kv;
    hv.k_t = &host_kt[static_cast<size_t>(g) * n_host * kt_tile_bytes];
    hv.block_table = host_index.data();
    hv.n_kv_heads = 1;
    hv.head_dim = r;
    for (int32_t a = b0; a < b1;) {  // runs of device blocks and of host blocks
      const bool host = host_index[a] >= 0;
      int32_t z = a + 1;
      while (z < b1 && (host_index[z] >= 0) == host) ++z;
      if (host) kern.sparq_scores(hv, 0, identity.data(), r, qr_g, G, a, z, S, ap, S, sum);
      else kern.sparq_scores(kv, g, dims_g, r, qr_g, G, a, z, S, ap, S, sum);
      a = z;
    }
  };
  approx.resize(static_cast<size_t>(n_kv) * G * S);  // [n_kv][G][S]
  summed.resize(static_cast<size_t>(n_kv) * S);      // [n_kv][S]
  std::vector<float> item_m(static_cast<size_t>(n_items) * G), item_l(item_m.size());
  std::vector<float> item_vsum(compute_vbar ? static_cast<size_t>(n_items) * d : 0, 0.0f);

  // Steps 3–4 of kv head g (once all its items are done): forced last-l by flag, the best k − l
  // of the rest by group sum; α.
  std::vector<std::vector<int32_t>> sel(n_kv);
  std::vector<float> alpha(args.n_heads, 1.0f);
  auto select_head = [&](int32_t g) {
    const int32_t first_forced = S - res.l, n_rest = res.k - res.l;
    std::vector<int32_t>& s = sel[g];
    s.resize(res.k);
    sparse::top_k(&summed[static_cast<size_t>(g) * S], first_forced, n_rest, s.data());
    std::iota(s.begin() + n_rest, s.end(), first_forced);  // top_k's indices come ascending
    if (res.k == S) return;  // every position: α = 1 exactly
    std::vector<float> buf(res.k);
    for (int32_t j = 0; j < G; ++j) {
      float m = -INFINITY, l = 0.0f;
      for (int32_t i = 0; i < items_per_head; ++i) m = std::max(m, item_m[(g * items_per_head + i) * G + j]);
      for (int32_t i = 0; i < items_per_head; ++i) {
        const int64_t w = g * items_per_head + i;
        l += item_l[w * G + j] * std::exp(item_m[w * G + j] - m);
      }
      const float* row = &approx[(static_cast<size_t>(g) * G + j) * S];
      for (int32_t i = 0; i < res.k; ++i) buf[i] = row[s[i]];
      alpha[g * G + j] = kern.exp_shifted(buf.data(), res.k, m) / l;
    }
  };

  // One pass over the items; the thread that finishes a head's last item selects that head's
  // keys at once, while the other threads go on with step 2 of the other heads (the selection
  // no longer waits for every head's scores: at 16k, d 64 it was a separate ~80-180 µs phase,
  // 3 heads on 2 threads).
  LastArrival head_done(static_cast<size_t>(n_kv), [&](size_t) { return items_per_head; });
  pool.for_each_chunk(n_items, [&](int64_t w, int) {
    const int32_t g = static_cast<int32_t>(w / items_per_head), b0 = static_cast<int32_t>(w % items_per_head) * span;
    const int32_t b1 = std::min(n_blocks, b0 + span), t0 = b0 * bs, t1 = std::min(S, b1 * bs), n = t1 - t0;
    float* ap = &approx[static_cast<size_t>(g) * G * S];
    scores(g, b0, b1);
    for (int32_t j = 0; j < G; ++j)
      item_l[w * G + j] = kern.max_sum_exp(ap + static_cast<size_t>(j) * S + t0, n, &item_m[w * G + j]);
    if (compute_vbar) {
      std::vector<int32_t> positions(n);
      std::iota(positions.begin(), positions.end(), t0);
      const std::vector<float> ones(n, 1.0f);
      std::vector<int64_t> rows(n);
      sparse::row_offsets(kv, g, positions.data(), n, rows.data());
      kern.accumulate_v(kv, 1, ones.data(), n, rows.data(), n, &item_vsum[w * d]);
    }
    if (head_done.arrive(static_cast<size_t>(g))) select_head(g);
  });

  // Step 5: exact attention over I2 (y written to out, then step 6 in place).
  std::vector<sparse::AttendTask> tasks(n_kv);
  for (int32_t g = 0; g < n_kv; ++g) {
    sparse::AttendTask& t = tasks[g];
    t.g = g;
    t.R = G;
    t.q = args.q + static_cast<int64_t>(g) * G * d;
    t.out = args.out + static_cast<int64_t>(g) * G * d;
    t.pos = sel[g].data();
    t.n = res.k;
  }
  sparse::attend_prefetched(pool, kern, kv, args.scale, tasks);  // over a tiered cache: kv head by kv head

  // Step 6: out = α·y + (1 − α)·v̄.
  const int64_t elem = static_cast<int64_t>(kv_dtype_bytes(kv.dtype));
  const int64_t row_bytes = static_cast<int64_t>(kv_row_bytes(kv.dtype, d));
  const int64_t param_bytes = kv.dtype == KvDtype::kI8 ? static_cast<int64_t>(sizeof(KvInt8Row)) : 0;
  std::vector<float> vbar(d);
  for (int32_t g = 0; g < n_kv; ++g) {
    res.kv_bytes += static_cast<int64_t>(S) * (r * elem + param_bytes) + 2LL * res.k * row_bytes;
    if (!p.reallocation) continue;
    if (kv.v_sum != nullptr) {
      const float* vs = kv.v_sum + kv.sum_index(args.pos, g);
      for (int32_t c = 0; c < d; ++c) vbar[c] = vs[c] / static_cast<float>(S);
      res.kv_bytes += 4LL * d;
    } else {
      std::fill(vbar.begin(), vbar.end(), 0.0f);
      for (int32_t i = 0; i < items_per_head; ++i)
        for (int32_t c = 0; c < d; ++c) vbar[c] += item_vsum[static_cast<size_t>(g * items_per_head + i) * d + c];
      for (float& x : vbar) x /= static_cast<float>(S);
      res.kv_bytes += static_cast<int64_t>(S) * row_bytes;
    }
    for (int32_t j = 0; j < G; ++j) {
      const float a = alpha[g * G + j];
      float* out = args.out + static_cast<int64_t>(g * G + j) * d;
      for (int32_t c = 0; c < d; ++c) out[c] = a * out[c] + (1.0f - a) * vbar[c];
    }
  }
  if (trace != nullptr) {
    trace->selected = std::move(sel);
    trace->dims.resize(n_kv);
    for (int32_t g = 0; g < n_kv; ++g)
      trace->dims[g].assign(dims.begin() + static_cast<ptrdiff_t>(g) * r, dims.begin() + static_cast<ptrdiff_t>(g + 1) * r);
    trace->alpha = std::move(alpha);
  }
  return res;
}

}  // namespace fathom::cpu
