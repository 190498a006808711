#include "kernels/cpu/sparse_common.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <numeric>
#include <stdexcept>
#include <string>

#include "kernels/cpu/matmul.h"

namespace fathom::cpu::sparse {

const Kernels& kernels() {
  // Chosen per call (a string compare) so that set_simd_level_for_testing reaches every variant.
  if (std::strcmp(simd_level(), "avx512") == 0 && kernels_avx512() != nullptr) return *kernels_avx512();
  if (std::strcmp(simd_level(), "portable") != 0 && kernels_avx2() != nullptr) return *kernels_avx2();
  return *kernels_portable();
}

void row_sums(const float* q, int32_t R, int32_t d, float* sums) {
  for (int32_t r = 0; r < R; ++r) {
    float s = 0.0f;
    for (int32_t c = 0; c < d; ++c) s += q[static_cast<int64_t>(r) * d + c];
    sums[r] = s;
  }
}

namespace {

constexpr int32_t kMaxChunk = 256;  // keys per work item (logits scratch: R × chunk floats)
constexpr int32_t kMinChunk = 32;

// Folds a chunk partial (acc unnormalised, max m_c, Σexp l_c) into a running one.
void fold(float* acc, float& m, float& l, const float* acc_c, float m_c, float l_c, int32_t d) {
  if (m == -INFINITY) {
    std::copy(acc_c, acc_c + d, acc);
    m = m_c;
    l = l_c;
    return;
  }
  const float mx = std::max(m, m_c);
  const float a = std::exp(m - mx), b = std::exp(m_c - mx);
  for (int32_t c = 0; c < d; ++c) acc[c] = acc[c] * a + acc_c[c] * b;
  l = l * a + l_c * b;
  m = mx;
}

}  // namespace

int32_t attend_chunk(const ThreadPool& pool, const std::vector<AttendTask>& tasks) {
  // Small enough chunks that every thread gets a few items, large enough to amortise the merge.
  int32_t chunk = kMaxChunk;
  auto count_items = [&](int32_t c) {
    int64_t n = 0;
    for (const AttendTask& t : tasks) n += (t.keys() + c - 1) / c;
    return n;
  };
  while (chunk > kMinChunk && count_items(chunk) < 4 * pool.size()) chunk /= 2;
  return chunk;
}

bool run_streamable(const Kernels& kern, const PagedKvView& kv, int32_t t0, int32_t t1) {
  if (kern.run_partial == nullptr || !partial_attention_kt_applies(kv)) return false;
  for (int32_t b = t0 / kv.block_size; b * kv.block_size < t1; ++b)
    if (kv.block_table[b] < 0) return false;
  return true;
}

void attend_prefetched(ThreadPool& pool, const Kernels& kern, const PagedKvView& kv, float scale,
                       const std::vector<AttendTask>& tasks, bool reverse) {
  if (kv.prefetcher == nullptr) {
    attend(pool, kern, kv, scale, tasks);
    return;
  }
  int32_t chunk = attend_chunk(pool, tasks);
  // A hot-row cache smaller than a key chunk: smaller chunks (then the rounding differs from resident).
  if (kv.prefetcher != nullptr)
    while (chunk > kv.prefetcher->capacity() && chunk > 1) chunk /= 2;
  const int32_t n = static_cast<int32_t>(tasks.size());
  for (int32_t i = 0; i < n; ++i)
    attend(pool, kern, kv, scale, {tasks[reverse ? n - 1 - i : i]}, chunk, kv.prefetcher, reverse);
}

void attend(ThreadPool& pool, const Kernels& kern, const PagedKvView& kv, float scale,
            const std::vector<AttendTask>& tasks, int32_t chunk, RowPrefetcher* prefetcher, bool reverse,
            const std::function<void()>& fill_positions) {
  const int32_t d = kv.head_dim;
  if (chunk <= 0) chunk = attend_chunk(pool, tasks);
  // Positions filled inside the pool call (see the header), else before anything reads them.
  const bool deferred = fill_positions && prefetcher == nullptr;
  if (fill_positions && !deferred) fill_positions();

  // A task's gathered items (index ranges of pos[]) come first, then its run's (absolute
  // positions, cut at multiples of the chunk so the cuts do not depend on where the run starts);
  // partials merge in that order.
  struct Item {
    int32_t task, begin, end;
    int64_t slot;  // first of its R partial slots
    bool run;
  };
  std::vector<Item> items;
  std::vector<int32_t> first_item(tasks.size() + 1), first_run(tasks.size());
  std::vector<float> q_sums(tasks.size() * kMaxRows, 0.0f);
  int64_t slots = 0;
  for (size_t ti = 0; ti < tasks.size(); ++ti) {
    const AttendTask& t = tasks[ti];
    if (t.R > kMaxRows || t.R < 1 || t.n < 0 || t.run_end < t.run_begin || t.keys() < 1 ||
        (t.run_end > t.run_begin &&
         (kern.run_partial == nullptr || (!deferred && t.n > 0 && t.pos[t.n - 1] >= t.run_begin))))
      throw std::invalid_argument("sparse::attend: bad task shape");
    if (kv.dtype == KvDtype::kI8) row_sums(t.q, t.R, d, &q_sums[ti * kMaxRows]);
    first_item[ti] = static_cast<int32_t>(items.size());
    for (int32_t b = 0; b < t.n; b += chunk) {
      items.push_back({static_cast<int32_t>(ti), b, std::min(t.n, b + chunk), slots, false});
      slots += t.R;
    }
    first_run[ti] = static_cast<int32_t>(items.size());
    for (int32_t b = t.run_begin; b < t.run_end; b = (b / chunk + 1) * chunk) {
      items.push_back({static_cast<int32_t>(ti), b, std::min(t.run_end, (b / chunk + 1) * chunk), slots, true});
      slots += t.R;
    }
  }
  first_item[tasks.size()] = static_cast<int32_t>(items.size());
  // Reused across calls by the calling thread (fresh large allocations page-fault every step).
  // (Named references: the worker lambdas must see this thread's buffers, not their own.)
  static thread_local std::vector<float> acc_buf, m_buf, l_buf;
  std::vector<float>& acc = acc_buf;
  std::vector<float>& m = m_buf;
  std::vector<float>& l = l_buf;
  acc.assign(slots * d, 0.0f);
  m.resize(slots);
  l.resize(slots);
  int32_t max_rows = 1;
  for (const AttendTask& t : tasks) max_rows = std::max(max_rows, t.R);

  // Items go out one by one through the pool's shares; the thread that finishes a task's last
  // item merges that task's partials at once (no second pool phase).
  LastArrival task_done(tasks.size(), [&](size_t ti) { return first_item[ti + 1] - first_item[ti]; });
  auto merge_task = [&](int32_t ti) {
    const AttendTask& t = tasks[ti];
    std::vector<float> run(d);
    for (int32_t r = 0; r < t.R; ++r) {
      float rm = -INFINITY, rl = 0.0f;
      for (int32_t w = first_item[ti]; w < first_item[ti + 1]; ++w) {
        const int64_t slot = items[w].slot + r;
        fold(run.data(), rm, rl, &acc[slot * d], m[slot], l[slot], d);
      }
      float* o = t.out + static_cast<int64_t>(r) * d;
      for (int32_t c = 0; c < d; ++c) o[c] = run[c] / rl;
      if (t.weights != nullptr)
        kern.exp_shifted(t.weights + static_cast<int64_t>(r) * t.keys(), t.keys(), rm + std::log(rl));
    }
  };
  // 0: positions not filled, 1: being filled, 2: filled, 3: the fill threw (its exception kept in
  // fill_error, rethrown by the caller once the pool call is over; gathered items are then skipped).
  // A gathered item claims the fill or waits for it; whoever claims it runs it, so no thread waits
  // on one that never takes it. Returns whether the positions are there.
  std::atomic<int> filled{deferred ? 0 : 2};
  std::exception_ptr fill_error;
  auto ensure_filled = [&] {
    int state = filled.load(std::memory_order_acquire);
    if (state == 0 && filled.compare_exchange_strong(state, 1, std::memory_order_acq_rel)) {
      try {
        fill_positions();
        state = 2;
      } catch (...) {
        fill_error = std::current_exception();
        state = 3;
      }
      filled.store(state, std::memory_order_release);
      return state == 2;
    }
    // Spin, yielding now and then (a descheduled filler must get the CPU back).
    for (int turn = 1; (state = filled.load(std::memory_order_acquire)) < 2; ++turn) spin_turn(turn);
    return state == 2;
  };
  auto run_item = [&](int64_t w) {
    thread_local std::vector<float> s;
    thread_local std::vector<int64_t> rows;
    s.resize(static_cast<size_t>(max_rows) * chunk);
    rows.resize(chunk);
    const Item& it = items[w];
    const AttendTask& t = tasks[it.task];
    if (it.run) {
      const float* q[kMaxRows];
      int32_t lo[kMaxRows], hi[kMaxRows];
      for (int32_t r = 0; r < t.R; ++r) {
        q[r] = t.q + static_cast<int64_t>(r) * d;
        lo[r] = t.run_begin;
        hi[r] = t.run_end - 1;
      }
      float* logits = t.weights != nullptr ? t.weights + t.n + (it.begin - t.run_begin) : nullptr;
      kern.run_partial(kv, t.g, PartialRows{t.R, q, lo, hi, {}}, it.begin, it.end, scale, &acc[it.slot * d], &m[it.slot],
                       &l[it.slot], logits, t.keys());
      if (task_done.arrive(static_cast<size_t>(it.task))) merge_task(it.task);
      return;
    }
    if (!ensure_filled()) return;  // the fill failed: the caller throws
    const int32_t n = it.end - it.begin;
    row_offsets(kv, t.g, t.pos + it.begin, n, rows.data());
    prefetch_rows_l2(kv, kv.k, rows.data(), n);
    prefetch_rows_l2(kv, kv.v, rows.data(), n);
    kern.key_logits(kv, t.q, &q_sums[static_cast<size_t>(it.task) * kMaxRows], t.R, rows.data(), n, scale, s.data(), n,
                    /*v_next=*/true);
    for (int32_t r = 0; r < t.R; ++r) {
      float* sr = &s[static_cast<size_t>(r) * n];
      if (t.weights != nullptr) std::copy(sr, sr + n, t.weights + static_cast<int64_t>(r) * t.keys() + it.begin);
      const float mx = kern.max_of(sr, n);
      m[it.slot + r] = mx;
      l[it.slot + r] = kern.exp_shifted(sr, n, mx);
    }
    kern.accumulate_v(kv, t.R, s.data(), n, rows.data(), n, &acc[it.slot * d]);
    if (task_done.arrive(static_cast<size_t>(it.task))) merge_task(it.task);
  };
  auto run_items = [&](int32_t first, int32_t last) {
    pool.for_each_chunk(last - first, [&](int64_t w, int) { run_item(first + w); });
  };
  if (prefetcher == nullptr) {
    if (!deferred) {
      run_items(0, static_cast<int32_t>(items.size()));
      return;
    }
    // Gathered items first, the runs last: the calling thread starts on the first share (the fill,
    // then gathered items), the others on the later shares (runs, which need no positions).
    std::vector<int32_t> order;
    order.reserve(items.size());
    for (int pass = 0; pass < 2; ++pass)
      for (int32_t w = 0; w < static_cast<int32_t>(items.size()); ++w)
        if (items[w].run == (pass == 1)) order.push_back(w);
    pool.for_each_chunk(static_cast<int64_t>(order.size()), [&](int64_t i, int thread) {
      if (thread == 0) ensure_filled();
      run_item(order[i]);
    });
    ensure_filled();  // a task set with no gathered item still gets its positions
    if (fill_error) std::rethrow_exception(fill_error);
    return;
  }
  // Each task's gathered items in batches of at most capacity() keys, each batch's positions made
  // readable just before it runs: the partials and their merge order are those of one pass, so the
  // output does not depend on the batching or on the order the batches run in. (A batch is at
  // least one item: a cache smaller than one chunk throws from prefetch.) `reverse` runs them last
  // first: a caller that alternates it from step to step turns a cyclic set larger than the cache,
  // which misses on every row under LRU, into a stack whose last batches are the next step's hits.
  // The run's items read device blocks in place (run_streamable) and go last.
  const int32_t cap = prefetcher->capacity();
  std::vector<std::pair<int32_t, int32_t>> batches;
  for (size_t ti = 0; ti < tasks.size(); ++ti) {
    const AttendTask& t = tasks[ti];
    batches.clear();
    for (int32_t a = first_item[ti]; a < first_run[ti];) {
      int32_t b = a + 1;
      while (b < first_run[ti] && items[b].end - items[a].begin <= cap) ++b;
      batches.emplace_back(a, b);
      a = b;
    }
    if (reverse) std::reverse(batches.begin(), batches.end());
    for (const auto& [a, b] : batches) {
      prefetcher->prefetch(t.g, t.pos + items[a].begin, items[b - 1].end - items[a].begin, /*need_v=*/true);
      run_items(a, b);
    }
    if (first_run[ti] < first_item[ti + 1]) run_items(first_run[ti], first_item[ti + 1]);
  }
}

namespace {

// (key, index) as one integer, larger = better: key descending, then index ascending.
inline uint64_t rank_of(uint32_t key, int32_t i) {
  return (static_cast<uint64_t>(key) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(i));
}

// The radix version: a 4096-bucket histogram of the keys' top bits, then nth_element on the
// bucket holding the k-th. Exact for any input; the fallback of top_k.
void top_k_radix(const float* score, int32_t n, int32_t k, int32_t* out) {
  constexpr int kBits = 12, kShift = 32 - kBits;
  std::vector<int32_t> hist(1 << kBits, 0);
  for (int32_t i = 0; i < n; ++i) ++hist[order_key(score[i]) >> kShift];
  int32_t bucket = (1 << kBits) - 1, above = 0;  // the bucket holding the k-th largest
  for (; bucket > 0 && above + hist[bucket] < k; --bucket) above += hist[bucket];
  std::vector<uint64_t> boundary;
  boundary.reserve(hist[bucket]);
  int32_t o = 0;
  for (int32_t i = 0; i < n; ++i) {
    const uint32_t key = order_key(score[i]), b = key >> kShift;
    if (b > static_cast<uint32_t>(bucket)) out[o++] = i;
    else if (b == static_cast<uint32_t>(bucket)) boundary.push_back(rank_of(key, i));
  }
  const int32_t need = k - above;
  std::nth_element(boundary.begin(), boundary.begin() + (need - 1), boundary.end(), std::greater<uint64_t>());
  for (int32_t j = 0; j < need; ++j) out[o++] = static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(boundary[j]));
  std::sort(out, out + k);
}

// The k best of c candidates (indices idx[0..c), ascending, with keys[0..c)), in index order, into
// out: those above the k-th key, then as many of those equal to it as are still needed (the
// lowest indices: ties go to the lower index). Branch-free; stops at the k-th taken.
void take_k_best(const uint32_t* keys, const int32_t* idx, int32_t c, int32_t k, int32_t* out) {
  const uint32_t kth = kernels().kth_largest_key(keys, c, k);
  int32_t ties = k;  // how many keys equal to kth are taken: k minus those above it
  for (int32_t j = 0; j < c; ++j) ties -= keys[j] > kth;
  for (int32_t j = 0, o = 0; o < k; ++j) {
    const int32_t above = keys[j] > kth, tie = (keys[j] == kth) & (ties > 0);
    out[o] = idx[j];
    o += above | tie;
    ties -= tie;
  }
}

}  // namespace

