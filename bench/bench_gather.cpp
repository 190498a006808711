// What a compacted copy of SWA's heavy hitters would buy (issue 20): sparse::attend over the same
// number of kept keys per kv head read three ways, the KV from memory each time —
//   runs:       positions in runs of 7-16 keys scattered over S (SWA's pooled heavy hitters at 1/8:
//               ~0.56 of each touched block kept), gathered row by row (the served path today);
//   contiguous: as many consecutive positions, gathered row by row (a copy in slot order read by
//               the same kernel: bitwise the gathered result over the same order);
//   streamed:   as many consecutive positions streamed through the transposed-K kernel (a copy with
//               Kᵀ tiles, as SWA's window is read).
// The planes sit in 2 MiB pages as the CPU backend holds them; every call is preceded by a flush of
// all three planes on both threads (a flush on one thread lets the other fall asleep, and the timed
// call would pay its wake-up).
// Then whether the runs' misses hide behind a layer's weight reads (a decode step reads ~1.7 MB of
// SmolLM2 Q4_1 FFN weights a layer before the next layer's attention; the kept set changes by <1%
// a step, so its rows are known early): a 1.7 MB stream (the weights' stand-in, flushed too) then
// the gather; the same with the gather's lines prefetched (T1) a few per 64 bytes streamed; the
// stream alone and with the prefetches alone; the lines prefetched in one burst, then the gather.
//   bench_gather [--threads 2] [--keys 8192] [--kept 500] [--reps 200] [--out FILE]
#include <algorithm>
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench/huge_kv.h"
#include "kernels/cpu/cache_evict.h"
#include "kernels/cpu/sparse_common.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/kernel/paged_kv_fixture.h"

using namespace fathom;

