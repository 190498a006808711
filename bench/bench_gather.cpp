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
//   bench_gather [--threads 2] [--keys 8192] [--kept 500] [--reps 200] [--out FILE]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
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

  struct Case {
    const char* name;
    const std::vector<int32_t>* pos;  // null: streamed run
  };
  const Case cases[] = {{"runs (gathered)", &runs}, {"contiguous (gathered)", &contiguous}, {"contiguous (streamed)", nullptr}};
  std::string table = "| read | median µs | best µs | ns per key and kv head |\n|---|---:|---:|---:|\n";
  for (const Case& c : cases) {
    std::vector<double> us;
    for (int it = 0; it < reps; ++it) {
      pool.run_on_all([&](int t, int n) {
        const size_t b0 = plane * t / n, b1 = plane * (t + 1) / n;
        for (const std::byte* p : {huge.k.data(), huge.k_t.data(), huge.v.data()}) cpu::evict_from_cache(p + b0, b1 - b0);
      });
      std::vector<cpu::sparse::AttendTask> tasks(n_kv);
      for (int32_t g = 0; g < n_kv; ++g) {
        cpu::sparse::AttendTask& t = tasks[g];
        t.g = g;
        t.R = G;
        t.q = &q[static_cast<size_t>(g) * G * d];
        t.out = &out[static_cast<size_t>(g) * G * d];
        if (c.pos != nullptr) {
          t.pos = c.pos->data();
          t.n = kept;
        } else {
          t.run_begin = S / 4;
          t.run_end = S / 4 + kept;
        }
      }
      const auto t0 = std::chrono::steady_clock::now();
      cpu::sparse::attend(pool, cpu::sparse::kernels(), kv, 0.125f, tasks);
      us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(us.begin(), us.end());
    const double median = us[us.size() / 2];
    char line[200];
    std::snprintf(line, sizeof line, "| %s | %.1f | %.1f | %.1f |\n", c.name, median, us[0], median * 1000.0 / (kept * n_kv));
    table += line;
    std::fputs(line, stderr);
  }
  if (!out_path.empty()) {
    std::ofstream o(out_path);
    o << "# Gathered vs contiguous vs streamed keys (`bench_gather`)\n\n"
      << "Generated by `build/bench_gather --threads " << threads << " --keys " << S << " --kept " << kept << " --reps " << reps
      << "`: sparse::attend over " << kept << " keys per kv head of " << S << " (3 kv heads, 3 query rows each, d 64, f16), "
      << "the KV flushed from the caches before each call; median and best of " << reps << " calls, wall time.\n\n"
      << table;
  }
  return 0;
}
