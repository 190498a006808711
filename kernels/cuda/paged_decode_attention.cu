// Split-K paged decode attention (flash-decoding).
//   Pass 1, attend_partial_kernel (attention_common.h), grid (n_splits, n_kv_heads · head_tiles,
//   n_q), 4 warps: each warp walks every 4th key of the chunk; its 32 lanes split head_dim (lane
//   c, c+32, ...: coalesced rows), and every K/V row it loads serves all the block's query heads
//   (up to 8 of one GQA group: q in shared memory, rows·dims accumulators per lane). Online
//   softmax per head; the 4 warp states meet in shared memory. With one split the block writes
//   the output directly; otherwise (acc, m, l) go to the workspace and merge_kernel combines the
//   chunks: M = max m_s, out = Σ_s acc_s e^(m_s − M) / Σ_s l_s e^(m_s − M).
// INT8 rows dequantize as scale·x + min (ref's formula) with the row's parameters read once.
#include "kernels/cuda/paged_decode_attention.h"

#include <algorithm>

namespace fathom::cuda {
namespace decode_attention_detail {  // named: the kernels' names stay unique across the .cu files

using attn_common::kMaxHeadDim;

// Keys [lo, pos] of query qi (pos = pos0 + qi), lo from the sliding window.
struct RangePositions {
  int32_t pos0, window;
  __device__ __forceinline__ int lo(int qi) const {
    const int pos = pos0 + qi;
    return window > 0 ? max(0, pos - window + 1) : 0;
  }
  __device__ __forceinline__ int count(int qi, int, int) const { return pos0 + qi - lo(qi) + 1; }
  __device__ __forceinline__ int at(int qi, int, int, int i, int) const { return lo(qi) + i; }
};

int32_t key_range(const AttentionArgs& a, int32_t qi) {
  const int32_t pos = a.pos0 + qi;
  return a.window > 0 ? std::min(a.window, pos + 1) : pos + 1;
}

}  // namespace decode_attention_detail

DecodeAttentionPlan plan_paged_decode_attention(const PagedKvView& kv, const AttentionArgs& args,
                                                int32_t keys_per_split) {
  using decode_attention_detail::key_range;
  DecodeAttentionPlan plan;
  plan.keys_per_split = std::max<int32_t>(1, keys_per_split);
  const int32_t longest = args.n_q > 0 ? key_range(args, args.n_q - 1) : 1;  // the last query sees the most
  plan.n_splits = std::max<int32_t>(1, (longest + plan.keys_per_split - 1) / plan.keys_per_split);
  const int32_t group = kv.n_kv_heads > 0 ? std::max(1, args.n_heads / kv.n_kv_heads) : 1;
  plan.rows_per_cta = attn_common::rows_per_cta(group, attn_common::dims_per_lane(kv.head_dim));
  plan.head_tiles = (group + plan.rows_per_cta - 1) / plan.rows_per_cta;
  plan.workspace_floats = plan.n_splits == 1 ? 0
                                             : static_cast<size_t>(args.n_q) * args.n_heads * plan.n_splits *
                                                   (static_cast<size_t>(kv.head_dim) + 2);
  return plan;
}

AttnBytes paged_decode_attention_bytes(const PagedKvView& kv, const AttentionArgs& args,
                                       const DecodeAttentionPlan& plan) {
  using decode_attention_detail::key_range;
  int64_t keys = 0;
  for (int32_t i = 0; i < args.n_q; ++i) keys += key_range(args, i);
  const int64_t ctas_per_key = static_cast<int64_t>(kv.n_kv_heads) * plan.head_tiles;
  AttnBytes b = attn_common::attend_partial_fixed_bytes(args.n_q, args.n_heads, kv.head_dim, plan.n_splits);
  b.kv_read += keys * ctas_per_key * 2 * static_cast<int64_t>(kv_row_bytes(kv.dtype, kv.head_dim));
  b.other_read += keys * ctas_per_key * 4;  // one block-table entry per key per block
  if (plan.n_splits > 1) b += attn_common::merge_bytes(static_cast<int64_t>(args.n_q) * args.n_heads, plan.n_splits,
                                                       kv.head_dim, false);
  if (args.sinks != nullptr) b.other_read += static_cast<int64_t>(args.n_q) * args.n_heads * 4;  // a sink a row
  return b;
}

cudaError_t paged_decode_attention(const PagedKvView& kv, const AttentionArgs& args, const DecodeAttentionPlan& plan,
                                   float* workspace, cudaStream_t stream) {
  using namespace attn_common;
  if (args.n_q == 0 || args.n_heads == 0) return cudaSuccess;
  if (kv.head_dim <= 0 || kv.head_dim > kMaxHeadDim || kv.n_kv_heads <= 0 || args.n_heads % kv.n_kv_heads != 0 ||
      kv.block_size <= 0 || args.n_q < 0 || args.pos0 < 0 || plan.keys_per_split <= 0 || plan.n_splits <= 0 ||
      (plan.n_splits > 1 && workspace == nullptr) || args.n_q > 65535 ||
      static_cast<int64_t>(kv.n_kv_heads) * plan.head_tiles > 65535 ||
      plan.rows_per_cta * plan.head_tiles < args.n_heads / kv.n_kv_heads ||
      (kv.dtype == KvDtype::kI8 && (kv.k_rows == nullptr || kv.v_rows == nullptr))) {
    return cudaErrorInvalidValue;
  }
  AttendParams p{};
  p.kv = make_kv_dev(kv);
  p.q = args.q;
  p.out = args.out;
  p.part_acc = workspace;
  p.part_ml = workspace == nullptr
                  ? nullptr
                  : workspace + static_cast<size_t>(args.n_q) * args.n_heads * plan.n_splits * kv.head_dim;
  p.n_heads = args.n_heads;
  p.group = args.n_heads / kv.n_kv_heads;
  p.head_tiles = plan.head_tiles;
  p.keys_per_split = plan.keys_per_split;
  p.n_splits = plan.n_splits;
  p.scale = args.logit_scale();
  p.sinks = args.sinks;
  const decode_attention_detail::RangePositions positions{args.pos0, args.window};
  cudaError_t err = launch_attend(kv.dtype, plan.rows_per_cta, p, positions, args.n_q, stream);
  if (err != cudaSuccess || plan.n_splits == 1) return err;
  MergeParams mp{};
  mp.part_acc = p.part_acc;
  mp.part_ml = p.part_ml;
  mp.out = args.out;
  mp.n_splits = plan.n_splits;
  mp.head_dim = kv.head_dim;
  mp.kv = p.kv;
  mp.group = p.group;
  mp.sinks = args.sinks;
  mp.n_heads = args.n_heads;
  FATHOM_LAUNCH(merge_kernel<0>, dim3(static_cast<unsigned>(args.n_q * args.n_heads)), dim3(kThreads), 0, stream, mp);
  return cudaGetLastError();
}

}  // namespace fathom::cuda
