#pragma once
// What an attention kernel needs to read one sequence's K/V for one layer from the paged pool.
#include <cstdint>

#include "kernels/kv_dtype.h"

namespace fathom {

struct PagedKvView {
  const void* k = nullptr;  // layer base: [num_blocks][n_kv_heads][block_size][head_dim], `dtype`
  const void* v = nullptr;  // same layout as k
  KvDtype dtype = KvDtype::kF32;
  const int32_t* block_table = nullptr;  // logical block i of the sequence -> physical block
  int32_t block_size = 16;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;

  // Element offset of the [block_size][head_dim] tile for logical block `i`, kv head `h`.
  int64_t tile_offset(int32_t i, int32_t h) const {
    return (static_cast<int64_t>(block_table[i]) * n_kv_heads + h) * block_size * head_dim;
  }
};

// Causal attention for `n_q` consecutive query tokens of one sequence.
//   q:   [n_q][n_heads][head_dim] f32, query i is at absolute position pos0 + i
//   out: [n_q][n_heads][head_dim] f32
// Query at position p attends keys [lo, p] with lo = max(0, p - window + 1) (window 0: lo = 0).
// GQA: query head h reads kv head h / (n_heads / n_kv_heads). The cache must already hold
// positions up to pos0 + n_q - 1. logits are (q·k) * scale.
struct AttentionArgs {
  const float* q = nullptr;
  float* out = nullptr;
  int32_t n_q = 0;
  int32_t n_heads = 0;
  int32_t pos0 = 0;
  int32_t window = 0;
  float scale = 1.0f;
};

}  // namespace fathom
