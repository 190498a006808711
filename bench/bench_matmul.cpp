// bench_matmul [--quick] [--csv] [--batch [--rows-per-call 4,8] [--prefetch-bytes 0,8192]] [FORMAT...]
// Decode (M = 1): GB/s of weight bytes streamed per format, precision and thread count, next
// to the machine's measured read bandwidth (the roofline: decode is bandwidth bound).
// The weights rotate over enough copies (>= 384 MB, past the L3) that every call reads from
// DRAM, as a decode step over a whole model does; "hot" repeats one copy (cache-resident for
// small matrices) for comparison.
// Prefill (M = 64): GFLOP/s (2 M N K per call) per format, precision and thread count.
// --batch: batched decode (M = 1..16 activation rows, the server's continuous batching) over the
// 1B shape's matrices from DRAM, kQ8 on the packed panels: time per call, GOP/s (2 M N K) and the
// fraction of the machine's int8 peak, measured here with a loop of independent VNNI dot products.
// --rows-per-call 4,8 (with --batch): the packed kernels' activation rows per call, each setting's
// calls alternating with the others' (0: the kernel table's own).
// --prefetch-bytes 0,8192 (with --batch): the packed kernels' software prefetch distance, the
// settings alternating call by call in the same way (0: the kernels' own). With both lists, the
// i-th setting takes the i-th entry of each (a shorter list repeats its last entry).
//
// Every call is timed on its own. On a shared machine other processes steal the cores now
// and then, so each figure is printed twice: at the median call and at the best call (p5,
// the 5th percentile of call times: the speed when the kernel had the cores to itself).
// The roofline is measured the same way (4 MB chunks).
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/amx.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/ref/dequant.h"

