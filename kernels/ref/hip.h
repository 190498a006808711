#pragma once
// Scalar reference of HiP (hierarchically pruned) decode attention (ALGORITHMS.md): mask
// estimation by iterative halving per query head, then block-sparse exact attention over the
// selected key blocks ∪ sinks ∪ window. The mask may be reused for later steps (refresh every
// R steps): sinks and window are always taken relative to the current position.
#include <cstdint>
#include <vector>

#include "kernels/ref/attention_state.h"

namespace fathom::ref {

struct HipParams {
  int32_t mask_k = 512;       // tokens selected from the middle region
  int32_t block_size_k = 2;   // key block, in tokens
  int32_t sink = 16;          // always attend [0, sink)
  int32_t window = 256;       // always attend [pos − window, pos]
  // One mask per kv head instead of per query head: each half is scored by the max over the
  // group's G query heads (and the centre block's keys), i.e. the group is HiP's query block, as
  // SparQ's group shares its selection. G× fewer estimation reads, and the G heads attend the same
  // rows (a kv head's working set is one selection, not up to G). The mask's per-head lists are
  // then equal within a group.
  bool per_kv_head = false;
};

struct HipMask {
  bool dense = true;                              // T′ ≤ mask_k at estimation: attend everything
  int32_t pos = 0;                                // position the mask was estimated at
  std::vector<std::vector<int32_t>> block_starts;  // [n_heads] first token of each selected block, ascending
};

// KV rows read, counted once per kv head per tensor (a kernel that serves the G heads of a
// group together reads a row once): bytes = (distinct K rows + distinct V rows)·d·elem.
struct HipBytes {
  int64_t k_bytes = 0, v_bytes = 0;
  int64_t total() const { return k_bytes + v_bytes; }
};

// Mask estimation at args.pos for every query head (per_kv_head: every kv head, its list copied to
// each of its query heads), with T′ = pos − window − sink:
//   T′ ≤ mask_k: dense. Otherwise the key blocks of [sink, sink + T′) (the last may be partial)
//   are split into n = mask_k / block_size_k equal chunks; while a chunk spans > 1 block, every
//   chunk is halved and each half is scored by its centre block (max over its keys of q·k);
//   the best n halves are kept (ties: lower block). ≈ ⌈log₂(T′/mask_k)⌉ iterations.
// Adds the K rows read by the scoring to `bytes` (distinct per kv head per iteration).
HipMask hip_estimate_mask(const PagedKvView& kv, const DecodeArgs& args, const HipParams& p, HipBytes* bytes);

// The positions query head `head` attends at `pos`: the union of [0, sink), its mask's blocks
// (block_size_k keys from each start) and [pos − window, pos], or [0, pos] if the mask is dense;
// ascending, distinct.
std::vector<int32_t> hip_attended_positions(const HipMask& mask, const HipParams& p, int32_t pos, int32_t head);

// Exact softmax over hip_attended_positions, per query head. Adds K and V rows read to `bytes`.
void hip_sparse_attention(const PagedKvView& kv, const DecodeArgs& args, const HipParams& p,
                          const HipMask& mask, HipBytes* bytes);

// Estimation then attention at args.pos (a refresh step).
HipBytes hip_attention(const PagedKvView& kv, const DecodeArgs& args, const HipParams& p);

}  // namespace fathom::ref
