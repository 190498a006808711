// One decode step's attention (one query, one layer) under each sparse policy vs dense, on the
// CPU: median wall time over repetitions, KV bytes read (each kernel's own counter), the
// bandwidth bound (bytes ÷ read bandwidth) and the speed-up over dense.
//   dense: cpu::paged_attention, n_q = 1
//   SparQ: ref::sparq_params_for_ratio(1/8, S, d), reallocation on, k_t and v_sum present
//   HiP:   mask_k 512 (other parameters the defaults): a refresh step (estimate + attend) and a
//          cached step (mask given)
//   SWA:   ratio 1/8, a random mass, weights written back (what the engine needs)
// f16 KV with the side data, G = 3 query heads per kv head, n_kv_heads kv heads, paged blocks
// of --block-size (16) tokens in a shuffled block table, in 2 MiB pages as the engine holds them.
// Between repetitions a 1 GiB buffer is streamed (by all threads), more than this machine's 480 MiB
// L3, so the KV is read from memory, not from the last-level cache (a decode step's other layers
// evict it too; the 64 MiB buffer of earlier runs left it in this L3).
//
//   bench_sparse_attention [--threads 2] [--reps 15] [--kv-heads 3] [--block-size 16] [--dims 64,128]
//                          [--lens 1024,4096,16384,65536] [--bandwidth-gbs X] [--out FILE]
// Bandwidth: --bandwidth-gbs, else bench/results/bandwidth.json (bench_bandwidth, best at the
// thread count), else 0 (no bound column).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/sparse_attention.h"
#include "bench/huge_kv.h"
#include "tests/kernel/paged_kv_fixture.h"

namespace {

using namespace fathom;
using Clock = std::chrono::steady_clock;

std::vector<int> parse_list(const char* s) {
  std::vector<int> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) v.push_back(std::atoi(item.c_str()));
  return v;
}

double bandwidth_from_json(const char* path, int threads) {
  std::ifstream in(path);
  if (!in) return 0;
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.contains("results")) return 0;
  for (const auto& r : j["results"])
    if (r.value("threads", 0) == threads) return r.value("best_gbps", 0.0);
  return 0;
}

struct Timing {
  double median_us, best_us;  // wall time
  double cpu_us;              // median process CPU time ÷ threads
};

double process_cpu_us() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

struct Row {
  int d, S;
  std::string policy;
  Timing t;
  int64_t bytes;
};

std::atomic<uint64_t> g_sink{0};  // keeps the flush loads alive

}  // namespace


