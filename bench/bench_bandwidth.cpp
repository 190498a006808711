// Read-only memory bandwidth: the roofline that bounds decode speed.
//
// A buffer far larger than the last-level cache (default 1 GiB) is split into one contiguous
// part per thread; each thread sums its part with the widest SIMD the CPU has (AVX-512, else
// AVX2, else scalar; chosen at run time). One repetition = all threads released together by a
// barrier, wall time until the last one finishes. Bandwidth = buffer bytes / that time
// (GB = 1e9 bytes). The best of --reps repetitions is the figure (the machine's capability;
// slower repetitions are disturbance), the median is reported beside it.
//
// Then random 64-byte lines from the same buffer, the bound of gather kernels (sparse attention
// reads scattered K/V rows and half-line K^T slices, not streams): (a) the latency of one
// dependent load (a chain whose next line is a hash of the word just read and the step), (b) the rate of
// independent loads at random lines, per thread count (the memory system's parallelism for
// scattered reads). Best of --reps as above.
//
// Last, the stream again but handed out as decode hands out a matmul: the buffer in jobs of a few
// hundred KiB (a decode step's weight matrices are 0.06-2 MiB), each job split over fathom's
// ThreadPool (run_on_all: every thread sums its slice, the caller waits for the last), beside the
// cost of an empty job. What a call of that size can stream, fork and join included.
//
//   bench_bandwidth [--threads 1,2] [--size-mib 1024] [--reps 7] [--json FILE]
#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <immintrin.h>
#include <sys/mman.h>

#include <nlohmann/json.hpp>

#include "bench/cli.h"
#include "bench/read_sum.h"
#include "kernels/cpu/thread_pool.h"

namespace {

using fathom::bench::pick_simd;
using fathom::bench::Simd;
using fathom::bench::SumFn;

using Clock = std::chrono::steady_clock;

// Sum of the words [a, b) when word i holds i (mod 2^64, as the SIMD sums wrap).
uint64_t expected_sum(uint64_t a, uint64_t b) {
  const uint64_t n = b - a;
  const uint64_t x = a + b - 1;  // sum = n * x / 2; one of n, x is even
  return (n % 2 == 0) ? (n / 2) * x : n * (x / 2);
}

struct Result {
  int threads;
  std::vector<double> gbps;  // one per repetition
  double best() const { return *std::max_element(gbps.begin(), gbps.end()); }
  double median() const {
    std::vector<double> v = gbps;
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  }
};

// `threads` workers run pass(t) -> a 64-bit sum, all released together by a barrier; one pass's
// time is the wall time until the last finishes, GB/s = `bytes` / that time. The main thread only
// times: it passes the start barrier with the workers and takes the clock after the end barrier,
// so thread start-up is outside every measurement. The first pass (TLBs, prefetchers) is not
// timed. Every pass's total must equal `expected` (mod 2^64): the loads cannot be skipped.
template <typename Pass>
Result timed_passes(int threads, int reps, double bytes, const Pass& pass_body, uint64_t expected) {
  Result r{threads, {}};
  std::barrier sync(threads + 1);
  std::vector<uint64_t> sums(static_cast<size_t>(threads) * 8);  // a cache line apart
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t)
    workers.emplace_back([&, t] {
      for (int pass = 0; pass <= reps; ++pass) {
        sync.arrive_and_wait();
        sums[t * 8] = pass_body(t);
        sync.arrive_and_wait();
      }
    });
  for (int pass = 0; pass <= reps; ++pass) {
    sync.arrive_and_wait();
    const auto t0 = Clock::now();
    sync.arrive_and_wait();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    uint64_t total = 0;
    for (int t = 0; t < threads; ++t) total += sums[t * 8];
    if (total != expected) throw std::runtime_error("sum mismatch: the kernel did not read what it should");
    if (pass > 0) r.gbps.push_back(bytes / s / 1e9);
  }
  for (std::thread& w : workers) w.join();
  return r;
}

// Streaming at one thread count: each worker sums its contiguous, 64-word-aligned part.
Result measure(const uint64_t* buf, size_t words, int threads, int reps, SumFn fn) {
  std::vector<size_t> bounds(threads + 1);
  for (int t = 0; t <= threads; ++t) bounds[t] = words / 64 * t / threads * 64;
  return timed_passes(
      threads, reps, static_cast<double>(bounds[threads] * sizeof(uint64_t)),
      [&](int t) { return fn(buf + bounds[t], bounds[t + 1] - bounds[t]); }, expected_sum(0, bounds[threads]));
}

