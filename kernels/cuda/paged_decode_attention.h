#pragma once
// Dense decode attention over the paged KV cache on the device, split-K over key chunks with a
// log-sum-exp merge. Spec: ref::paged_attention (kernels/ref/attention.h); same masking
// (causal + optional sliding window), GQA mapping and logit scale.
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/emu/cuda_emu.h"
#include "kernels/paged_kv.h"

namespace fathom::cuda {

// How one call is split: every query's key range [lo, pos] is cut into chunks of
// `keys_per_split` keys, one block per (chunk, head, query); a second kernel merges the chunks.
struct DecodeAttentionPlan {
  int32_t keys_per_split = 0;
  int32_t n_splits = 0;           // chunks of the longest query's key range
  size_t workspace_floats = 0;    // [n_q][n_heads][n_splits][head_dim + 2]; 0 when n_splits == 1
};

// keys_per_split: chunk length (>= 1); 256 keeps enough blocks in flight at batch 1 and
// long contexts while amortising the merge.
DecodeAttentionPlan plan_paged_decode_attention(const PagedKvView& kv, const AttentionArgs& args,
                                                int32_t keys_per_split = 256);

// kv and args as for ref::paged_attention, every pointer on the device (kv.block_table too).
// Supports head_dim <= 256 (any value, odd included), n_heads % n_kv_heads == 0, f32 / f16 KV.
// `workspace` holds plan.workspace_floats floats (may be null when that is 0).
cudaError_t paged_decode_attention(const PagedKvView& kv, const AttentionArgs& args, const DecodeAttentionPlan& plan,
                                   float* workspace, cudaStream_t stream);

}  // namespace fathom::cuda
