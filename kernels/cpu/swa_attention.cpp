// ALISA sparse window attention on the CPU (ALGORITHMS.md; spec: kernels/ref/swa.cpp): the local
// window plus the older positions of largest mass (exact top-k on the caller's f32 mass, so the
// selection equals the reference's), then one sparse::attend task per kv head for its G heads.
#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/sparse_attention.h"
#include "kernels/cpu/sparse_common.h"

namespace fathom::cpu {

SwaResult swa_decode(ThreadPool& pool, const PagedKvView& kv, const DecodeArgs& args, const ref::SwaParams& p,
                     const float* mass, std::vector<float>* kept_weights, std::vector<int32_t>* kept_out) {
  return swa_decode(pool, kv, args, p, [mass] { return mass; }, kept_weights, kept_out);
}

SwaResult swa_decode(ThreadPool& pool, const PagedKvView& kv, const DecodeArgs& args, const ref::SwaParams& p,
                     const std::function<const float*()>& selection_mass, std::vector<float>* kept_weights,
                     std::vector<int32_t>* kept_out) {
  const sparse::Kernels& kern = sparse::kernels();
  const int32_t d = kv.head_dim, n_kv = kv.n_kv_heads, G = args.n_heads / n_kv, n = args.pos + 1;
  const ref::SwaSizes sizes = ref::swa_sizes(n, p.ratio);
  SwaResult res;
  res.k_local = sizes.k_local;
  res.k_global = sizes.k_global;
  const int32_t older = n - res.k_local;
  std::vector<int32_t> kept(res.k_global + res.k_local);
  std::iota(kept.begin() + res.k_global, kept.end(), older);
  // The heavy hitters (ascending); with a streamed window, chosen inside the attention's pool call
  // while the other threads stream the window (at 8k, 1/8 the pooling and top-k are ~6 us a layer
  // that one thread spent alone; bench in docs/performance-attention.md).
  const std::function<void()> select = [&] { sparse::top_k(selection_mass(), older, res.k_global, kept.data()); };
  const int32_t n_kept = static_cast<int32_t>(kept.size());
  // The local window is one run of positions: streamed through the transposed K plane where the
  // view allows (half the kept keys at about dense's speed per key), else gathered with the rest;
  // either way the weights come back in `kept` order. Never on the seed step (ratio 1): its window is
  // the newest half of the sequence, which a small device tier does not hold, and a tiered view
  // gathers what it cannot stream — gathering it in every view keeps a tiered sequence bitwise its
  // resident self unless a later step's window (n·ratio/2 newest keys) reaches into the host tier.
  const bool stream_window = p.ratio < 1.0f && sparse::run_streamable(kern, kv, older, n);

  // [H][n_kept] softmax weights per head, reused by the calling thread (no clearing: every entry
  // is written by the attention).
  thread_local std::vector<float> head_weights;
  if (kept_weights != nullptr) head_weights.resize(static_cast<size_t>(args.n_heads) * n_kept);
  std::vector<sparse::AttendTask> tasks(n_kv);
  for (int32_t g = 0; g < n_kv; ++g) {
    sparse::AttendTask& t = tasks[g];
    t.g = g;
    t.R = G;
    t.q = args.q + static_cast<int64_t>(g) * G * d;
    t.out = args.out + static_cast<int64_t>(g) * G * d;
    t.pos = kept.data();
    t.n = stream_window ? res.k_global : n_kept;
    if (stream_window) {
      t.run_begin = older;
      t.run_end = n;
    }
    if (kept_weights != nullptr) t.weights = &head_weights[static_cast<size_t>(g) * G * n_kept];
  }
  // Over a tiered cache the gathered rows come through the hot-row cache kv head by kv head, in batches
  // it holds (the seed step keeps every position), bitwise the resident result; the order
  // alternates by step so that a kept set larger than the cache still hits (see sparse::attend).
  if (stream_window && kv.prefetcher == nullptr) {
    sparse::attend(pool, kern, kv, args.scale, tasks, /*chunk=*/0, /*prefetcher=*/nullptr, /*reverse=*/false, select);
  } else {
    select();
    sparse::attend_prefetched(pool, kern, kv, args.scale, tasks, /*reverse=*/args.pos % 2 != 0);
  }
  res.kv_bytes = 2LL * n_kept * static_cast<int64_t>(kv_row_bytes(kv.dtype, d)) * n_kv;

  if (kept_weights != nullptr) {
    // Summed over heads per kept position: head 0 + head 1 + … (a vector loop over positions).
    kept_weights->assign(head_weights.begin(), head_weights.begin() + n_kept);
    for (int32_t h = 1; h < args.n_heads; ++h)
      add_inplace(kept_weights->data(), &head_weights[static_cast<size_t>(h) * n_kept], n_kept);
  }
  if (kept_out != nullptr) *kept_out = std::move(kept);
  return res;
}

}  // namespace fathom::cpu
