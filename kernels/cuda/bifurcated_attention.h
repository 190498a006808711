#pragma once
// Bifurcated (group) decode attention on the device (ALGORITHMS.md "Bifurcated attention"). Spec:
// ref::bifurcated_attention (kernels/ref/bifurcated.h): sequences sharing a context segment read
// its KV once for all their query rows (the [b·G, d] × [d, m_c] product), each sequence attends
// its own suffix, and every output row merges its partial states exactly (log-sum-exp).
// Segments may nest (a system prompt shared by all, a document shared by some).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/cuda/attention_common.h"
#include "kernels/cuda/emu/cuda_emu.h"
#include "kernels/paged_kv.h"

namespace fathom::cuda {

// Positions [begin, end) identical for every member, read through `block_table` (device).
struct BifSegment {
  const int32_t* block_table = nullptr;
  int32_t begin = 0, end = 0;
  std::vector<int32_t> members;  // sequence indices
};
struct BifSequence {
  const int32_t* block_table = nullptr;  // device; covers [0, pos]
  int32_t pos = 0;                       // the decode query's position
};

// One block of work: keys [key_begin, key_end) of kv head g through `table`, for n_rows query
// rows (ids into the [n_seqs·n_heads] rows) listed at rows[row_begin ..]; partial states go to
// workspace slots slot_base + i.
struct BifUnit {
  const int32_t* table;
  int32_t g, key_begin, key_end, row_begin, n_rows, slot_base;
};

struct BifurcatedPlan {
  int32_t n_seqs = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
  int32_t rows_per_cta = 0;     // 8 warps × 8 rows (head_dim <= 128) or × 4 (<= 256)
  int32_t keys_per_split = 0;
  std::vector<BifUnit> units;
  std::vector<int32_t> rows;        // unit row lists
  std::vector<int32_t> slot_begin;  // CSR [n_seqs·n_heads + 1] over slot_ids
  std::vector<int32_t> slot_ids;
  int32_t n_slots = 0;
  size_t device_bytes = 0;       // the plan's device copy (units, rows, CSR)
  size_t workspace_floats = 0;   // [n_slots][head_dim + 2]
};

// Host planning: a segment's rows (members × group per kv head) are cut into tiles of
// rows_per_cta, its keys into chunks of keys_per_split; each sequence's suffix
// [max end of its segments, pos] likewise with its own group rows.
BifurcatedPlan plan_bifurcated_attention(const std::vector<BifSegment>& segments, const std::vector<BifSequence>& seqs,
                                         int32_t n_heads, const PagedKvView& kv_layout, int32_t keys_per_split = 256);

// q, out: device [n_seqs][n_heads][head_dim]. kv_layout: the pool (k, v, dtype, INT8 rows,
// block_size, n_kv_heads, head_dim; its block_table is unused: units carry theirs).
// device_plan: plan.device_bytes (filled here by an async copy from `plan`, which must outlive it);
// workspace: plan.workspace_floats; sinks: [n_heads] attention sinks (device) or null. Two launches: the units (grid n_units, 256 threads: K/V
// tiles of 16 keys staged in shared memory as f32, each warp runs its rows' online softmax over
// the tile), then merge_kernel over each output row's slots.
cudaError_t bifurcated_attention(const BifurcatedPlan& plan, const PagedKvView& kv_layout, const float* q, float* out,
                                 void* device_plan, float* workspace, LogitScale scale, const float* sinks,
                                 cudaStream_t stream);

AttnBytes bifurcated_attention_bytes(const BifurcatedPlan& plan, const PagedKvView& kv_layout, bool sinks = false);

}  // namespace fathom::cuda