void top_k(const float* score, int32_t n, int32_t k, int32_t* out) {
  if (k <= 0) return;
  if (k >= n) {
    std::iota(out, out + n, 0);
    return;
  }
  thread_local std::vector<uint32_t> keys;
  thread_local std::vector<int32_t> cand;
  // Small n: the k-th key among all of them directly (kth_largest_key: 32 counting passes).
  constexpr int32_t kSample = 512;
  if (n < 4 * kSample) {
    keys.resize(n);
    cand.resize(n);
    for (int32_t i = 0; i < n; ++i) keys[i] = order_key(score[i]), cand[i] = i;
    return take_k_best(keys.data(), cand.data(), n, k, out);
  }
  // Large n: a threshold from a sample of m keys at stride n / m; the one at sample rank
  // ~1.25 k m / n (+4) lies, with high probability, a little below the k-th largest key. One
  // branch-free pass keeps the candidates at or above it (in index order), and take_k_best picks
  // among them. If the sample was unlucky (fewer than k candidates), the radix version answers.
  // Costs for k = 192 of n = 4k (SparQ at 1/8): ~14 us with nth_element for both selections
  // (they mispredict about every other comparison), now ~5 us; the radix version alone cost
  // ~85 us for k = 768 of 16k.
  keys.resize(std::max<size_t>(kSample, static_cast<size_t>(n)));
  for (int32_t j = 0; j < kSample; ++j) keys[j] = order_key(score[static_cast<int64_t>(j) * n / kSample]);
  const int64_t expected = static_cast<int64_t>(k) * kSample / n;
  const int32_t r = static_cast<int32_t>(std::min<int64_t>(kSample - 1, expected + expected / 4 + 4));
  const uint32_t threshold = kernels().kth_largest_key(keys.data(), kSample, r + 1);
  cand.resize(static_cast<size_t>(n) + 16);
  const int32_t c = kernels().indices_at_least(score, n, threshold, cand.data());
  if (c < k) return top_k_radix(score, n, k, out);
  for (int32_t j = 0; j < c; ++j) keys[j] = order_key(score[cand[j]]);
  take_k_best(keys.data(), cand.data(), c, k, out);
}

}  // namespace fathom::cpu::sparse
