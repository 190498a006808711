// One decode step's attention (one query, one layer) under each sparse policy vs dense, on the
// CPU: median wall time over repetitions, KV bytes read (each kernel's own counter), the
// bandwidth bound (bytes ÷ read bandwidth) and the speed-up over dense.
//   dense: cpu::paged_attention, n_q = 1
//   SparQ: ref::sparq_params_for_ratio(1/8, S, d), reallocation on, k_t and v_sum present
//   HiP:   as served at 1/8 (resolve_hip: one mask per kv head, mask_k, sink and window from the
//          ratio): a refresh step (estimate + attend) and a cached step (mask given)
//   SWA:   ratio 1/8, a random mass, weights written back (what the engine needs)
// f16 KV with the side data, G (--group, 3) query heads per kv head, n_kv_heads kv heads, paged blocks
// of --block-size (16) tokens in a shuffled block table, in 2 MiB pages as the engine holds them.
// Between repetitions a 1 GiB buffer is streamed (by all threads), more than the (480 MiB Xeon's)
// L3, so the KV is read from memory, not from the last-level cache (a decode step's other layers
// evict it too; the 64 MiB buffer of earlier runs left it in this L3).
//
//   bench_sparse_attention [--threads 2] [--reps 15] [--kv-heads 3] [--group 3] [--block-size 16] [--dims 64,128]
//                          [--lens 1024,4096,16384,65536] [--bandwidth-gbs X] [--out FILE] [--warm 0|1]
// Replay columns: each step's distinct 64-byte lines loaded with nothing else to do, the least time
// any kernel reading them takes on this machine (bench/kv_lines.h); SparQ's two phases also apart.
// Bandwidth: --bandwidth-gbs, else the best of 7 streaming reads of 1 GiB (all threads, bench_bandwidth's
// sum) at the start of the run: measured beside the steps, as the host's bandwidth drifts by the day.
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
#include <iomanip>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

#include "engine/attention/policies/hip.h"
#include "bench/cli.h"
#include "engine/attention/policy.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/sparse_attention.h"
#include "kernels/cpu/sparse_common.h"
#include "bench/huge_kv.h"
#include "bench/kv_lines.h"
#include "bench/read_sum.h"
#include "tests/kernel/paged_kv_fixture.h"

namespace {

using namespace fathom;
using Clock = std::chrono::steady_clock;

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
  double line_mb = 0, replay_us = 0;  // the step's distinct 64-byte lines and their replay (0: not measured)
  double replay_share = 0;            // replay ÷ step, medians over the same (interleaved) repetitions
};

std::atomic<uint64_t> g_sink{0};  // keeps the flush loads alive

// /proc/cpuinfo's "model name" (the results differ by machine: say which ran them).
std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

}  // namespace


