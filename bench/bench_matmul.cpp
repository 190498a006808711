// bench_matmul [--quick] [--csv]
// Decode (M = 1): GB/s of weight bytes streamed, per format, precision and thread count, next
// to the machine's measured read bandwidth (the roofline: decode is bandwidth bound).
// The weights rotate over enough copies (>= 384 MB) that every call reads from DRAM, as in a
// real decode step over a whole model; "hot" repeats one copy (cache-resident for small
// matrices) for comparison.
// Prefill (M = 64): GFLOP/s (2 M N K per call) per format, precision and thread count.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/ref/dequant.h"

namespace {

using namespace fathom;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Random weights with sane f16 scales (every 2-byte field that could be a scale gets a small
// half value; quant bytes stay random). Only speed matters here.
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
    for (size_t b = 0; b < w.size(); b += ts) {
      if (t == GgmlType::Q6_K) std::memcpy(&w[b + 208], &s, 2);
      else std::memcpy(&w[b], &s, 2);
      if (t == GgmlType::Q4_1 || t == GgmlType::Q5_1 || t == GgmlType::Q4_K || t == GgmlType::Q5_K)
        std::memcpy(&w[b + 2], &s, 2);
    }
  }
  return w;
}

// Multi-threaded read bandwidth (GB/s) over `bytes`.
double read_bandwidth(ThreadPool& pool, size_t bytes) {
  std::vector<uint64_t> buf(bytes / 8, 1);
  std::vector<uint64_t> sums(pool.size(), 0);
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = Clock::now();
    pool.parallel_for(static_cast<int64_t>(buf.size()), [&](int64_t b, int64_t e, int t) {
      uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      for (int64_t i = b; i + 4 <= e; i += 4) {
        s0 += buf[i];
        s1 += buf[i + 1];
        s2 += buf[i + 2];
        s3 += buf[i + 3];
      }
      sums[t] += s0 + s1 + s2 + s3;
    }, 4096);
    best = std::max(best, bytes / seconds_since(t0) / 1e9);
  }
  return best;
}

struct Case {
  GgmlType type;
  int64_t N, K;
  const char* what;
};

bool g_csv = false;

void bench_decode(const Case& c, ThreadPool& pool, cpu::Precision p, std::mt19937& rng, double roof,
                  bool quick) {
  const size_t bytes = ggml_row_size(c.type, c.K) * c.N;
  const size_t target = quick ? (64u << 20) : (384u << 20);
  const int copies = static_cast<int>(std::max<size_t>(1, (target + bytes - 1) / bytes));
  std::vector<std::vector<uint8_t>> ws;
  ws.push_back(make_weights(c.type, c.N, c.K, rng));
  for (int i = 1; i < copies; ++i) ws.push_back(ws[0]);
  std::vector<float> x(c.K), y(c.N);
  for (auto& v : x) v = static_cast<float>(rng() % 2000) * 1e-3f - 1.0f;
  auto run = [&](bool rotate) {
    const int calls = rotate ? copies * (quick ? 2 : 4) : std::max(20, static_cast<int>((200u << 20) / bytes));
    cpu::matmul(pool, c.type, ws[0].data(), c.N, c.K, x.data(), 1, y.data(), p);  // warm-up
    const auto t0 = Clock::now();
    for (int i = 0; i < calls; ++i)
      cpu::matmul(pool, c.type, ws[rotate ? i % copies : 0].data(), c.N, c.K, x.data(), 1, y.data(), p);
    return static_cast<double>(bytes) * calls / seconds_since(t0) / 1e9;
  };
  const double cold = run(true), hot = run(false);
  const char* pn = p == cpu::Precision::kF32 ? "f32" : "q8";
  if (g_csv) {
    std::printf("decode,%s,%s,%lld,%lld,%d,%.2f,%.2f,%.2f\n", ggml_type_name(c.type), pn, static_cast<long long>(c.N),
                static_cast<long long>(c.K), pool.size(), cold, hot, roof);
  } else {
    std::printf("  %-5s %-4s %-16s thr %d  %6.2f GB/s (%3.0f%% of %5.1f)  hot %6.2f GB/s  %.2f ms/call\n",
                ggml_type_name(c.type), pn, c.what, pool.size(), cold, 100 * cold / roof, roof, hot,
                bytes / cold / 1e6);
  }
}

