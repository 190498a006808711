// Paper model of the CUDA decode-attention kernels: the bytes each launch moves per decode step,
// taken from the launchers' own byte functions (the counts tests/kernel/test_backend_ops.cpp
// checks against the emulator-instrumented grids), for H100-class HBM (3.35 TB/s). No GPU is
// involved: the latencies are bytes / bandwidth, not measurements. Prints the tables of
// bench/results/estimates/cuda_bytes.md.
#include <cmath>
#include <cstdio>
#include <vector>

#include "kernels/cuda/bifurcated_attention.h"
#include "kernels/cuda/hip_attention.h"
#include "kernels/cuda/paged_decode_attention.h"
#include "kernels/cuda/sparq_attention.h"

namespace {

using namespace fathom;

struct Model {
  const char* name;
  int32_t n_heads, n_kv_heads, head_dim, n_layers;
};

constexpr double kHbm = 3.35e12;  // bytes/s, H100 SXM

PagedKvView layout(const Model& m, KvDtype dtype) {
  PagedKvView kv;
  kv.dtype = dtype;
  kv.block_size = 16;
  kv.n_kv_heads = m.n_kv_heads;
  kv.head_dim = m.head_dim;
  return kv;
}

void row(const Model& m, int32_t S, const char* method, double bytes_layer, double fd_layer) {
  const double step = bytes_layer * m.n_layers;
  std::printf("| %s | %dk | %s | %.2f | %.1f | %.3f |\n", m.name, S / 1024, method, step / 1e6, step / kHbm * 1e6,
              bytes_layer / fd_layer);
}

}  // namespace

int main() {
  const Model models[] = {{"Llama-3-8B", 32, 8, 128, 32}, {"SmolLM2-135M", 9, 3, 64, 30}, {"Gemma 3 270M", 4, 1, 256, 18}};
  const KvDtype dtype = KvDtype::kF16;
  std::printf("| model | S | kernel (f16 KV) | MB / step (all layers) | µs at 3.35 TB/s | × FlashDecoding |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (const Model& m : models) {
    for (int32_t S : {4096, 32768, 131072}) {
      const PagedKvView kv = layout(m, dtype);
      const double fd = 2.0 * S * m.head_dim * 2 * m.n_kv_heads;  // FA2 / FlashDecoding, f16, per layer
      row(m, S, "FlashDecoding model 2·S·d·2 per kv head", fd, fd);
      // Dense: one query at pos S − 1.
      AttentionArgs a;
      a.n_q = 1;
      a.n_heads = m.n_heads;
      a.pos0 = S - 1;
      const cuda::DecodeAttentionPlan dp = cuda::plan_paged_decode_attention(kv, a, 256);
      row(m, S, "dense split-K (this repo)", static_cast<double>(cuda::paged_decode_attention_bytes(kv, a, dp).total()),
          fd);
      // SparQ at c = 1/8 (r = d·c, k = max(c·S/2, 128), l = k/4: ref::sparq_params_for_ratio), k_t present.
      DecodeArgs d{nullptr, nullptr, m.n_heads, S - 1, 1.0f};
      const double c = 1.0 / 8;
      cuda::SparqConfig sc;
      sc.r = std::max(1, static_cast<int32_t>(std::lround(2.0 * m.head_dim * c / 3.0)));
      sc.k = std::max(1, static_cast<int32_t>(std::lround(2.0 * c * S / 3.0)));
      sc.l = sc.k / 4;
      sc.reallocation = true;
      const cuda::SparqPlan sp = cuda::plan_sparq_decode_attention(kv, d, sc);
      const cuda::AttnBytes sb = cuda::sparq_decode_attention_bytes(kv, d, sp);
      char label[160];
      std::snprintf(label, sizeof label, "SparQ 1/8 (r=%d, k=%d), KV part %.0f%%", sp.r, sp.k,
                    100.0 * sb.kv_read / sb.total());
      row(m, S, label, static_cast<double>(sb.total()), fd);
      // HiP defaults: mask_k 512, block 2, sink 16, window 256.
      const cuda::HipConfig hc;
      const cuda::HipMaskInfo info = cuda::plan_hip_mask(kv, d, hc);
      const cuda::HipAttentionPlan hp = cuda::plan_hip_sparse_attention(kv, d, hc, info, 256);
      const double cached = static_cast<double>(cuda::hip_sparse_attention_bytes(kv, d, hc, info, hp).total());
      const double est = static_cast<double>(cuda::hip_estimate_mask_bytes_bound(kv, d, hc, info).total());
      row(m, S, "HiP cached mask (per query head)", cached, fd);
      std::snprintf(label, sizeof label, "HiP refresh: estimate (<= %d halvings, bound) + attention", info.max_iterations);
      row(m, S, label, cached + est, fd);
      row(m, S, "HiP amortised, refresh every 8 steps", cached + est / 8, fd);
      // Bifurcated: b = 16 sequences share [0, S), each has its own token S (pos = S).
      std::vector<cuda::BifSequence> seqs(16, cuda::BifSequence{nullptr, S});
      std::vector<int32_t> members(16);
      for (int32_t i = 0; i < 16; ++i) members[i] = i;
      const std::vector<cuda::BifSegment> segs{cuda::BifSegment{nullptr, 0, S, members}};
      const cuda::BifurcatedPlan bp = cuda::plan_bifurcated_attention(segs, seqs, m.n_heads, kv, 256);
      AttentionArgs a16 = a;
      a16.pos0 = S;
      const cuda::DecodeAttentionPlan dp16 = cuda::plan_paged_decode_attention(kv, a16, 256);
      const double dense16 = 16.0 * static_cast<double>(cuda::paged_decode_attention_bytes(kv, a16, dp16).total());
      std::snprintf(label, sizeof label, "b=16 per-sequence dense (16 launches, per seq ÷16: %.2f MB)",
                    dense16 * m.n_layers / 16 / 1e6);
      row(m, S, label, dense16, 16 * fd);
      std::snprintf(label, sizeof label, "b=16 bifurcated, one launch (%d rows per CTA)", bp.rows_per_cta);
      row(m, S, label, static_cast<double>(cuda::bifurcated_attention_bytes(bp, kv).total()), 16 * fd);
    }
  }
  return 0;
}