// Line index after `word` (the value read, its own word index) in a chain over `lines` lines.
inline size_t next_line(uint64_t word, size_t lines) {
  uint64_t z = word + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return static_cast<size_t>((z ^ (z >> 31)) % lines);
}

// ns per dependent load over `steps` steps of the chain (one thread).
double chase_ns(const uint64_t* buf, size_t lines, size_t steps) {
  size_t line = 0;
  const auto t0 = Clock::now();
  // (+ i: a function iterated on its own falls into a cycle of ~sqrt(lines) lines, which caches)
  for (size_t i = 0; i < steps; ++i) line = next_line(buf[line * 8] + i, lines);
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  volatile size_t sink = line;  // the chain's end is used: the loads cannot be optimised away
  (void)sink;
  return s * 1e9 / static_cast<double>(steps);
}

// Independent loads of random lines: each thread reads `per_thread` lines of its own part, at
// indices precomputed in a sequentially read array. GB/s = 64 B x lines / wall time.
Result measure_random(const uint64_t* buf, size_t words, int threads, int reps, size_t per_thread) {
  const size_t lines = words / 8;
  std::vector<std::vector<uint32_t>> index(threads, std::vector<uint32_t>(per_thread));
  uint64_t expected = 0;  // word w holds w: the line's first word is 8 x line
  for (int t = 0; t < threads; ++t) {
    const size_t lo = lines * t / threads, n = lines * (t + 1) / threads - lo;
    for (size_t i = 0; i < per_thread; ++i) {
      index[t][i] = static_cast<uint32_t>(lo + next_line(i * 977 + t, n));
      expected += uint64_t{8} * index[t][i];
    }
  }
  return timed_passes(
      threads, reps, 64.0 * static_cast<double>(per_thread) * threads,
      [&](int t) {
        uint64_t a = 0;
        for (uint32_t line : index[t]) a += buf[static_cast<size_t>(line) * 8];
        return a;
      },
      expected);
}

// The stream in jobs of `job_bytes`, each split over the pool's threads (see the header).
double pooled_gbps(fathom::ThreadPool& pool, const uint64_t* buf, size_t words, size_t job_bytes, int reps, SumFn fn) {
  const size_t job_words = job_bytes / sizeof(uint64_t), jobs = words / job_words;
  double best = 0;
  for (int rep = 0; rep <= reps; ++rep) {
    std::atomic<uint64_t> total{0};
    const auto t0 = Clock::now();
    for (size_t j = 0; j < jobs; ++j)
      pool.run_on_all([&](int t, int n) {
        const size_t b = j * job_words + job_words * t / n / 64 * 64, e = j * job_words + job_words * (t + 1) / n / 64 * 64;
        total.fetch_add(fn(buf + b, e - b), std::memory_order_relaxed);
      });
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    // As every measure here: the pass's total must be the closed form (job_words is a multiple of
    // 64 words, so the slices cover each job exactly).
    if (total.load() != expected_sum(0, jobs * job_words))
      throw std::runtime_error("sum mismatch: the kernel did not read what it should");
    if (rep > 0) best = std::max(best, static_cast<double>(jobs * job_bytes) / s / 1e9);
  }
  return best;
}

// µs per run_on_all of an empty job (best of reps of 100k calls).
double empty_job_us(fathom::ThreadPool& pool, int reps) {
  double best = 1e30;
  for (int rep = 0; rep < reps; ++rep) {
    const auto t0 = Clock::now();
    for (int i = 0; i < 100000; ++i) pool.run_on_all([](int, int) {});
    best = std::min(best, std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / 1e5);
  }
  return best;
}

