// Bifurcated (shared-prefix) decode attention vs per-sequence dense attention on the CPU, judged
// against the memory-bandwidth roofline.
//
// One decode step's attention of one layer: b sequences share a prefix of S tokens (stored once,
// f16, with the transposed-K plane the engine keeps by default) and each has its own 16-token
// suffix; n_kv_heads = 1, G = 3 query heads per kv head
// (SmolLM2-135M's group; a model with H kv heads does H times the work and bytes). Measured:
//   bifurcated  cpu::bifurcated_decode, one call for the whole group
//   dense       cpu::paged_attention once per sequence (what the engine does without sharing)
// Each figure is the median of --reps timed calls (after one warm-up call; a 64 MiB buffer is
// streamed before each, so the KV comes from memory as in a decode step), the fastest call
// beside it: other processes may share the machine (the load average is printed), and the fastest
// call is the closest to what an idle machine does; speed-ups and % of bound use the median. KV
// bytes are what each reads: bifurcated (S + 16·b)·2·row_bytes, dense b·(S + 16)·2·row_bytes; the
// bound is bytes / bandwidth, bandwidth measured here (best of 5 passes over a 1 GiB buffer on
// all threads, plain 64-bit sums) unless --bandwidth-gbs is given.
// Break-even: b = 2, 4, 8 and prefixes 16..512 (--reps-small calls each): the ratio
// bifurcated / dense time; the first prefix where it drops below 1 is the break-even.
//
//   bench_bifurcated [--threads 2] [--reps 7] [--reps-small 51] [--max-prefix 16384]
//                    [--bandwidth-gbs X] [--out bench/results/bifurcated.md]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_partial.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/sparse_attention.h"

namespace fathom {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int32_t kBlock = 16, kSuffix = 16, kGroup = 3, kKvHeads = 1;

struct Args {
  int threads = 2, reps = 7, reps_small = 51;
  int32_t max_prefix = 16384;
  double bandwidth_gbs = 0;  // 0: measure
  std::string out = "bench/results/bifurcated.md";
};

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "missing value for %s\n", k.c_str());
      std::exit(2);
    }
    const char* v = argv[++i];
    if (k == "--threads") a.threads = std::atoi(v);
    else if (k == "--reps") a.reps = std::atoi(v);
    else if (k == "--reps-small") a.reps_small = std::atoi(v);
    else if (k == "--max-prefix") a.max_prefix = std::atoi(v);
    else if (k == "--bandwidth-gbs") a.bandwidth_gbs = std::atof(v);
    else if (k == "--out") a.out = v;
    else {
      std::fprintf(stderr, "unknown flag %s\n", k.c_str());
      std::exit(2);
    }
  }
  return a;
}

// Read bandwidth, GB/s: every thread sums its part of a 1 GiB buffer; best of 5 passes.
double measure_bandwidth(ThreadPool& pool) {
  const size_t n = (size_t{1} << 30) / sizeof(uint64_t);
  std::vector<uint64_t> buf(n, 1);
  std::vector<uint64_t> sums(pool.size());
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    std::fill(sums.begin(), sums.end(), 0);
    const auto t0 = Clock::now();
    pool.parallel_for(static_cast<int64_t>(n), [&](int64_t b, int64_t e, int t) {
      uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      for (int64_t i = b; i + 4 <= e; i += 4) {
        s0 += buf[i];
        s1 += buf[i + 1];
        s2 += buf[i + 2];
        s3 += buf[i + 3];
      }
      sums[t] += s0 + s1 + s2 + s3;
    }, 4096);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::max(best, static_cast<double>(n * sizeof(uint64_t)) / s / 1e9);
  }
  uint64_t total = 0;
  for (uint64_t s : sums) total += s;
  if (total == 0) std::printf("(unexpected zero sum)\n");
  return best;
}

// b sequences sharing an S-token prefix (S a multiple of the block size), each with a 16-token
// suffix in its own block; f16 K/V.
struct Setup {
  int32_t d = 0, S = 0, b = 0;
  std::vector<uint16_t> k, v;                // [blocks][1][16][d]
  std::vector<uint16_t> k_t;                 // [blocks][1][d][16]: the transposed-K plane the engine keeps by default
  std::vector<std::vector<int32_t>> tables;  // per sequence: shared blocks, then its own
  std::vector<PagedKvView> views;
  std::vector<ref::SharedSegment> segments;
  std::vector<float> q, out;                 // [b][G][d]
  std::vector<DecodeArgs> args;

