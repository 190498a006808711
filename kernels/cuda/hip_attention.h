#pragma once
// HiP decode attention on the device (ALGORITHMS.md "HiP"): mask estimation by iterative halving
// and block-sparse attention over the selected key blocks ∪ sinks ∪ window. Spec:
// ref::hip_estimate_mask / ref::hip_sparse_attention (kernels/ref/hip.h), same chunking, centre
// representative, tie rule (lower index) and dedup; scores are float here (ref: double).
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/attention_common.h"
#include "kernels/cuda/emu/cuda_emu.h"
#include "kernels/paged_kv.h"

namespace fathom::cuda {

struct HipConfig {
  int32_t mask_k = 512;      // tokens selected from the middle region
  int32_t block_size_k = 2;  // key block, in tokens
  int32_t sink = 16;         // always attend [0, sink)
  int32_t window = 256;      // always attend [pos − window, pos]
  bool per_kv_head = false;  // one mask per kv head, scored by the max over its G query heads
};

// What the host knows about a mask estimated at `pos` (the selected blocks live on the device).
struct HipMaskInfo {
  bool dense = true;       // T′ = pos − window − sink <= mask_k: attend everything
  int32_t pos = 0;
  int32_t n_keep = 0;      // blocks per head: mask_k / block_size_k
  int32_t n_blocks = 0;    // key blocks of the middle region [sink, sink + T′)
  int32_t max_iterations = 0;  // halvings until every chunk is one block, at most
};

// Largest n_keep the estimation kernel holds in shared memory.
constexpr int32_t kHipMaxKeep = 1024;
// Largest rows_per_mask · head_dim it holds (per_kv_head: G · d, e.g. 8 × 256 or 16 × 128).
constexpr int32_t kHipMaxMaskDims = 2048;
// Whether one mask per kv head (its G query rows) fits the estimation kernel.
constexpr bool hip_group_fits_one_mask(int32_t group, int32_t head_dim) { return group * head_dim <= kHipMaxMaskDims; }

HipMaskInfo plan_hip_mask(const PagedKvView& kv, const DecodeArgs& args, const HipConfig& config);

// grid (masks: n_heads, or n_kv_heads with per_kv_head), 128 threads per mask: chunks in shared
// memory; each iteration halves every chunk longer than one block, scores each half by its centre
// block (max over its keys and the mask's query rows of q·k, one warp per half), keeps the best
// n_keep halves (block-wide ranking) in index order.
// block_starts: device [n_heads][n_keep], the first token of each selected block, ascending
// (per_kv_head: equal lists for the heads of a group).
// Nothing is launched for a dense mask.
cudaError_t hip_estimate_mask(const PagedKvView& kv, const DecodeArgs& args, const HipConfig& config,
                              const HipMaskInfo& info, int32_t* block_starts, cudaStream_t stream);

// Bytes of the estimation, an upper bound: every iteration of max_iterations scores 2·n_keep
// halves of block_size_k keys. (Chunks that are already one block yield one half, and a head
// stops when all its chunks are one block, so the grid may read less; the test checks <=.)
AttnBytes hip_estimate_mask_bytes_bound(const PagedKvView& kv, const DecodeArgs& args, const HipConfig& config,
                                        const HipMaskInfo& info);

struct HipAttentionPlan {
  int32_t keys_per_split = 0, n_splits = 0;
  size_t workspace_floats = 0;  // [n_heads][n_splits][head_dim + 2]; 0 with one split
};

HipAttentionPlan plan_hip_sparse_attention(const PagedKvView& kv, const DecodeArgs& args, const HipConfig& config,
                                           const HipMaskInfo& info, int32_t keys_per_split = 256);

// Exact softmax at args.pos over [0, sink) ∪ the mask's blocks ∪ [pos − window, pos] (block
// positions inside the window are skipped: the union is deduplicated), or [0, pos] for a dense
// mask. The mask may come from an earlier position (cached for R − 1 steps). One block per
// (split, query head): heads have their own masks.
cudaError_t hip_sparse_attention(const PagedKvView& kv, const DecodeArgs& args, const HipConfig& config,
                                 const HipMaskInfo& info, const int32_t* block_starts, const HipAttentionPlan& plan,
                                 float* workspace, cudaStream_t stream);

// Bytes of the attention as implemented, counting every block position as read: exact unless a
// selected block reaches into the window (then fewer than block_size_k rows per head less).
AttnBytes hip_sparse_attention_bytes(const PagedKvView& kv, const DecodeArgs& args, const HipConfig& config,
                                     const HipMaskInfo& info, const HipAttentionPlan& plan);

}  // namespace fathom::cuda