namespace {

using namespace fathom;
using Clock = std::chrono::steady_clock;

struct Rate {
  double median = 0, best = 0;  // units per second
};

// Times `calls` invocations of body(i) one by one; rate = units_per_call / call time.
template <typename Body>
Rate time_calls(int calls, double units_per_call, Body body) {
  std::vector<double> t(calls);
  for (int i = 0; i < calls; ++i) {
    const auto t0 = Clock::now();
    body(i);
    t[i] = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  std::sort(t.begin(), t.end());
  return {units_per_call / t[calls / 2], units_per_call / t[calls / 20]};
}

// Random weights with small f16 scales (every scale field; quant bytes stay random).
// Only speed matters here.
std::vector<uint8_t> make_weights(GgmlType t, int64_t N, int64_t K, std::mt19937& rng) {
  std::vector<uint8_t> w(ggml_row_size(t, K) * N);
  for (auto& b : w) b = static_cast<uint8_t>(rng());
  if (t == GgmlType::F32) {
    float* f = reinterpret_cast<float*>(w.data());
    for (size_t i = 0; i < w.size() / 4; ++i) f[i] = static_cast<float>(rng() % 1000) * 1e-3f;
  } else if (t == GgmlType::F16 || t == GgmlType::BF16) {
    uint16_t* h = reinterpret_cast<uint16_t*>(w.data());
    for (size_t i = 0; i < w.size() / 2; ++i) h[i] = t == GgmlType::F16 ? 0x2E66 : 0x3DCC;
  } else {
    const int64_t ts = ggml_info(t).type_size;
    const uint16_t s = ref::fp32_to_fp16(0.01f);
    // Byte offset of the block's (first) f16 scale; a second one follows it where listed.
    const size_t d_at = t == GgmlType::Q6_K ? 208 : t == GgmlType::Q3_K ? 108 : t == GgmlType::Q2_K ? 80 : 0;
    const bool two = t == GgmlType::Q4_1 || t == GgmlType::Q5_1 || t == GgmlType::Q4_K || t == GgmlType::Q5_K ||
                     t == GgmlType::Q2_K;
    for (size_t b = 0; b < w.size(); b += ts) {
      std::memcpy(&w[b + d_at], &s, 2);
      if (two) std::memcpy(&w[b + d_at + 2], &s, 2);
    }
  }
  return w;
}

// Read bandwidth (GB/s) over a 256 MB buffer in 4 MB chunks split over the pool's threads.
Rate read_bandwidth(ThreadPool& pool) {
  const size_t chunk = (4u << 20) / 8, chunks = 64;
  std::vector<uint64_t> buf(chunk * chunks, 1);
  std::vector<uint64_t> sums(pool.size(), 0);
  return time_calls(static_cast<int>(chunks * 4), chunk * 8 / 1e9, [&](int c) {
    const uint64_t* base = buf.data() + (c % chunks) * chunk;
    pool.parallel_for(static_cast<int64_t>(chunk), [&](int64_t b, int64_t e, int t) {
      uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      for (int64_t i = b; i + 4 <= e; i += 4) {
        s0 += base[i];
        s1 += base[i + 1];
        s2 += base[i + 2];
        s3 += base[i + 3];
      }
      sums[t] += s0 + s1 + s2 + s3;
    }, 4096);
  });
}

struct Case {
  GgmlType type;
  int64_t N, K;
  const char* what;
};

bool g_csv = false;
// The variants timed: f32, q8 over the stored layout, q8 over PackedWeights panels ("q8p").
struct Variant {
  cpu::Precision precision;
  bool packed;
};
const char* variant_name(const Variant& v) { return v.precision == cpu::Precision::kF32 ? "f32" : v.packed ? "q8p" : "q8"; }

// The packed copy of w when v asks for it (null otherwise).
std::unique_ptr<cpu::PackedWeights> pack_if(const Variant& v, const Case& c, const std::vector<uint8_t>& w) {
  if (!v.packed) return nullptr;
  return std::make_unique<cpu::PackedWeights>(c.type, w.data(), c.N, c.K);
}

void bench_decode(const Case& c, ThreadPool& pool, const Variant& v, std::mt19937& rng, const Rate& roof,
                  bool quick) {
  const cpu::Precision p = v.precision;
  const size_t bytes = ggml_row_size(c.type, c.K) * c.N;
  const size_t target = quick ? (128u << 20) : (384u << 20);
  const int copies = static_cast<int>(std::max<size_t>(1, (target + bytes - 1) / bytes));
  std::vector<std::vector<uint8_t>> ws;
  ws.push_back(make_weights(c.type, c.N, c.K, rng));
  for (int i = 1; i < copies; ++i) ws.push_back(ws[0]);
  std::vector<std::unique_ptr<cpu::PackedWeights>> packs;
  for (const auto& w : ws) packs.push_back(pack_if(v, c, w));
  std::vector<float> x(c.K), y(c.N);
  for (auto& v : x) v = static_cast<float>(rng() % 2000) * 1e-3f - 1.0f;
  auto run = [&](bool rotate) {
    const int calls = std::max(rotate ? copies * (quick ? 1 : 2) : 0, 40);
    cpu::matmul(pool, c.type, ws[0].data(), c.N, c.K, x.data(), 1, y.data(), p, packs[0].get());  // warm-up
    return time_calls(calls, bytes / 1e9, [&](int i) {
      const int k = rotate ? i % copies : 0;
      cpu::matmul(pool, c.type, ws[k].data(), c.N, c.K, x.data(), 1, y.data(), p, packs[k].get());
    });
  };
  const Rate cold = run(true), hot = run(false);
  if (g_csv) {
    std::printf("decode,%s,%s,%lld,%lld,%d,%.2f,%.2f,%.2f,%.2f,%.2f,%.2f\n", ggml_type_name(c.type),
                variant_name(v), static_cast<long long>(c.N), static_cast<long long>(c.K), pool.size(),
                cold.median, cold.best, hot.median, hot.best, roof.median, roof.best);
  } else {
    std::printf("  %-5s %-3s %-16s thr %d | median %6.2f GB/s (%3.0f%% of %4.1f) | best %6.2f GB/s (%3.0f%% of %4.1f)"
                " | hot %6.2f / %6.2f\n",
                ggml_type_name(c.type), variant_name(v), c.what, pool.size(), cold.median,
                100 * cold.median / roof.median, roof.median, cold.best, 100 * cold.best / roof.best, roof.best,
                hot.median, hot.best);
  }
}

void bench_prefill(const Case& c, ThreadPool& pool, const Variant& v, std::mt19937& rng, int64_t M) {
  const cpu::Precision p = v.precision;
  const auto w = make_weights(c.type, c.N, c.K, rng);
  const auto packed = pack_if(v, c, w);
  std::vector<float> x(M * c.K), y(M * c.N);
  for (auto& v : x) v = static_cast<float>(rng() % 2000) * 1e-3f - 1.0f;
  cpu::matmul(pool, c.type, w.data(), c.N, c.K, x.data(), M, y.data(), p, packed.get());
  const Rate r = time_calls(30, 2.0 * M * c.N * c.K / 1e9, [&](int) {
    cpu::matmul(pool, c.type, w.data(), c.N, c.K, x.data(), M, y.data(), p, packed.get());
  });
  if (g_csv) {
    std::printf("prefill,%s,%s,%lld,%lld,%d,%.2f,%.2f,%lld\n", ggml_type_name(c.type), variant_name(v),
                static_cast<long long>(c.N), static_cast<long long>(c.K), pool.size(), r.median, r.best,
                static_cast<long long>(M));
  } else {
    std::printf("  %-5s %-3s %-16s thr %d  M=%lld | median %7.1f GFLOP/s | best %7.1f GFLOP/s\n",
                ggml_type_name(c.type), variant_name(v), c.what, pool.size(), static_cast<long long>(M), r.median,
                r.best);
  }
}

// The int8 multiply-accumulate peak of `threads` threads in GOP/s (2 ops per byte product):
// 12 independent dependency chains, enough to hide the instruction's latency at its throughput,
// of 512-bit VNNI dot products (64 products each) where the CPU has AVX-512 VNNI, else of AVX2
// maddubs (32 products each), the multiply the AVX2 kernels are built on. The chains are 12 named
// registers, not an array: an array's elements went through the stack (a load and a store per
// instruction, so the loop timed the store port, about half the peak), and an AVX2 maddubs of
// two constants was hoisted out of the loop altogether (a loop of 16-bit adds).
#define FATHOM_TWELVE(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
// GCC 12 reports _mm512_undefined_* inside intrinsics as uninitialized (a known false positive).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
__attribute__((target("avx512f,avx512vnni"))) uint64_t vnni_loop(int64_t iters) {
  const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(5);
#define FATHOM_DECL(i) __m512i c##i = _mm512_set1_epi32(i);
#define FATHOM_STEP(i) c##i = _mm512_dpbusd_epi32(c##i, a, b);
#define FATHOM_KEEP(i) __asm__ volatile("" : "+v"(c##i));
#define FATHOM_SUM(i) s = _mm512_add_epi32(s, c##i);
  FATHOM_TWELVE(FATHOM_DECL)
  for (int64_t it = 0; it < iters; ++it) {
    FATHOM_TWELVE(FATHOM_STEP)
    FATHOM_TWELVE(FATHOM_KEEP)
  }
  __m512i s = _mm512_setzero_si512();
  FATHOM_TWELVE(FATHOM_SUM)
#undef FATHOM_DECL
#undef FATHOM_STEP
#undef FATHOM_KEEP
#undef FATHOM_SUM
  return static_cast<uint64_t>(_mm512_reduce_add_epi32(s));
}
#pragma GCC diagnostic pop

// Each chain feeds its maddubs result back in as the next unsigned operand (the values saturate;
// only the timing matters), so the compiler can neither hoist nor merge the multiplies.
__attribute__((target("avx2"))) uint64_t maddubs_loop(int64_t iters) {
  const __m256i b = _mm256_set1_epi8(5);
#define FATHOM_DECL(i) __m256i c##i = _mm256_set1_epi8(static_cast<char>(i + 1));
#define FATHOM_STEP(i) c##i = _mm256_maddubs_epi16(c##i, b);
#define FATHOM_KEEP(i) __asm__ volatile("" : "+x"(c##i));
#define FATHOM_SUM(i) s = _mm256_add_epi16(s, c##i);
  FATHOM_TWELVE(FATHOM_DECL)
  for (int64_t it = 0; it < iters; ++it) {
    FATHOM_TWELVE(FATHOM_STEP)
    FATHOM_TWELVE(FATHOM_KEEP)
  }
  __m256i s = _mm256_setzero_si256();
  FATHOM_TWELVE(FATHOM_SUM)
#undef FATHOM_DECL
#undef FATHOM_STEP
#undef FATHOM_KEEP
#undef FATHOM_SUM
  return static_cast<uint64_t>(_mm256_extract_epi16(s, 0));
}
#undef FATHOM_TWELVE

// The AMX-INT8 peak: 4 independent full-size tile products (C[16][16] int32 += A[16][64] ·
// B[16][64], 16384 products each) over the same operand tiles, so that only the tile multiplier
// is timed. Needs cpu::amx_int8_usable() (the OS's permission).
__attribute__((target("amx-tile,amx-int8"))) uint64_t amx_loop(int64_t iters) {
  cpu::AmxTileConfig cfg;
  for (int t = 0; t < 8; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  alignas(64) static thread_local int8_t ops[16 * 64];
  alignas(64) static thread_local int32_t out[16 * 16];
  for (int i = 0; i < 16 * 64; ++i) ops[i] = static_cast<int8_t>(i % 7);
  _tile_loadconfig(&cfg);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, ops, 64);
  _tile_loadd(5, ops, 64);
  _tile_loadd(6, ops, 64);
  _tile_loadd(7, ops, 64);
  for (int64_t it = 0; it < iters; ++it) {
    _tile_dpbusd(0, 4, 6);
    _tile_dpbusd(1, 4, 7);
    _tile_dpbusd(2, 5, 6);
    _tile_dpbusd(3, 5, 7);
  }
  _tile_stored(0, out, 64);
  _tile_release();
  return static_cast<uint64_t>(out[0]);
}

struct Peak {
  Rate rate;
  const char* what = "none";
};

Peak amx_int8_peak(ThreadPool& pool) {
  if (!cpu::amx_int8_usable()) return {};
  const int64_t iters = 50000;
  std::vector<uint64_t> sink(pool.size());
  const double ops = 2.0 * 16384 * 4 * static_cast<double>(iters) * pool.size();
  const Rate r = time_calls(15, ops / 1e9, [&](int) {
    pool.parallel_for(pool.size(), [&](int64_t b, int64_t e, int t) {
      for (int64_t i = b; i < e; ++i) sink[t] += amx_loop(iters);
    }, 1);
  });
  return {r, "AMX-INT8 tiles"};
}

Peak int8_peak(ThreadPool& pool) {
  __builtin_cpu_init();
  const bool vnni = __builtin_cpu_supports("avx512vnni");
  if (!vnni && !__builtin_cpu_supports("avx2")) return {};
  const int64_t iters = 200000;
  std::vector<uint64_t> sink(pool.size());
  const double ops = 2.0 * (vnni ? 64 : 32) * 12 * static_cast<double>(iters) * pool.size();
  const Rate r = time_calls(15, ops / 1e9, [&](int) {
    pool.parallel_for(pool.size(), [&](int64_t b, int64_t e, int t) {
      for (int64_t i = b; i < e; ++i) sink[t] += vnni ? vnni_loop(iters) : maddubs_loop(iters);
    }, 1);
  });
  return {r, vnni ? "512-bit VNNI" : "AVX2 maddubs"};
}

// Batched decode of one matrix: M activation rows against weights from DRAM (rotating copies, as
// bench_decode), kQ8 over the packed panels when this machine packs the format. With several
// `rows_per_call` settings (--rows-per-call; 0 = the kernel table's own), their calls alternate
// one by one, so that a noisy neighbour slows them alike.
void bench_batch(const Case& c, ThreadPool& pool, std::mt19937& rng, const Rate& peak, const std::vector<int>& rows_per_call,
                 const std::vector<int>& prefetch) {
  const size_t bytes = ggml_row_size(c.type, c.K) * c.N;
  const int copies = static_cast<int>(std::max<size_t>(1, ((384u << 20) + bytes - 1) / bytes));
  std::vector<std::vector<uint8_t>> ws;
  ws.push_back(make_weights(c.type, c.N, c.K, rng));
  for (int i = 1; i < copies; ++i) ws.push_back(ws[0]);
  const bool pack = cpu::PackedWeights::supported(c.type);
  std::vector<std::unique_ptr<cpu::PackedWeights>> packs;
  for (const auto& w : ws) packs.push_back(pack ? std::make_unique<cpu::PackedWeights>(c.type, w.data(), c.N, c.K) : nullptr);
  const size_t nv = std::max(rows_per_call.size(), prefetch.size());
  auto rows_of = [&](size_t v) { return v < rows_per_call.size() ? rows_per_call[v] : rows_per_call.back(); };
  auto prefetch_of = [&](size_t v) { return v < prefetch.size() ? prefetch[v] : prefetch.back(); };
  const bool rows_set = rows_per_call.size() > 1 || rows_per_call[0] != 0, prefetch_set = prefetch.size() > 1 || prefetch[0] != 0;
  std::vector<double> t1(nv, 0);
  for (int64_t M : {1, 2, 4, 8, 16, 64}) {
    std::vector<float> x(M * c.K), y(M * c.N);
    for (auto& v : x) v = static_cast<float>(rng() % 2000) * 1e-3f - 1.0f;
    cpu::matmul(pool, c.type, ws[0].data(), c.N, c.K, x.data(), M, y.data(), cpu::Precision::kQ8, packs[0].get());
    const int calls = std::max(2 * copies, 40);
    std::vector<std::vector<double>> t(nv, std::vector<double>(calls));
    for (int i = 0; i < calls; ++i)
      for (size_t v = 0; v < nv; ++v) {
        cpu::set_packed_rows_per_call_for_testing(rows_of(v));
        cpu::set_packed_prefetch_bytes_for_testing(prefetch_of(v));
        const int k = (i * static_cast<int>(nv) + static_cast<int>(v)) % copies;
        const auto t0 = Clock::now();
        cpu::matmul(pool, c.type, ws[k].data(), c.N, c.K, x.data(), M, y.data(), cpu::Precision::kQ8, packs[k].get());
        t[v][i] = std::chrono::duration<double>(Clock::now() - t0).count();
      }
    cpu::set_packed_rows_per_call_for_testing(0);
    cpu::set_packed_prefetch_bytes_for_testing(0);
    for (size_t v = 0; v < nv; ++v) {
      std::sort(t[v].begin(), t[v].end());
      const double gop = 2.0 * M * c.N * c.K / 1e9;
      const Rate r{gop / t[v][calls / 2], gop / t[v][calls / 20]};
      const double us = t[v][calls / 2] * 1e6;
      if (M == 1) t1[v] = us;
      char label[64] = "";  // the settings given on the command line
      const int at = rows_set ? std::snprintf(label, sizeof label, " rows/call %d", rows_of(v)) : 0;
      if (prefetch_set) std::snprintf(label + at, sizeof label - at, " prefetch %d", prefetch_of(v));
      if (g_csv) {
        std::printf("batch,%s,%s,%lld,%lld,%d,%lld,%d,%d,%.1f,%.1f,%.1f,%.1f\n", ggml_type_name(c.type), pack ? "q8p" : "q8",
                    static_cast<long long>(c.N), static_cast<long long>(c.K), pool.size(), static_cast<long long>(M),
                    rows_of(v), prefetch_of(v), us, r.median, r.best, peak.best);
      } else {
        std::printf("  %-5s %-3s %-16s thr %d M=%2lld%s | %8.1f us (%4.2fx M=1) | median %6.1f GOP/s | best %6.1f GOP/s"
                    " (%3.0f%% of int8 peak %.0f)\n",
                    ggml_type_name(c.type), pack ? "q8p" : "q8", c.what, pool.size(), static_cast<long long>(M), label, us,
                    us / t1[v], r.median, r.best, peak.best > 0 ? 100 * r.best / peak.best : 0.0, peak.best);
      }
    }
  }
}

// "4,8" -> {4, 8}.
std::vector<int> parse_ints(const char* s) {
  std::vector<int> v;
  for (const char* p = s; *p;) {
    char* end;
    v.push_back(static_cast<int>(std::strtol(p, &end, 10)));
    p = *end == ',' ? end + 1 : end + std::strlen(end);
  }
  return v;
}

bool is_float(GgmlType t) { return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16; }

// f32 always; q8 for quantized formats; q8p where this machine has a packed kernel.
std::vector<Variant> variants(GgmlType t) {
  std::vector<Variant> v{{cpu::Precision::kF32, false}};
  if (!is_float(t)) v.push_back({cpu::Precision::kQ8, false});
  if (cpu::PackedWeights::supported(t)) v.push_back({cpu::Precision::kQ8, true});
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, batch = false;
  std::vector<int> rows_per_call{0}, prefetch{0};
  std::vector<std::string> only;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
    else if (std::strcmp(argv[i], "--csv") == 0) g_csv = true;
    else if (std::strcmp(argv[i], "--batch") == 0) batch = true;
    else if (std::strcmp(argv[i], "--rows-per-call") == 0 && i + 1 < argc) rows_per_call = parse_ints(argv[++i]);
    else if (std::strcmp(argv[i], "--prefetch-bytes") == 0 && i + 1 < argc) prefetch = parse_ints(argv[++i]);
    else only.push_back(argv[i]);  // format names to run (default: all)
  }
  if (rows_per_call.empty() || prefetch.empty()) {
    std::fprintf(stderr, "bench_matmul: --rows-per-call and --prefetch-bytes need at least one number\n");
    return 2;
  }
  std::mt19937 rng(7);
  ThreadPool pool1(1), pool2(2);
  ThreadPool* pools[] = {&pool1, &pool2};
  const Rate roof[] = {read_bandwidth(pool1), read_bandwidth(pool2)};
  std::printf("# simd %s; read bandwidth median/best %.1f/%.1f GB/s (1 thread), %.1f/%.1f GB/s (2 threads)\n",
              cpu::simd_level(), roof[0].median, roof[0].best, roof[1].median, roof[1].best);
  const Case cases[] = {
      {GgmlType::Q4_1, 1536, 576, "1536x576 (ffn)"},  {GgmlType::Q8_0, 49152, 576, "49152x576 (emb)"},
      {GgmlType::Q5_0, 2048, 640, "2048x640 (ffn)"},  {GgmlType::Q4_K, 640, 2048, "640x2048 (down)"},
      {GgmlType::Q6_K, 640, 2048, "640x2048 (down)"}, {GgmlType::F32, 1536, 576, "1536x576"},
      {GgmlType::F16, 1536, 576, "1536x576"},         {GgmlType::BF16, 1536, 576, "1536x576"},
      {GgmlType::Q4_0, 1536, 576, "1536x576"},        {GgmlType::Q5_1, 1536, 576, "1536x576"},
      {GgmlType::Q8_0, 1536, 576, "1536x576"},        {GgmlType::Q5_K, 640, 2048, "640x2048"},
      // A 1B-class FFN matrix (Llama 3.2 1B: gate/up 8192x2048) in the formats of downloaded
      // low-bit GGUFs, Q4_K beside them.
      {GgmlType::Q4_K, 8192, 2048, "8192x2048 (1B)"}, {GgmlType::Q3_K, 8192, 2048, "8192x2048 (1B)"},
      {GgmlType::IQ4_XS, 8192, 2048, "8192x2048 (1B)"}, {GgmlType::Q2_K, 8192, 2048, "8192x2048 (1B)"},
      {GgmlType::IQ4_NL, 8192, 2048, "8192x2048 (1B)"},
  };
  auto selected = [&](const Case& c) {
    return only.empty() || std::find(only.begin(), only.end(), ggml_type_name(c.type)) != only.end();
  };
  if (batch) {
    if (g_csv) std::printf("# batch,type,precision,N,K,threads,M,rows_per_call,prefetch_bytes,us_median,GOPs_median,GOPs_best,int8_peak_best\n");
    const Peak p = int8_peak(pool2);
    const Rate peak = p.rate;
    std::printf("# simd %s; int8 peak (2 threads, %s): median %.0f / best %.0f GOP/s\n", cpu::simd_level(), p.what,
                peak.median, peak.best);
    const Peak amx = amx_int8_peak(pool2);
    if (amx.rate.best > 0)
      std::printf("# AMX-INT8 peak (2 threads, %s): median %.0f / best %.0f GOP/s; batched Q4_K / Q6_K matmuls: amx %s\n",
                  amx.what, amx.rate.median, amx.rate.best, cpu::amx_matmul());
    const Case shapes[] = {{GgmlType::Q4_K, 8192, 2048, "8192x2048 (gate)"}, {GgmlType::Q6_K, 2048, 8192, "2048x8192 (down)"},
                           {GgmlType::Q4_K, 2048, 8192, "2048x8192 (down)"}, {GgmlType::Q8_0, 8192, 2048, "8192x2048"},
                           {GgmlType::Q6_K, 16384, 2048, "16384x2048 (emb)"}};
    for (const Case& c : shapes)
      if (selected(c)) bench_batch(c, pool2, rng, peak, rows_per_call, prefetch);
    return 0;
  }
  if (g_csv)
    std::printf("# decode,type,precision,N,K,threads,GBps_median,GBps_best,hot_median,hot_best,roof_median,roof_best\n"
                "# prefill,type,precision,N,K,threads,GFLOPs_median,GFLOPs_best,M\n");
  else
    std::printf("decode (M=1), weight bytes streamed from DRAM (%% of the read bandwidth):\n");
  for (const Case& c : cases) {
    if (!selected(c)) continue;
    for (int t = 0; t < 2; ++t)
      for (const Variant& v : variants(c.type)) bench_decode(c, *pools[t], v, rng, roof[t], quick);
  }
  if (!g_csv) std::printf("prefill (M=64):\n");
  for (const Case& c : cases) {
    if (!selected(c) || c.N > 8192) continue;
    for (int t = 0; t < 2; ++t)
      for (const Variant& v : variants(c.type)) bench_prefill(c, *pools[t], v, rng, 64);
  }
  return 0;
}
