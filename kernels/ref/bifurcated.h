#pragma once
// Scalar reference of bifurcated (group) decode attention (ALGORITHMS.md): sequences that share
// a context prefix read its KV once for all their query rows; each then attends its own suffix;
// the partial states merge exactly. Nested prefixes (a system prompt shared by all, a document
// shared by some) are segments that merge level by level.
#include <cstdint>
#include <vector>

#include "kernels/ref/attention_state.h"

namespace fathom::ref {

// Positions [begin, end) whose KV is the same for every member sequence, read through `kv`
// (whose block table covers [0, end)). A sequence's segments must tile [0, its last end)
// without gaps or overlaps; segments may be listed in any order.
struct SharedSegment {
  const PagedKvView* kv = nullptr;
  int32_t begin = 0, end = 0;
  std::vector<int32_t> members;  // indices into the sequence arrays
};

// For every sequence i: out_i = softmax over keys [0, pos_i] exactly as dense decode, where
// positions covered by a segment are read once per segment (all members' n_heads rows in one
// pass, per kv head) and the rest [suffix_begin_i, pos_i] through seq_kv[i].
//   seq_kv:   [n_seqs] each sequence's own view (same n_kv_heads, head_dim, dtype)
//   seq_args: [n_seqs] decode query per sequence (same n_heads and scale)
// Returns the KV bytes read: (Σ_segments len + Σ_i suffix_len_i) · 2 · head_dim · n_kv_heads
// · element size, i.e. (m_c + b·m_d)·2·d per kv head for one prefix.
int64_t bifurcated_attention(const std::vector<SharedSegment>& segments, const PagedKvView* seq_kv,
                             const DecodeArgs* seq_args, int32_t n_seqs);

}  // namespace fathom::ref
