#pragma once
// Dense decode attention over the paged KV cache on the device, split-K over key chunks with a
// log-sum-exp merge. Spec: ref::paged_attention (kernels/ref/attention.h); same masking
// (causal + optional sliding window), GQA mapping and logit scale.
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/attention_common.h"
#include "kernels/cuda/emu/cuda_emu.h"
#include "kernels/paged_kv.h"

namespace fathom::cuda {

// How one call is split: every query's key range [lo, pos] is cut into chunks of
// `keys_per_split` keys; one block per (chunk, kv head, tile of the GQA group, query) serves
// `rows_per_cta` query heads of one kv head, so a K/V row is fetched once per tile (once per
// group when group <= rows_per_cta: 8 for head_dim <= 128, 4 for head_dim <= 256).
struct DecodeAttentionPlan {
  int32_t keys_per_split = 0;
  int32_t n_splits = 0;           // chunks of the longest query's key range
  int32_t rows_per_cta = 1;       // query heads per block
  int32_t head_tiles = 1;         // blocks per kv head: ceil(group / rows_per_cta)
  size_t workspace_floats = 0;    // [n_q][n_heads][n_splits][head_dim + 2]; 0 when n_splits == 1
};

// keys_per_split: chunk length (>= 1); 256 keeps enough blocks in flight at batch 1 and
// long contexts while amortising the merge.
DecodeAttentionPlan plan_paged_decode_attention(const PagedKvView& kv, const AttentionArgs& args,
                                                int32_t keys_per_split = 256);

// kv and args as for ref::paged_attention, every pointer on the device (kv.block_table too).
// Supports head_dim <= 256 (any value, odd included), n_heads % n_kv_heads == 0, f32 / f16 /
// INT8 KV (INT8: kv.k_rows / kv.v_rows). `workspace` holds plan.workspace_floats floats (may be
// null when that is 0).
cudaError_t paged_decode_attention(const PagedKvView& kv, const AttentionArgs& args, const DecodeAttentionPlan& plan,
                                   float* workspace, cudaStream_t stream);

// Global-memory bytes the launch above moves (both kernels), from its access pattern; host only
// reads args.n_q / pos0 / window / n_heads (no device pointer is dereferenced).
AttnBytes paged_decode_attention_bytes(const PagedKvView& kv, const AttentionArgs& args,
                                       const DecodeAttentionPlan& plan);

}  // namespace fathom::cuda