  Setup(int32_t d_, int32_t S_, int32_t b_, std::mt19937& rng) : d(d_), S(S_), b(b_) {
    const int32_t shared = S / kBlock, own = (kSuffix + kBlock - 1) / kBlock;
    const int64_t blocks = shared + static_cast<int64_t>(b) * own;
    const int64_t elems = blocks * kKvHeads * kBlock * d;
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> tmp(elems);
    k.resize(elems);
    v.resize(elems);
    for (float& x : tmp) x = normal(rng);
    cpu::kv_store(tmp.data(), k.data(), KvDtype::kF16, elems);
    for (float& x : tmp) x = normal(rng);
    cpu::kv_store(tmp.data(), v.data(), KvDtype::kF16, elems);
    k_t.resize(elems);
    for (int64_t tile = 0; tile < blocks * kKvHeads; ++tile)
      for (int32_t c = 0; c < d; ++c)
        for (int32_t t = 0; t < kBlock; ++t) k_t[(tile * d + c) * kBlock + t] = k[(tile * kBlock + t) * d + c];
    tables.resize(b);
    for (int32_t i = 0; i < b; ++i) {
      for (int32_t j = 0; j < shared; ++j) tables[i].push_back(j);
      for (int32_t j = 0; j < own; ++j) tables[i].push_back(shared + i * own + j);
    }
    for (int32_t i = 0; i < b; ++i) {
      views.push_back(PagedKvView{k.data(), v.data(), KvDtype::kF16, tables[i].data(), kBlock, kKvHeads, d});
      views.back().k_t = k_t.data();
    }
    std::vector<int32_t> members(b);
    for (int32_t i = 0; i < b; ++i) members[i] = i;
    segments.push_back({&views[0], 0, S, members});
    const int32_t n_heads = kGroup * kKvHeads;
    q.resize(static_cast<size_t>(b) * n_heads * d);
    out.resize(q.size());
    for (float& x : q) x = normal(rng);
    for (int32_t i = 0; i < b; ++i)
      args.push_back(DecodeArgs{q.data() + static_cast<int64_t>(i) * n_heads * d,
                                out.data() + static_cast<int64_t>(i) * n_heads * d, n_heads, S + kSuffix - 1,
                                1.0f / std::sqrt(static_cast<float>(d))});
  }

  int64_t bifurcated(ThreadPool& pool) { return cpu::bifurcated_decode(pool, segments, views.data(), args.data(), b); }
  void dense(ThreadPool& pool) {
    for (int32_t i = 0; i < b; ++i)
      cpu::paged_attention(pool, views[i], AttentionArgs{args[i].q, args[i].out, 1, args[i].n_heads, args[i].pos, 0,
                                                         args[i].scale});
  }
  int64_t dense_bytes() const {
    return static_cast<int64_t>(b) * (S + kSuffix) * 2 * static_cast<int64_t>(kv_row_bytes(KvDtype::kF16, d)) * kKvHeads;
  }
};

struct Timing {
  double median, min;  // seconds
};

std::atomic<uint64_t> g_sink{0};  // keeps the eviction loads alive

// Streams a 64 MiB buffer on every thread of the pool: a decode step finds a layer's KV in memory,
// not in the cache (the weights and the other layers stream through it in between), and so
// does every timed call here. On all threads, as bench_sparse_attention does, so the workers
// are spinning, not asleep, when the timed call starts.
void evict_caches(ThreadPool& pool) {
  static std::vector<uint64_t> buf(size_t{64} << 17, 1);
  pool.run_on_all([&](int t, int n) {
    uint64_t s = 0;
    for (size_t i = buf.size() * t / n / 8 * 8; i < buf.size() * (t + 1) / n; i += 8) s += buf[i];
    g_sink.fetch_add(s, std::memory_order_relaxed);
  });
  pool.run_on_all([](int, int) {});  // a worker that finished early and slept is woken (bench_sparse_attention)
}

// `reps` calls after one warm-up call, the caches evicted before each.
Timing time_calls(ThreadPool& pool, int reps, const std::function<void()>& fn) {
  fn();
  std::vector<double> t(reps);
  for (double& x : t) {
    evict_caches(pool);
    const auto t0 = Clock::now();
    fn();
    x = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  std::sort(t.begin(), t.end());
  return {t[reps / 2], t[0]};
}

// Which kernel bifurcated_decode gives passes of many rows (f16 KV with Kᵀ, as here).
const char* many_rows_kernel() {
  if (std::string(cpu::simd_level()) != "avx512") return "the per-row kernel";
  return cpu::partial_attention_rows_amx() ? "AMX (bf16x3) for passes of 32 or more rows (b >= 11 here, so not in the break-even sweep), the AVX-512 Kᵀ kernel below"
                                           : "AVX-512 Kᵀ kernel";
}

std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

}  // namespace
}  // namespace fathom