int main(int argc, char** argv) {
  int threads = 2, reps = 15, n_kv = 3, block_size = 16;
  std::vector<int> dims = {64, 128}, lens = {1024, 4096, 16384, 65536};
  double gbs = 0;
  std::string out_path = "bench/results/sparse_attention.md";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--threads") threads = std::atoi(argv[i + 1]);
    else if (a == "--reps") reps = std::atoi(argv[i + 1]);
    else if (a == "--kv-heads") n_kv = std::atoi(argv[i + 1]);
    else if (a == "--block-size") block_size = std::atoi(argv[i + 1]);
    else if (a == "--dims") dims = parse_list(argv[i + 1]);
    else if (a == "--lens") lens = parse_list(argv[i + 1]);
    else if (a == "--bandwidth-gbs") gbs = std::atof(argv[i + 1]);
    else if (a == "--out") out_path = argv[i + 1];
    else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  if (gbs <= 0) gbs = bandwidth_from_json("bench/results/bandwidth.json", threads);
  constexpr int G = 3;
  ThreadPool pool(threads);
  std::vector<uint64_t> flush(size_t{1} << 27);  // 1 GiB: one load per 64-byte line below
  for (size_t i = 0; i < flush.size(); ++i) flush[i] = i;
  // Streamed by every thread of the pool, which leaves the workers spinning for the next job as
  // in a decode step (a single-threaded flush of several ms put them to sleep, and every timed
  // call paid a futex wake-up).
  auto evict = [&] {
    pool.run_on_all([&](int t, int n) {
      uint64_t s = 0;
      for (size_t i = flush.size() * t / n / 8 * 8; i < flush.size() * (t + 1) / n; i += 8) s += flush[i];
      g_sink.fetch_add(s, std::memory_order_relaxed);
    });
  };
  // Median of `reps` timed runs (after one warm-up), the cache flushed before each.
  auto time_us = [&](const std::function<void()>& fn) {
    fn();
    std::vector<double> t, c;
    for (int r = 0; r < reps; ++r) {
      evict();
      const double c0 = process_cpu_us();
      const auto t0 = Clock::now();
      fn();
      t.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      c.push_back((process_cpu_us() - c0) / threads);
    }
    std::sort(t.begin(), t.end());
    std::sort(c.begin(), c.end());
    return Timing{t[t.size() / 2], t.front(), c[c.size() / 2]};
  };

  std::vector<Row> rows;
  std::mt19937 rng(42);
  for (int d : dims) {
    for (int S : lens) {
      const testing::PagedKvFixture f = testing::make_paged_kv(d, n_kv, block_size, KvDtype::kF16, S, 0, rng);
      const HugeKv huge(f);
      const PagedKvView kv = huge.view;
      const int H = G * n_kv;
      std::vector<float> q(static_cast<size_t>(H) * d), out(q.size());
      std::normal_distribution<float> normal(0.0f, 1.0f);
      for (float& x : q) x = normal(rng);
      const DecodeArgs args{q.data(), out.data(), H, S - 1, 1.0f / std::sqrt(static_cast<float>(d))};

      const Timing dense_t = time_us([&] {
        cpu::paged_attention(pool, kv, AttentionArgs{q.data(), out.data(), 1, H, S - 1, 0, args.scale});
      });
      rows.push_back({d, S, "dense", dense_t, 2LL * S * static_cast<int64_t>(kv_row_bytes(kv.dtype, d)) * n_kv});

      const ref::SparqParams sp = ref::sparq_params_for_ratio(1.0 / 8, S, d);
      cpu::SparqResult sr;
      const Timing sparq_us = time_us([&] { sr = cpu::sparq_decode(pool, kv, args, sp); });
      rows.push_back({d, S, "SparQ r=" + std::to_string(sr.r) + " k=" + std::to_string(sr.k), sparq_us, sr.kv_bytes});

      ref::HipParams hp;  // mask_k 512, block_size_k 2, sink 16, window 256
      ref::HipMask mask;
      ref::HipBytes refresh_bytes, cached_bytes;
      const Timing refresh_us = time_us([&] {
        refresh_bytes = {};
        cpu::hip_estimate_mask(pool, kv, args, hp, &mask, &refresh_bytes);
        cpu::hip_sparse_decode(pool, kv, args, hp, mask, &refresh_bytes);
      });
      rows.push_back({d, S, "HiP refresh", refresh_us, refresh_bytes.total()});
      const Timing cached_us = time_us([&] {
        cached_bytes = {};
        cpu::hip_sparse_decode(pool, kv, args, hp, mask, &cached_bytes);
      });
      rows.push_back({d, S, "HiP cached", cached_us, cached_bytes.total()});

      std::vector<float> mass(S), weights;
      std::uniform_real_distribution<float> uni(0.0f, 1.0f);
      for (float& m : mass) m = uni(rng);
      cpu::SwaResult wr;
      const Timing swa_us = time_us([&] { wr = cpu::swa_decode(pool, kv, args, ref::SwaParams{0.125f}, mass.data(), &weights); });
      rows.push_back({d, S, "SWA 1/8", swa_us, wr.kv_bytes});
      for (size_t i = rows.size() - 5; i < rows.size(); ++i)
        std::fprintf(stderr, "d=%d S=%d %-22s median %10.1f us  best %10.1f us  cpu/thread %10.1f us\n", d, S,
                     rows[i].policy.c_str(), rows[i].t.median_us, rows[i].t.best_us, rows[i].t.cpu_us);
    }
  }

  std::ostringstream md;
  md << "# Sparse decode attention on the CPU (one decode step, one layer)\n\n"
     << "bench/bench_sparse_attention.cpp: f16 KV with transposed K and running V sums, " << n_kv << " kv heads x G = "
     << G << " query heads, block " << block_size << " (shuffled table), " << threads << " threads, SIMD " << cpu::simd_level()
     << ". Median of " << reps << " repetitions, a 1 GiB buffer streamed before each (KV read from memory, not this machine's 480 MiB L3). "
     << "Bound = KV bytes / " << gbs << " GB/s (bench_bandwidth read bandwidth at " << threads << " threads). "
     << "The machine is shared with other builds: figures are medians, expect noise.\n\n"
     << "Wall: median and best (fastest) repetition. CPU: median process CPU time ÷ threads, what a step "
     << "costs when the threads are not preempted (includes the workers' spin while they wait); "
     << "% of bound and the CPU speed-up use it.\n\n"
     << "| d | S | policy | wall median µs | wall best µs | CPU µs | KV MB read | bound µs | % of bound | speed-up (wall median) | speed-up (CPU) |\n"
     << "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  Timing dense{};
  for (const Row& r : rows) {
    if (r.policy == "dense") dense = r.t;
    const double bound = gbs > 0 ? static_cast<double>(r.bytes) / (gbs * 1e3) : 0;
    char line[320];
    std::snprintf(line, sizeof line, "| %d | %d | %s | %.1f | %.1f | %.1f | %.3f | %.1f | %.0f%% | %.2fx | %.2fx |\n",
                  r.d, r.S, r.policy.c_str(), r.t.median_us, r.t.best_us, r.t.cpu_us, r.bytes / 1e6, bound,
                  gbs > 0 ? 100.0 * bound / r.t.cpu_us : 0.0, dense.median_us / r.t.median_us, dense.cpu_us / r.t.cpu_us);
    md << line;
  }
  std::fputs(md.str().c_str(), stdout);
  std::ofstream(out_path) << md.str();
  return 0;
}