void bench_prefill(const Case& c, ThreadPool& pool, cpu::Precision p, std::mt19937& rng, int64_t M) {
  const auto w = make_weights(c.type, c.N, c.K, rng);
  std::vector<float> x(M * c.K), y(M * c.N);
  for (auto& v : x) v = static_cast<float>(rng() % 2000) * 1e-3f - 1.0f;
  cpu::matmul(pool, c.type, w.data(), c.N, c.K, x.data(), M, y.data(), p);
  int calls = 0;
  const auto t0 = Clock::now();
  do {
    cpu::matmul(pool, c.type, w.data(), c.N, c.K, x.data(), M, y.data(), p);
    ++calls;
  } while (seconds_since(t0) < 0.3);
  const double gflops = 2.0 * M * c.N * c.K * calls / seconds_since(t0) / 1e9;
  const char* pn = p == cpu::Precision::kF32 ? "f32" : "q8";
  if (g_csv) {
    std::printf("prefill,%s,%s,%lld,%lld,%d,%.2f,%lld\n", ggml_type_name(c.type), pn, static_cast<long long>(c.N),
                static_cast<long long>(c.K), pool.size(), gflops, static_cast<long long>(M));
  } else {
    std::printf("  %-5s %-4s %-16s thr %d  M=%lld  %7.1f GFLOP/s\n", ggml_type_name(c.type), pn, c.what,
                pool.size(), static_cast<long long>(M), gflops);
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  std::vector<std::string> only;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
    else if (std::strcmp(argv[i], "--csv") == 0) g_csv = true;
    else only.push_back(argv[i]);  // format names to run (default: all)
  }
  std::mt19937 rng(7);
  ThreadPool pool1(1), pool2(2);
  ThreadPool* pools[] = {&pool1, &pool2};
  const double roof[] = {read_bandwidth(pool1, 256u << 20), read_bandwidth(pool2, 256u << 20)};
  std::printf("# simd %s; read bandwidth %.1f GB/s (1 thread), %.1f GB/s (2 threads)\n", cpu::simd_level(), roof[0],
              roof[1]);
  const Case cases[] = {
      {GgmlType::Q4_1, 1536, 576, "1536x576 (ffn)"},  {GgmlType::Q8_0, 49152, 576, "49152x576 (emb)"},
      {GgmlType::Q5_0, 2048, 640, "2048x640 (ffn)"},  {GgmlType::Q4_K, 640, 2048, "640x2048 (down)"},
      {GgmlType::Q6_K, 640, 2048, "640x2048 (down)"}, {GgmlType::F32, 1536, 576, "1536x576"},
      {GgmlType::F16, 1536, 576, "1536x576"},         {GgmlType::BF16, 1536, 576, "1536x576"},
      {GgmlType::Q4_0, 1536, 576, "1536x576"},        {GgmlType::Q5_1, 1536, 576, "1536x576"},
      {GgmlType::Q8_0, 1536, 576, "1536x576"},        {GgmlType::Q5_K, 640, 2048, "640x2048"},
  };
  auto selected = [&](const Case& c) {
    return only.empty() || std::find(only.begin(), only.end(), ggml_type_name(c.type)) != only.end();
  };
  if (g_csv) std::printf("kind,type,precision,N,K,threads,cold_GBps,hot_GBps,roof_GBps|GFLOPs,M\n");
  else std::printf("decode (M=1), weight bytes streamed from DRAM:\n");
  for (const Case& c : cases) {
    if (!selected(c)) continue;
    for (int t = 0; t < 2; ++t)
      for (cpu::Precision p : {cpu::Precision::kF32, cpu::Precision::kQ8}) {
        if ((c.type == GgmlType::F32 || c.type == GgmlType::F16 || c.type == GgmlType::BF16) && p == cpu::Precision::kQ8)
          continue;
        bench_decode(c, *pools[t], p, rng, roof[t], quick);
      }
  }
  if (!g_csv) std::printf("prefill (M=64):\n");
  for (const Case& c : cases) {
    if (!selected(c) || c.N > 8192) continue;
    for (int t = 0; t < 2; ++t)
      for (cpu::Precision p : {cpu::Precision::kF32, cpu::Precision::kQ8}) {
        if ((c.type == GgmlType::F32 || c.type == GgmlType::F16 || c.type == GgmlType::BF16) && p == cpu::Precision::kQ8)
          continue;
        bench_prefill(c, *pools[t], p, rng, 64);
      }
  }
  return 0;
}
