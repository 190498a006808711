#pragma once
// SparQ decode attention on the device (ALGORITHMS.md "SparQ"). Spec: ref::sparq_attention
// (kernels/ref/sparq.h): same steps, clamping, forced-window flag and tie rules; selections are
// made in float (ref: double), so near-ties may pick a different position.
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/attention_common.h"
#include "kernels/cuda/emu/cuda_emu.h"
#include "kernels/paged_kv.h"

namespace fathom::cuda {

struct SparqConfig {
  int32_t k = 128;           // positions gathered per kv head
  int32_t l = -1;            // forced local window; −1: k/4
  int32_t r = -1;            // query components per group; −1: head_dim/8
  bool reallocation = true;  // out = α·y + (1 − α)·v̄ (needs kv.v_sum)
  bool key_spread = false;   // step 1 weighted by √ of the keys' spread (needs kv.k_moments)
};

// Resolved sizes and the workspace layout (offsets in 4-byte words).
struct SparqPlan {
  int32_t S = 0, r = 0, k = 0, l = 0, group = 0;
  bool reallocation = true, key_spread = false;
  int32_t score_keys_per_split = 0, score_splits = 0;    // kernel 1: approximate scores
  int32_t attend_keys_per_split = 0, attend_splits = 0;  // kernel 3: gather attention
  int32_t rows_per_cta = 1, head_tiles = 1;
  size_t scores = 0;    // f32 [n_heads][S]: ŝ_h
  size_t summed = 0;    // f32 [n_kv_heads][S]: Σ_group ŝ
  size_t score_ml = 0;  // f32 [n_heads][score_splits][2]: per-chunk max and Σ e^(ŝ − max)
  size_t i1 = 0;        // i32 [n_kv_heads][r]: I1 (ranked by descending Σ|q|)
  size_t i2 = 0;        // i32 [n_kv_heads][k]: I2 (the selected ascending, then the forced window)
  size_t alpha = 0;     // f32 [n_heads]
  size_t part = 0;      // f32 [n_heads][attend_splits][head_dim], then [n_heads][attend_splits][2]
  size_t workspace_words = 0;
};

SparqPlan plan_sparq_decode_attention(const PagedKvView& kv, const DecodeArgs& args, const SparqConfig& config,
                                      int32_t score_keys_per_split = 1024, int32_t attend_keys_per_split = 64);

// One decode query (args.q / args.out on the device) over kv (device pointers). Four launches:
//   1. grid (score_splits, n_kv_heads): I1 = top-r of the group's Σ|q| (with key_spread
//      Σ|q[c]|·√σ[c], σ from the M2 row of kv.k_moments at the tile of pos, read by each block;
//      the temperature's L1 sums weighted alike) by block-wide ranking (ties: lower index), then ŝ_h[t] for the block's keys from the r rows of the transposed K
//      tiles (kv.k_t; without it the r columns of K rows), per-chunk softmax statistics of ŝ_h.
//   2. grid (n_kv_heads): I2 = the last l positions (forced by flag) ∪ the top k − l of Σŝ over
//      the rest, by a 4-pass 8-bit radix select on the float keys (ties: lower position), written
//      in ascending order (a deterministic gather order on a GPU, and the CPU's);
//      α_h = Σ_{I2} e^(ŝ_h − M) / Σ_all e^(ŝ_h − M).
//   3. attend_partial_kernel over I2 (GQA rows share each gathered K/V row).
//   4. merge_kernel with out = α·y + (1 − α)·v̄, v̄ = v_sum[tile of pos] / (pos + 1).
// Supports head_dim <= 256, group <= 8, f32 / f16 / INT8 KV. workspace: plan.workspace_words.
cudaError_t sparq_decode_attention(const PagedKvView& kv, const DecodeArgs& args, const SparqPlan& plan,
                                   void* workspace, cudaStream_t stream);

AttnBytes sparq_decode_attention_bytes(const PagedKvView& kv, const DecodeArgs& args, const SparqPlan& plan);

}  // namespace fathom::cuda