void usage() {
  std::fprintf(stderr,
               "usage: bench_bandwidth [--threads 1,2] [--size-mib 1024] [--reps 7] [--simd avx512|avx2|scalar]\n"
               "                       [--json FILE]\n");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::vector<int> threads = {1, 2};
    long size_mib = 1024;
    int reps = 7;
    std::string json_path, forced_simd;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc) throw std::runtime_error(a + " needs a value");
        return argv[++i];
      };
      if (a == "--threads") threads = fathom::bench::parse_int_list<int>(value(), "--threads", 1, 1024);
      else if (a == "--size-mib") size_mib = std::atol(value().c_str());
      else if (a == "--reps") reps = std::atoi(value().c_str());
      else if (a == "--json") json_path = value();
      else if (a == "--simd") forced_simd = value();
      else if (a == "-h" || a == "--help") { usage(); return 0; }
      else throw std::runtime_error("unknown argument '" + a + "'");
    }
    if (size_mib < 64) throw std::runtime_error("--size-mib must be at least 64 (the buffer must dwarf the LLC)");
    if (reps < 5) throw std::runtime_error("--reps must be at least 5");
    const Simd simd = pick_simd(forced_simd);

    const size_t bytes = static_cast<size_t>(size_mib) << 20;
    const size_t words = bytes / sizeof(uint64_t);
    // 2 MiB alignment so transparent huge pages can back the buffer (fewer TLB misses, as
    // a large mapped weight file would also mostly get); advisory only.
    auto* buf = static_cast<uint64_t*>(std::aligned_alloc(2u << 20, bytes));
    if (!buf) throw std::runtime_error("cannot allocate " + std::to_string(size_mib) + " MiB");
    madvise(buf, bytes, MADV_HUGEPAGE);
    // Write every word (real pages, not the shared zero page), in parallel to be quick.
    {
      const int fill_threads = std::max(1u, std::thread::hardware_concurrency());
      std::vector<std::thread> fill;
      for (int t = 0; t < fill_threads; ++t)
        fill.emplace_back([=] {
          for (size_t i = words * t / fill_threads; i < words * (t + 1) / fill_threads; ++i) buf[i] = i;
        });
      for (std::thread& f : fill) f.join();
    }

    std::printf("bench_bandwidth: %ld MiB buffer, %s, best of %d repetitions (GB = 1e9 bytes)\n", size_mib, simd.name,
                reps);
    nlohmann::json results = nlohmann::json::array();
    for (int t : threads) {
      const Result r = measure(buf, words, t, reps, simd.fn);
      std::printf("  threads %2d: %6.2f GB/s best, %6.2f GB/s median\n", t, r.best(), r.median());
      std::fflush(stdout);
      results.push_back({{"threads", t}, {"best_gbps", r.best()}, {"median_gbps", r.median()}, {"all_gbps", r.gbps}});
    }
    const size_t lines = words / 8;
    std::vector<double> chase;
    for (int rep = 0; rep < reps; ++rep) chase.push_back(chase_ns(buf, lines, 1u << 20));
    const double latency = *std::min_element(chase.begin(), chase.end());
    std::printf("random 64-byte lines: %.0f ns per dependent load (best of %d)\n", latency, reps);
    nlohmann::json random = nlohmann::json::array();
    for (int t : threads) {
      const Result r = measure_random(buf, words, t, reps, size_t{1} << 21);
      std::printf("  threads %2d: %6.2f GB/s best, %6.2f GB/s median of independent random line reads (%.1f lines in flight)\n",
                  t, r.best(), r.median(), r.best() / 64.0 * latency / t);
      std::fflush(stdout);
      random.push_back({{"threads", t}, {"best_gbps", r.best()}, {"median_gbps", r.median()}});
    }
    const int pool_threads = *std::max_element(threads.begin(), threads.end());
    fathom::ThreadPool pool(pool_threads);
    const double empty_us = empty_job_us(pool, reps);
    std::printf("in pool jobs (%d threads; an empty job %.2f us):", pool_threads, empty_us);
    nlohmann::json pooled = nlohmann::json::array();
    for (size_t kib : {128, 256, 512, 1024, 4096}) {
      const double g = pooled_gbps(pool, buf, words, kib << 10, reps, simd.fn);
      std::printf("  %zu KiB %.1f GB/s%s", kib, g, kib == 4096 ? "\n" : ",");
      pooled.push_back({{"job_kib", kib}, {"best_gbps", g}});
    }
    std::free(buf);

    if (!json_path.empty()) {
      nlohmann::json j = {{"benchmark", "bandwidth"},
                          {"description", "read-only sum over a buffer split into one contiguous part per thread; "
                                          "GB/s = buffer bytes / wall time of one pass, best of reps"},
                          {"buffer_bytes", bytes},
                          {"simd", simd.name},
                          {"reps", reps},
                          {"hardware_threads", std::thread::hardware_concurrency()},
                          {"results", results},
                          {"random_line_latency_ns", latency},
                          {"random_lines", random},
                          {"pool_threads", pool_threads},
                          {"empty_job_us", empty_us},
                          {"pool_jobs", pooled}};
      std::ofstream out(json_path);
      if (!out) throw std::runtime_error("cannot write " + json_path);
      out << j.dump(2) << "\n";
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_bandwidth: %s\n", e.what());
    return 1;
  }
}
