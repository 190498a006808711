// SparQ step 1 alone (sparse::Kernels::sparq_scores): the r selected dimension rows of every
// transposed-K tile of one kv head, G query rows, scores and their group sum, on one thread. Per
// 16-key tile, best of --reps passes of 20 calls, with the tiles in the caches (the same call
// repeated: at 1,000 keys 125 KiB of f16 Kᵀ at d 64, in the L2) and from memory (a 64 MiB buffer read
// between calls). The kernel's own cost, apart from the threads and the rest of the step.
//   bench_sparq_scores [--keys 1000,16000] [--reps 50] [--out FILE]   (FATHOM_SIMD caps the ISA)
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/cli.h"
#include "bench/huge_kv.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/sparse_common.h"

namespace fathom {
namespace {

constexpr int32_t kHeadDim = 64, kG = 3, kR = 8, kCalls = 20;
std::atomic<uint64_t> g_sink{0};  // keeps the flush reads
constexpr size_t kFlushWords = size_t{8} << 20;  // 64 MiB, twice a 32 MiB L3


}  // namespace
}  // namespace fathom

int main(int argc, char** argv) {
  using namespace fathom;
  std::vector<int64_t> keys = {1000, 16000};  // not powers of two: score rows S floats apart would 4 KiB-alias
  int reps = 50;
  std::string out_path;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--keys") {
      try {
        keys = bench::parse_int_list(argv[i + 1], "--keys", 16, 1 << 24);
      } catch (const std::invalid_argument& e) {
        std::fprintf(stderr, "bench_sparq_scores: %s\n", e.what());
        return 2;
      }
    }
    else if (a == "--reps") reps = std::atoi(argv[i + 1]);
    else if (a == "--out") out_path = argv[i + 1];
    else {
      std::fprintf(stderr, "bench_sparq_scores: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  const cpu::sparse::Kernels& kern = cpu::sparse::kernels();
  const std::vector<int32_t> dims = {3, 9, 17, 22, 40, 41, 50, 63};  // spread over the tile's lines
  const std::vector<float> qr(kG * kR, 0.5f);
  std::vector<uint64_t> flush(kFlushWords, 1);
  std::ostringstream md;
  md << "| keys | where | ns per 16-key tile |\n|---:|---|---:|\n";
  for (int64_t S64 : keys) {
    const int32_t S = static_cast<int32_t>(S64), blocks = (S + 15) / 16;
    std::mt19937 rng(1);
    const testing::PagedKvFixture f = testing::make_paged_kv(kHeadDim, 1, 16, KvDtype::kF16, S, 0, rng);
    const HugeKv huge(f);
    std::vector<float> scores(static_cast<size_t>(kG) * S), sum(S);
    for (bool from_memory : {false, true}) {
      double best = 1e30;
      for (int rep = 0; rep < reps; ++rep) {
        double ns = 0;
        for (int c = 0; c < kCalls; ++c) {
          if (from_memory) {
            uint64_t s = 0;
            for (size_t w = 0; w < kFlushWords; w += 8) s += flush[w];
            g_sink.fetch_add(s, std::memory_order_relaxed);
          }
          const auto t0 = std::chrono::steady_clock::now();
          kern.sparq_scores(huge.view, 0, dims.data(), kR, qr.data(), kG, 0, blocks, S, scores.data(), S, sum.data());
          ns += std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
        }
        best = std::min(best, ns / kCalls / blocks);
      }
      const char* where = from_memory ? "memory" : "cache";
      std::printf("keys %6d  %-6s  %6.1f ns per tile\n", S, where, best);
      char row[96];
      std::snprintf(row, sizeof row, "| %d | %s | %.1f |\n", S, where, best);
      md << row;
    }
  }
  if (!out_path.empty()) {
    std::ofstream o(out_path);
    o << "# SparQ step 1 per tile (bench/bench_sparq_scores.cpp)\n\nSIMD " << cpu::simd_level() << ", d " << kHeadDim
      << ", r " << kR << ", G " << kG << ", f16 Kᵀ, one thread, best of " << reps << " passes.\n\n"
      << md.str();
  }
  return 0;
}