int main(int argc, char** argv) {
  int threads = 2, reps = 15, n_kv = 3, block_size = 16;
  std::vector<int> dims = {64, 128}, lens = {1024, 4096, 16384, 65536};
  double gbs = 0;
  bool warm = false;  // --warm 1: no flush, the KV stays in cache (what a step costs without its misses)
  std::string out_path = "bench/results/sparse_attention.md";
  int G = 3;  // query heads per kv head (SmolLM2's 9 on 3; Gemma 3 270M: 4 on 1)
  for (int i = 1; i < argc; i += 2) {
    const std::string a = argv[i];
    if (i + 1 >= argc) {  // a flag without its value (e.g. a lone --help) must not start an hour-long run
      std::fprintf(stderr, "bench_sparse_attention: %s needs a value\n", argv[i]);
      return 2;
    }
    if (a == "--threads") threads = std::atoi(argv[i + 1]);
    else if (a == "--reps") reps = std::atoi(argv[i + 1]);
    else if (a == "--kv-heads") n_kv = std::atoi(argv[i + 1]);
    else if (a == "--group") G = std::atoi(argv[i + 1]);
    else if (a == "--block-size") block_size = std::atoi(argv[i + 1]);
    else if (a == "--dims" || a == "--lens") {
      try {
        (a == "--dims" ? dims : lens) = bench::parse_int_list<int>(argv[i + 1], a.c_str(), 1, a == "--dims" ? 1024 : 1 << 24);
      } catch (const std::invalid_argument& e) {
        std::fprintf(stderr, "bench_sparse_attention: %s\n", e.what());
        return 2;
      }
    }
    else if (a == "--bandwidth-gbs") gbs = std::atof(argv[i + 1]);
    else if (a == "--out") out_path = argv[i + 1];
    else if (a == "--warm") warm = std::atoi(argv[i + 1]) != 0;
    else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  if (G < 1 || G > cpu::sparse::kMaxRows || n_kv < 1) {
    std::fprintf(stderr, "bench_sparse_attention: --group must be 1-%d and --kv-heads >= 1\n", cpu::sparse::kMaxRows);
    return 2;
  }
  ThreadPool pool(threads);
  // 1 GiB in 2 MiB pages. The read bandwidth of the bound: the best of a few streaming sums over
  // it (bench_bandwidth's) with every thread.
  const size_t flush_words = size_t{1} << 27;
  HugePageBuffer flush_buffer(flush_words * sizeof(uint64_t));
  uint64_t* flush = reinterpret_cast<uint64_t*>(flush_buffer.data());
  for (size_t i = 0; i < flush_words; ++i) flush[i] = i;
  double stream_gbs = 0;
  const bench::SumFn stream_sum = bench::pick_simd("").fn;
  for (int rep = 0; rep < 7; ++rep) {
    const auto t0 = Clock::now();
    pool.run_on_all([&](int t, int n) {
      const size_t b = flush_words * t / n / 64 * 64, e = flush_words * (t + 1) / n / 64 * 64;
      g_sink.fetch_add(stream_sum(flush + b, e - b), std::memory_order_relaxed);
    });
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    stream_gbs = std::max(stream_gbs, static_cast<double>(flush_words * sizeof(uint64_t)) / s / 1e9);
  }
  // The flush: one load per line of the 1 GiB by every thread of the pool, which leaves the workers
  // spinning for the next job as in a decode step (a single-threaded flush of several ms put them
  // to sleep, and every timed call paid a futex wake-up). Not the fast streaming sum: after a
  // stream that fast this L3 still held a few MB of the KV (replays of 3 MB ran at 46 GB/s, past
  // the DRAM's bandwidth), as if its replacement policy protected older lines from a scan.
  auto evict = [&] {
    if (!warm) pool.run_on_all([&](int t, int n) {
      uint64_t s = 0;
      for (size_t i = flush_words * t / n / 8 * 8; i < flush_words * (t + 1) / n; i += 8) s += flush[i];
      g_sink.fetch_add(s, std::memory_order_relaxed);
    });
    // The threads rarely end the stream together, and a worker that finishes ~1 ms early has spun
    // out and gone to sleep: the next call would pay its futex wake-up (35-65 µs measured here, in
    // every timed step, which a decode step's back-to-back calls never pay). A no-op call wakes it.
    pool.run_on_all([](int, int) {});
  };
  // One call of fn with the cache flushed first: {wall µs, process CPU µs ÷ threads}.
  struct Call {
    double wall_us, cpu_us;
  };
  auto cold_call = [&](const std::function<void()>& fn) {
    evict();
    const double c0 = process_cpu_us();
    const auto t0 = Clock::now();
    fn();
    return Call{std::chrono::duration<double, std::micro>(Clock::now() - t0).count(), (process_cpu_us() - c0) / threads};
  };
  auto median = [](std::vector<double>& v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  // Median of `reps` timed runs (after one warm-up), the cache flushed before each.
  auto time_us = [&](const std::function<void()>& fn) {
    fn();
    std::vector<double> t, c;
    for (int r = 0; r < reps; ++r) {
      const Call call = cold_call(fn);
      t.push_back(call.wall_us);
      c.push_back(call.cpu_us);
    }
    const double wall_median = median(t);
    return Timing{wall_median, t.front(), median(c)};
  };

  // Replays of line sets interleaved with the step they bound, repetition by repetition (this
  // host's speed drifts within a run): each repetition times the step, then each set at a few
  // prefetch distances (the fastest counts: the bound is the best this machine does), all from
  // memory. Each set's replay and the step: medians over the repetitions (the best repetition
  // was no steadier: now and then the flush leaves some of the KV in the L3, and the minimum
  // takes exactly those). CPU time per thread.
  struct Replay {
    std::vector<double> us;  // per set
    double step_us = 0;
  };
  auto replay = [&](std::vector<bench::KvLines*> sets, const std::function<void()>& step) {
    for (bench::KvLines* set : sets) set->finish();
    std::vector<std::vector<double>> us(sets.size());
    std::vector<double> step_us;
    step();
    for (int r = 0; r < reps; ++r) {
      step_us.push_back(cold_call(step).cpu_us);
      for (size_t i = 0; i < sets.size(); ++i) {
        double best = 0;
        for (size_t ahead : {4, 16, 64}) {
          const double t =
              cold_call([&] { g_sink.fetch_add(bench::replay_lines(pool, sets[i]->lines(), ahead)); }).cpu_us;
          best = best == 0 ? t : std::min(best, t);
        }
        us[i].push_back(best);
      }
    }
    Replay out;
    for (std::vector<double>& u : us) out.us.push_back(median(u));
    out.step_us = median(step_us);
    return out;
  };
  auto with_replay = [&](Row row, bench::KvLines& lines, const Replay& r) {
    row.replay_us = r.us[0];
    row.replay_share = r.us[0] / r.step_us;
    row.line_mb = lines.megabytes();
    return row;
  };

  std::vector<Row> rows;
  struct SparqPhases {
    int d, S;
    double step1_mb, step1_us, step5_mb, step5_us, share;
  };
  std::vector<SparqPhases> phases;
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

      const std::function<void()> dense_step = [&] {
        cpu::paged_attention(pool, kv, AttentionArgs{q.data(), out.data(), 1, H, S - 1, 0, args.scale});
      };
      const Timing dense_t = time_us(dense_step);
      bench::KvLines dense_lines(kv);
      for (int g = 0; g < n_kv; ++g) dense_lines.add_streamed(g, 0, S);
      rows.push_back(with_replay({d, S, "dense", dense_t, 2LL * S * static_cast<int64_t>(kv_row_bytes(kv.dtype, d)) * n_kv},
                                 dense_lines, replay({&dense_lines}, dense_step)));

      const ref::SparqParams sp = ref::sparq_params_for_ratio(1.0 / 8, S, d);
      cpu::SparqResult sr;
      const std::function<void()> sparq_step = [&] { sr = cpu::sparq_decode(pool, kv, args, sp); };
      const Timing sparq_us = time_us(sparq_step);
      cpu::SparqTrace trace;
      cpu::sparq_decode(pool, kv, args, sp, &trace);
      // Step 1's dimension rows and step 5's gathered rows apart (the gather's rows are known only
      // once step 1's scores are ranked), and all of them with the V sum.
      bench::KvLines step1(kv), step5(kv), sparq_lines(kv);
      for (int g = 0; g < n_kv; ++g) {
        for (int b = 0; b * block_size < S; ++b)
          step1.add_kt_rows(g, b, trace.dims[g].data(), sr.r, 0, std::min(block_size, S - b * block_size));
        for (int32_t t : trace.selected[g]) step5.add_kv_rows(g, t);
        sparq_lines.add(kv.v_sum + kv.sum_index(S - 1, g), sizeof(float) * d);
      }
      sparq_lines.add(step1);
      sparq_lines.add(step5);
      const Replay sparq_replay = replay({&sparq_lines, &step1, &step5}, sparq_step);
      phases.push_back({d, S, step1.megabytes(), sparq_replay.us[1], step5.megabytes(), sparq_replay.us[2],
                        (sparq_replay.us[1] + sparq_replay.us[2]) / sparq_replay.step_us});
      rows.push_back(with_replay({d, S, "SparQ r=" + std::to_string(sr.r) + " k=" + std::to_string(sr.k), sparq_us,
                                  sr.kv_bytes},
                                 sparq_lines, sparq_replay));

      AttentionPolicy hip_policy;  // as served at 1/8: one mask per kv head, sink, window and mask_k from the ratio
      hip_policy.kind = policy_kind("hip");
      const ref::HipParams hp = hip::resolve(hip_policy, S);
      ref::HipMask mask;
      ref::HipBytes refresh_bytes, cached_bytes;
      const Timing refresh_us = time_us([&] {
        refresh_bytes = {};
        cpu::hip_estimate_mask(pool, kv, args, hp, &mask, &refresh_bytes);
        cpu::hip_sparse_decode(pool, kv, args, hp, mask, &refresh_bytes);
      });
      rows.push_back({d, S, "HiP refresh", refresh_us, refresh_bytes.total()});
      const std::function<void()> hip_cached_step = [&] {
        cached_bytes = {};
        cpu::hip_sparse_decode(pool, kv, args, hp, mask, &cached_bytes);
      };
      const Timing cached_us = time_us(hip_cached_step);
      bench::KvLines hip_lines(kv);  // the rows of the sink, the mask's blocks and the window
      for (int h = 0; h < H; h += hp.per_kv_head ? G : 1) {  // one mask per kv head, or per query head
        const int g = h / G;
        if (mask.dense) {
          for (int t = 0; t < S; ++t) hip_lines.add_kv_rows(g, t);
          continue;
        }
        for (int t = 0; t < std::min(hp.sink, S); ++t) hip_lines.add_kv_rows(g, t);
        for (int32_t b : mask.block_starts[h])
          for (int t = b; t < std::min(b + hp.block_size_k, S); ++t) hip_lines.add_kv_rows(g, t);
        for (int t = std::max(0, S - 1 - hp.window); t < S; ++t) hip_lines.add_kv_rows(g, t);
      }
      rows.push_back(
          with_replay({d, S, "HiP cached", cached_us, cached_bytes.total()}, hip_lines, replay({&hip_lines}, hip_cached_step)));

      std::vector<float> mass(S), weights;
      std::uniform_real_distribution<float> uni(0.0f, 1.0f);
      for (float& m : mass) m = uni(rng);
      cpu::SwaResult wr;
      const std::function<void()> swa_step = [&] {
        wr = cpu::swa_decode(pool, kv, args, ref::SwaParams{0.125f}, mass.data(), &weights);
      };
      const Timing swa_us = time_us(swa_step);
      std::vector<int32_t> kept;
      cpu::swa_decode(pool, kv, args, ref::SwaParams{0.125f}, mass.data(), nullptr, &kept);
      const int32_t older = S - wr.k_local;
      const bool streamed = cpu::sparse::run_streamable(cpu::sparse::kernels(), kv, older, S);
      bench::KvLines swa_lines(kv);  // the heavy hitters' rows and the local window (streamed or gathered)
      for (int g = 0; g < n_kv; ++g) {
        for (int32_t t : kept)
          if (t < older || !streamed) swa_lines.add_kv_rows(g, t);
        if (streamed) swa_lines.add_streamed(g, older, S);
      }
      rows.push_back(with_replay({d, S, "SWA 1/8", swa_us, wr.kv_bytes}, swa_lines, replay({&swa_lines}, swa_step)));
      for (size_t i = rows.size() - 5; i < rows.size(); ++i)
        std::fprintf(stderr, "d=%d S=%d %-22s median %10.1f us  best %10.1f us  cpu/thread %10.1f us  replay %8.1f us\n",
                     d, S, rows[i].policy.c_str(), rows[i].t.median_us, rows[i].t.best_us, rows[i].t.cpu_us,
                     rows[i].replay_us);
    }
  }

  const bool gbs_measured = gbs <= 0;
  if (gbs_measured) gbs = stream_gbs;
  std::ostringstream md;
  md << "# Sparse decode attention on the CPU (one decode step, one layer)\n\n"
     << "bench/bench_sparse_attention.cpp: f16 KV with transposed K and running V sums, " << n_kv << " kv heads x G = "
     << G << " query heads, block " << block_size << " (shuffled table), " << threads << " threads, SIMD " << cpu::simd_level()
     << ", " << cpu_model() << " (L3 " << (sysconf(_SC_LEVEL3_CACHE_SIZE) >> 20) << " MiB)"
     << ". Median of " << reps << " repetitions, "
     << (warm ? "no flush (--warm: the KV in cache). " : "a 1 GiB buffer streamed before each (KV read from memory, not the L3). ")
     << "Bound = KV bytes / " << std::setprecision(3) << gbs << " GB/s ("
     << (gbs_measured ? "the best of 7 streaming reads of 1 GiB in this run, by all " : "--bandwidth-gbs, read bandwidth at ") << threads
     << " threads). "
     << "The machine is shared with other builds: figures are medians, expect noise.\n\n"
     << "Wall: median and best (fastest) repetition. CPU: median process CPU time ÷ threads, what a step "
     << "costs when the threads are not preempted (includes the workers' spin while they wait); "
     << "% of bound and the CPU speed-up use it.\n\n"
     << "Replay: the step's distinct 64-byte lines (line MB: a half-read line counts whole) loaded by the same "
     << "threads in address order with software prefetches and no other work, from memory (bench/kv_lines.h): "
     << "the least time any kernel reading those lines takes here, whatever their pattern (scattered lines "
     << "come at the scattered-line rate). % of replay = replay µs / the step's CPU µs, both medians over the same "
     << "repetitions, which time the step and its replays one after the other (this host's speed drifts within a "
     << "run): how close the kernel comes to what its lines allow. "
     << "HiP refresh: not modelled.\n\n"
     << "| d | S | policy | wall median µs | wall best µs | CPU µs | KV MB read | bound µs | % of bound | line MB | replay µs | % of replay | speed-up (wall median) | speed-up (CPU) |\n"
     << "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  Timing dense{};
  for (const Row& r : rows) {
    if (r.policy == "dense") dense = r.t;
    const double bound = gbs > 0 ? static_cast<double>(r.bytes) / (gbs * 1e3) : 0;
    char replay[96] = "— | — | —";
    if (r.replay_us > 0)
      std::snprintf(replay, sizeof replay, "%.3f | %.1f | %.0f%%", r.line_mb, r.replay_us, 100.0 * r.replay_share);
    char line[400];
    std::snprintf(line, sizeof line, "| %d | %d | %s | %.1f | %.1f | %.1f | %.3f | %.1f | %.0f%% | %s | %.2fx | %.2fx |\n",
                  r.d, r.S, r.policy.c_str(), r.t.median_us, r.t.best_us, r.t.cpu_us, r.bytes / 1e6, bound,
                  gbs > 0 ? 100.0 * bound / r.t.cpu_us : 0.0, replay, dense.median_us / r.t.median_us,
                  dense.cpu_us / r.t.cpu_us);
    md << line;
  }
  md << "\nSparQ's lines by phase, each replayed alone (step 5 gathers rows that only step 1's ranked scores name, "
     << "so a kernel pays the two one after the other; their sum is SparQ's tighter bound):\n\n"
     << "| d | S | step-1 line MB | replay µs | step-5 line MB | replay µs | sum µs | % of sum |\n"
     << "|---|---|---:|---:|---:|---:|---:|---:|\n";
  for (const SparqPhases& p : phases) {
    char line[200];
    std::snprintf(line, sizeof line, "| %d | %d | %.3f | %.1f | %.3f | %.1f | %.1f | %.0f%% |\n", p.d, p.S,
                  p.step1_mb, p.step1_us, p.step5_mb, p.step5_us, p.step1_us + p.step5_us, 100.0 * p.share);
    md << line;
  }
  std::fputs(md.str().c_str(), stdout);
  std::ofstream(out_path) << md.str();
  return 0;
}