namespace {

// `kept` positions below S − 512 (the window's place) in runs of 7-16, a run's start uniform.
std::vector<int32_t> scattered_runs(int32_t S, int32_t kept, std::mt19937& rng) {
  std::vector<char> take(S - 512, 0);
  for (int32_t n = 0; n < kept;) {
    const int32_t len = 7 + static_cast<int32_t>(rng() % 10), at = static_cast<int32_t>(rng() % (S - 512 - 16));
    for (int32_t i = at; i < at + len && n < kept; ++i)
      if (!take[i]) take[i] = 1, ++n;
  }
  std::vector<int32_t> pos;
  for (int32_t i = 0; i < S - 512; ++i)
    if (take[i]) pos.push_back(i);
  return pos;
}

// Σ x[0..n) (n a multiple of 16), with `per_vector` of lines[*next..] prefetched (T1) after each 64
// bytes read. (AVX-512: main exits on a CPU without it.)
__attribute__((target("avx512f"))) float sum_prefetching(const float* x, size_t n, const std::vector<const char*>& lines,
                                                         size_t per_vector) {
  size_t next = 0;
  __m512 acc = _mm512_setzero_ps();
  for (size_t e = 0; e + 16 <= n; e += 16) {
    acc = _mm512_add_ps(acc, _mm512_loadu_ps(x + e));
    for (size_t k = 0; k < per_vector && next < lines.size(); ++k) _mm_prefetch(lines[next++], _MM_HINT_T1);
  }
  float lanes[16];
  _mm512_storeu_ps(lanes, acc);  // (not _mm512_reduce_add_ps: GCC 12 warns inside it at -O3)
  return std::accumulate(lanes, lanes + 16, 0.0f);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, reps = 200;
  int32_t S = 8192, kept = 500;
  std::string out_path;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--threads") threads = std::atoi(argv[i + 1]);
    else if (a == "--keys") S = std::atoi(argv[i + 1]);
    else if (a == "--kept") kept = std::atoi(argv[i + 1]);
    else if (a == "--reps") reps = std::atoi(argv[i + 1]);
    else if (a == "--out") out_path = argv[i + 1];
    else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  if (S < 1024 || kept < 1 || kept > S / 4 || threads < 1 || reps < 1) {
    std::fprintf(stderr, "need --keys >= 1024, 1 <= --kept <= keys / 4\n");
    return 2;
  }
  constexpr int32_t d = 64, n_kv = 3, G = 3, bs = 16;  // SmolLM2's attention shape, f16
  std::mt19937 rng(1);
  testing::PagedKvFixture f = testing::make_paged_kv(d, n_kv, bs, KvDtype::kF16, S, 0, rng);
  std::iota(f.table.begin(), f.table.end(), 0);  // a sequence's blocks in allocation order
  const HugeKv huge(f);
  const PagedKvView& kv = huge.view;
  if (!cpu::sparse::run_streamable(cpu::sparse::kernels(), kv, 0, S)) {
    std::fprintf(stderr, "bench_gather: this CPU's kernels do not stream runs (needs AVX-512)\n");
    return 1;
  }
  ThreadPool pool(threads);
  std::vector<float> q(n_kv * G * d), out(q.size());
  for (float& x : q) x = std::normal_distribution<float>(0.0f, 1.0f)(rng);
  const std::vector<int32_t> runs = scattered_runs(S, kept, rng);
  std::vector<int32_t> contiguous(kept);
  std::iota(contiguous.begin(), contiguous.end(), S / 4);
  const size_t plane = f.k.size();
  // Flushes the KV planes (and `extra` bytes at `extra_at`) on every thread, then times fn: wall µs.
  auto timed_cold = [&](const std::function<void()>& fn, const std::byte* extra_at = nullptr, size_t extra = 0) {
    pool.run_on_all([&](int t, int n) {
      const size_t b0 = plane * t / n, b1 = plane * (t + 1) / n;
      for (const std::byte* p : {huge.k.data(), huge.k_t.data(), huge.v.data()}) cpu::evict_from_cache(p + b0, b1 - b0);
      if (extra_at != nullptr) cpu::evict_from_cache(extra_at + extra * t / n, extra * (t + 1) / n - extra * t / n);
    });
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  };

  // One task per kv head: the G query rows over `pos` (kept keys), or over the run of as many keys
  // from S / 4 when pos is null.
  auto make_tasks = [&](const std::vector<int32_t>* pos) {
    std::vector<cpu::sparse::AttendTask> tasks(n_kv);
    for (int32_t g = 0; g < n_kv; ++g) {
      cpu::sparse::AttendTask& t = tasks[g];
      t.g = g;
      t.R = G;
      t.q = &q[static_cast<size_t>(g) * G * d];
      t.out = &out[static_cast<size_t>(g) * G * d];
      if (pos != nullptr) {
        t.pos = pos->data();
        t.n = kept;
      } else {
        t.run_begin = S / 4;
        t.run_end = S / 4 + kept;
      }
    }
    return tasks;
  };
  struct Case {
    const char* name;
    const std::vector<int32_t>* pos;  // null: streamed run
  };
  const Case cases[] = {{"runs (gathered)", &runs}, {"contiguous (gathered)", &contiguous}, {"contiguous (streamed)", nullptr}};
  std::string table = "| read | median µs | best µs | ns per key and kv head |\n|---|---:|---:|---:|\n";
  for (const Case& c : cases) {
    std::vector<double> us;
    const std::vector<cpu::sparse::AttendTask> tasks = make_tasks(c.pos);
    for (int it = 0; it < reps; ++it)
      us.push_back(timed_cold([&] { cpu::sparse::attend(pool, cpu::sparse::kernels(), kv, 0.125f, tasks); }));
    std::sort(us.begin(), us.end());
    const double median = us[us.size() / 2];
    char line[200];
    std::snprintf(line, sizeof line, "| %s | %.1f | %.1f | %.1f |\n", c.name, median, us[0], median * 1000.0 / (kept * n_kv));
    table += line;
    std::fputs(line, stderr);
  }

  // The overlap probe. lines[t]: thread t's share of the runs' K and V lines (d 64 f16: 2 + 2 a key).
  const size_t weight_bytes = 1700 * 1024;
  std::vector<float> weights(weight_bytes / sizeof(float), 1.0f);
  std::vector<std::vector<const char*>> lines(threads);
  {
    std::vector<const char*> all;
    std::vector<int64_t> rows(kept);
    for (int32_t g = 0; g < n_kv; ++g) {
      cpu::sparse::row_offsets(kv, g, runs.data(), kept, rows.data());
      for (int32_t i = 0; i < kept; ++i)
        for (const void* base : {kv.k, kv.v})
          for (int64_t c = 0; c < 2 * d; c += 64) all.push_back(static_cast<const char*>(base) + rows[i] * 2 + c);
    }
    for (size_t i = 0; i < all.size(); ++i) lines[i * threads / all.size()].push_back(all[i]);
  }
  std::vector<float> sums(threads);
  // Each thread sums its share of the weights; with `prefetch`, asks for its share of the lines
  // spread evenly over the stream; with `burst`, asks for them all and streams nothing.
  auto stream = [&](bool prefetch, bool burst) {
    pool.run_on_all([&](int t, int n) {
      const std::vector<const char*>& mine = lines[t];
      if (burst) {
        for (const char* line : mine) _mm_prefetch(line, _MM_HINT_T1);
        return;
      }
      const size_t e0 = weights.size() * t / n / 16 * 16, e1 = weights.size() * (t + 1) / n / 16 * 16;
      const size_t per_vector = prefetch ? mine.size() * 16 / (e1 - e0) + 1 : 0;  // lines per 16 floats
      sums[t] += sum_prefetching(&weights[e0], e1 - e0, mine, per_vector);
    });
  };
  const std::vector<cpu::sparse::AttendTask> run_tasks = make_tasks(&runs);
  auto gather = [&] { cpu::sparse::attend(pool, cpu::sparse::kernels(), kv, 0.125f, run_tasks); };
  struct Overlap {
    const char* name;
    std::function<void()> fn;
  };
  const Overlap overlaps[] = {
      {"weights streamed", [&] { stream(false, false); }},
      {"weights streamed, then the runs gathered", [&] { stream(false, false), gather(); }},
      {"weights streamed with the runs' lines prefetched in it", [&] { stream(true, false); }},
      {"weights streamed with the runs' lines prefetched in it, then the runs gathered", [&] { stream(true, false), gather(); }},
      {"the runs' lines prefetched in one burst, then the runs gathered", [&] { stream(false, true), gather(); }},
  };
  std::string overlap_table = "| read | median µs | best µs |\n|---|---:|---:|\n";
  for (const Overlap& o : overlaps) {
    std::vector<double> us;
    for (int it = 0; it < reps; ++it)
      us.push_back(timed_cold(o.fn, reinterpret_cast<const std::byte*>(weights.data()), weight_bytes));
    std::sort(us.begin(), us.end());
    char line[200];
    std::snprintf(line, sizeof line, "| %s | %.1f | %.1f |\n", o.name, us[us.size() / 2], us[0]);
    overlap_table += line;
    std::fputs(line, stderr);
  }
  if (!out_path.empty()) {
    std::ofstream o(out_path);
    o << "# Gathered vs contiguous vs streamed keys (`bench_gather`)\n\n"
      << "Generated by `build/bench_gather --threads " << threads << " --keys " << S << " --kept " << kept << " --reps " << reps
      << "`: sparse::attend over " << kept << " keys per kv head of " << S << " (3 kv heads, 3 query rows each, d 64, f16), "
      << "the KV flushed from the caches before each call; median and best of " << reps << " calls, wall time.\n\n"
      << table
      << "\nWhether the runs' misses hide behind a layer's weight reads: a " << weight_bytes / 1024
      << " KiB stream (the weights' stand-in, flushed too) and the runs case above, its " << kept * n_kv * 4
      << " K and V lines prefetched (T1) inside the stream or in one burst.\n\n"
      << overlap_table;
  }
  return 0;
}
