#pragma once
// ALISA sparse window attention on the device (ALGORITHMS.md "ALISA"). Spec:
// ref::swa_attention (kernels/ref/swa.h). The selection — the last k_local positions and the
// k_global older ones of largest accumulated mass — is made by the caller (ref::swa_select: the
// mass is the sequence's policy state, folded on the host); this launcher attends the kept
// positions exactly and returns each kept position's softmax weight summed over the query heads,
// which the caller folds into the mass for the next steps.
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/attention_common.h"
#include "kernels/cuda/emu/cuda_emu.h"
#include "kernels/paged_kv.h"

namespace fathom::cuda {

struct SwaPlan {
  int32_t n_kept = 0, group = 0, rows_per_cta = 1, head_tiles = 1;
  int32_t keys_per_split = 0, n_splits = 0;
  size_t part = 0;  // f32 [n_heads][n_splits][head_dim], then [n_heads][n_splits][2]
  size_t lse = 0;   // f32 [n_heads]: log Σ e^(logit) over the kept positions
  size_t workspace_floats = 0;
};

SwaPlan plan_swa_attention(const PagedKvView& kv, const DecodeArgs& args, int32_t n_kept, int32_t keys_per_split = 64);

// kept: device [n_kept] ascending positions <= args.pos (the same for every kv head).
// weights: device [n_kept] f32, written: Σ_h e^(logit_h(t) − lse_h) for t = kept[i].
// Launches: attend_partial_kernel over the list, merge_kernel (args.out), a per-head log-sum-exp
// of the partials, and one warp per kept position recomputing its logits (K row read again).
// Supports head_dim <= 256, f32 / f16 / INT8 KV. workspace: plan.workspace_floats.
cudaError_t swa_attention(const PagedKvView& kv, const DecodeArgs& args, const int32_t* kept, const SwaPlan& plan,
                          float* weights, float* workspace, cudaStream_t stream);

AttnBytes swa_attention_bytes(const PagedKvView& kv, const DecodeArgs& args, const SwaPlan& plan);

}  // namespace fathom::cuda