int main(int argc, char** argv) {
  using namespace fathom;
  const Args a = parse_args(argc, argv);
  ThreadPool pool(a.threads);
  std::mt19937 rng(7);
  std::ostringstream md;
  const std::string load0 = load_average();
  const double bw = a.bandwidth_gbs > 0 ? a.bandwidth_gbs : measure_bandwidth(pool);
  char line[512];
  md << "# Bifurcated vs per-sequence dense decode attention (CPU)\n\n"
     << "bench/bench_bifurcated.cpp: one layer's decode-step attention, f16 KV, n_kv_heads = " << kKvHeads
     << ", G = " << kGroup << " query heads per kv head, b sequences sharing an S-token prefix, each with a "
     << kSuffix << "-token own suffix; " << a.threads << " threads, SIMD " << cpu::simd_level() << ". Times are the median of "
     << a.reps << " calls (break-even: " << a.reps_small << ") after a warm-up, each after a 64 MiB stream that evicts the KV from the caches; many-rows kernel: " << many_rows_kernel() << "; read bandwidth "
     << (a.bandwidth_gbs > 0 ? "given" : "measured") << ": " << std::to_string(bw).substr(0, 5)
     << " GB/s; bound = bytes / bandwidth. Load average at start: " << load0 << ".\n\n";

  md << "## Time per step\n\n"
     << "Times: median (fastest) of the calls.\n\n"
     << "| d | S | b | bifurcated ms | dense ms | speed-up | bif MB | dense MB | bif bound ms | dense bound ms | bif "
        "% of bound | dense % of bound |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  std::vector<int32_t> prefixes = {1024, 4096, 16384, 65536};
  for (int32_t d : {64, 128})
    for (int32_t S : prefixes) {
      if (S > a.max_prefix) continue;
      for (int32_t b : {1, 4, 16, 64}) {
        Setup s(d, S, b, rng);
        int64_t bif_bytes = 0;
        const Timing tb = time_calls(pool, a.reps, [&] { bif_bytes = s.bifurcated(pool); });
        const Timing td = time_calls(pool, a.reps, [&] { s.dense(pool); });
        const double t_bif = tb.median, t_dense = td.median;
        const double bound_bif = bif_bytes / (bw * 1e9), bound_dense = s.dense_bytes() / (bw * 1e9);
        std::snprintf(line, sizeof line,
                      "| %d | %d | %d | %.3f (%.3f) | %.3f (%.3f) | %.2fx | %.2f | %.2f | %.3f | %.3f | %.0f%% | %.0f%% |\n",
                      d, S, b, t_bif * 1e3, tb.min * 1e3, t_dense * 1e3, td.min * 1e3, t_dense / t_bif, bif_bytes / 1e6,
                      s.dense_bytes() / 1e6,
                      bound_bif * 1e3, bound_dense * 1e3, 100 * bound_bif / t_bif, 100 * bound_dense / t_dense);
        std::fputs(line, stdout);
        std::fflush(stdout);
        md << line;
      }
    }

  md << "\n## Break-even (bifurcated time / dense time; < 1: bifurcated is faster)\n\n";
  for (int32_t d : {64, 128}) {
    md << "d = " << d << ":\n\n| b \\ prefix |";
    const std::vector<int32_t> small = {16, 32, 64, 128, 256, 512};
    for (int32_t p : small) md << " " << p << " |";
    md << " break-even prefix |\n|---|";
    for (size_t i = 0; i <= small.size(); ++i) md << "---|";
    md << "\n";
    for (int32_t b : {2, 4, 8}) {
      md << "| " << b << " |";
      int32_t even = -1;
      for (int32_t p : small) {
        Setup s(d, p, b, rng);
        const double t_bif = time_calls(pool, a.reps_small, [&] { s.bifurcated(pool); }).median;
        const double t_dense = time_calls(pool, a.reps_small, [&] { s.dense(pool); }).median;
        const double r = t_bif / t_dense;
        if (r < 1 && even < 0) even = p;
        std::snprintf(line, sizeof line, " %.2f (%.1f/%.1f us) |", r, t_bif * 1e6, t_dense * 1e6);
        md << line;
        std::printf("d=%d b=%d prefix=%d: bifurcated %.1f us, dense %.1f us, ratio %.2f\n", d, b, p, t_bif * 1e6,
                    t_dense * 1e6, r);
      }
      md << " " << (even < 0 ? std::string("> 512") : std::to_string(even)) << " |\n";
    }
    md << "\n";
  }
  md << "Load average at end: " << load_average() << ".\n";
  std::printf("\n%s", md.str().c_str());
  std::ofstream f(a.out);
  f << md.str();
  std::printf("wrote %s\n", a.out.c_str());
  return 0;
}
