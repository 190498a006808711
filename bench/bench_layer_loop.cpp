// One decode step per layer over several layers' KV, as a served step walks the layers, per
// attention policy: each layer's KV has left the caches by the time its next step reads it (8
// layers of 16k keys at d 64 with 3 kv heads: ~150 MB of K, V and Kᵀ, past a 32 MiB L3), and
// nothing else runs between the layers (no weights). µs per layer-step and the GB/s of the bytes
// the kernels count; best of 15 passes of 10 steps. SmolLM2's attention shape: d 64, 3 kv heads,
// 3 query heads each, f16 KV with transposed K, 2 threads, kv_read_ratio 1/8. SWA selects from a
// mass constant over runs of 7 positions (its pooled heavy hitters come in runs); HiP re-estimates
// each layer's mask every 4 steps, the layers taking turns, as served.
//   bench_layer_loop [--keys 16000] [--layers 8] [--block-size 16] [--policies dense,sparq,hip,swa]
//                    [--head-dim 64] [--kv-heads 3] [--group 3]   (Gemma 3's global layers: 256, 1, 4)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/attention/policies/hip.h"
#include "bench/cli.h"
#include "bench/huge_kv.h"
#include "engine/attention/policy.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/sparse_attention.h"

int main(int argc, char** argv) {
  using namespace fathom;
  int32_t S = 16000, layers = 8, block_size = 16, d = 64, n_kv = 3, G = 3;
  std::string policies = "dense,sparq,hip,swa";
  for (int i = 1; i < argc; i += 2) {
    const std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "bench_layer_loop: %s needs a value\n", a.c_str());
      return 2;
    }
    if (a == "--keys") S = std::atoi(argv[i + 1]);
    else if (a == "--head-dim") d = std::atoi(argv[i + 1]);
    else if (a == "--kv-heads") n_kv = std::atoi(argv[i + 1]);
    else if (a == "--group") G = std::atoi(argv[i + 1]);
    else if (a == "--layers") layers = std::atoi(argv[i + 1]);
    else if (a == "--block-size") block_size = std::atoi(argv[i + 1]);
    else if (a == "--policies") policies = argv[i + 1];
    else {
      std::fprintf(stderr, "bench_layer_loop: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (S < 1024 || layers < 1 || block_size < 1 || d < 16 || d % 16 != 0 || n_kv < 1 || G < 1 || G > 64) {
    std::fprintf(stderr, "bench_layer_loop: need --keys >= 1024, --layers >= 1, --block-size >= 1, --head-dim a "
                         "multiple of 16, --kv-heads >= 1, --group 1-64\n");
    return 2;
  }
  const int32_t H = n_kv * G;
  constexpr float kRatio = 0.125f;
  std::mt19937 rng(1);
  std::vector<testing::PagedKvFixture> fixtures;
  std::vector<std::unique_ptr<HugeKv>> kv;  // views into the fixtures' block tables: keep both
  for (int32_t l = 0; l < layers; ++l) fixtures.push_back(testing::make_paged_kv(d, n_kv, block_size, KvDtype::kF16, S, 0, rng));
  for (const testing::PagedKvFixture& f : fixtures) kv.push_back(std::make_unique<HugeKv>(f));
  std::vector<float> q(static_cast<size_t>(H) * d), out(q.size()), weights, mass(S);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& x : q) x = normal(rng);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  for (int32_t t = 0; t < S; t += 7) std::fill(mass.begin() + t, mass.begin() + std::min(S, t + 7), uniform(rng));
  ThreadPool pool(2);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const DecodeArgs args{q.data(), out.data(), H, S - 1, scale};
  AttentionPolicy hip_policy;
  hip_policy.kind = policy_kind("hip");
  hip_policy.kv_read_ratio = kRatio;
  const ref::HipParams hip = hip::resolve(hip_policy, S);
  std::vector<ref::HipMask> masks(layers);
  std::vector<bool> has_mask(layers, false);
  std::printf("bench_layer_loop: %d keys, %d layers, block %d, d %d, %d kv heads x %d, f16, 2 threads, 1/8\n", S, layers,
              block_size, d, n_kv, G);

  for (const std::string& policy : bench::split_list(policies)) {
    int64_t bytes = 0, step = 0;
    auto layer_step = [&](int32_t l) {
      const PagedKvView& v = kv[l]->view;
      if (policy == "dense") {
        cpu::paged_attention(pool, v, AttentionArgs{q.data(), out.data(), 1, H, S - 1, 0, scale});
        bytes += 2LL * S * static_cast<int64_t>(kv_row_bytes(v.dtype, d)) * n_kv;
      } else if (policy == "sparq") {
        bytes += cpu::sparq_decode(pool, v, args, ref::sparq_params_for_ratio(kRatio, S, d)).kv_bytes;
      } else if (policy == "swa") {
        bytes += cpu::swa_decode(pool, v, args, ref::SwaParams{kRatio}, [&] { return mass.data(); }, &weights).kv_bytes;
      } else if (policy == "hip") {
        ref::HipBytes b;
        if (!has_mask[l] || (step + l) % 4 == 0) cpu::hip_estimate_mask(pool, v, args, hip, &masks[l], &b);
        has_mask[l] = true;
        cpu::hip_sparse_decode(pool, v, args, hip, masks[l], &b);
        bytes += b.total();
      } else {
        throw std::invalid_argument("bench_layer_loop: policies are dense, sparq, hip, swa; got " + policy);
      }
    };
    auto pass = [&](int steps) {  // µs per layer-step, GB/s of counted bytes
      bytes = 0;
      const auto t0 = std::chrono::steady_clock::now();
      for (int s = 0; s < steps; ++s, ++step)
        for (int32_t l = 0; l < layers; ++l) layer_step(l);
      const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      return std::make_pair(us / steps / layers, static_cast<double>(bytes) / 1e3 / us);
    };
    pass(4);  // warm-up: masks, buffers, page faults
    std::pair<double, double> best{1e30, 0.0};
    for (int r = 0; r < 15; ++r) best = std::min(best, pass(10));
    std::printf("  %-6s %8.1f us a layer-step, %5.1f GB/s of its counted bytes\n", policy.c_str(), best.first, best.second);
  }
  return 0;
}
