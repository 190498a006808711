// HiP: hierarchical mask estimation and block-sparse decode attention. See hip_attention.h.
#include "kernels/cuda/hip_attention.h"

#include <algorithm>

namespace fathom::cuda {
namespace hip_detail {  // named: the kernels' names stay unique across the .cu files

using namespace attn_common;

struct MaskParams {
  KvDev kv;
  const float* q;          // [n_heads][head_dim]
  int32_t* block_starts;   // [n_heads][n_keep]
  int32_t n_heads, group, n_keep, n_blocks, sink, end, block_size_k;
  int32_t rows_per_mask;   // query rows scored together: 1 (a mask per head) or group (per kv head)
};

// grid (n_heads / rows_per_mask), kThreads.
template <typename T, int kDpl>
__global__ void __launch_bounds__(kThreads) hip_mask_kernel(MaskParams p) {
  __shared__ int lo_s[kHipMaxKeep], hi_s[kHipMaxKeep];           // chunks, key blocks [lo, hi)
  __shared__ int half_lo[2 * kHipMaxKeep], half_hi[2 * kHipMaxKeep];
  __shared__ float score_s[2 * kHipMaxKeep];
  __shared__ int scratch[40];
  __shared__ float q_s[kHipMaxMaskDims];  // the mask's query rows [rows_per_mask][head_dim]
  __shared__ int flag_s, n_halves_s;
  const int unit = static_cast<int>(blockIdx.x), R = p.rows_per_mask, d = p.kv.head_dim;
  const int h0 = unit * R, g = h0 / p.group;  // first query head of the mask, its kv head
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const int n = p.n_keep, bs = p.block_size_k;
  for (int i = tid; i < R * d; i += kThreads) {
    q_s[i] = p.q[static_cast<int64_t>(h0) * d + i];
    count_other(sizeof(float));
  }
  for (int i = tid; i < n; i += kThreads) {
    lo_s[i] = static_cast<int>(static_cast<int64_t>(i) * p.n_blocks / n);
    hi_s[i] = static_cast<int>(static_cast<int64_t>(i + 1) * p.n_blocks / n);
  }
  int64_t from_host = 0;  // this warp's reads of the host tier, bytes (warp-uniform)
  for (;;) {
    if (tid == 0) flag_s = 0;
    __syncthreads();
    for (int i = tid; i < n; i += kThreads) {
      if (hi_s[i] - lo_s[i] > 1) atomicMax(&flag_s, 1);
    }
    __syncthreads();
    if (flag_s == 0) break;  // block-uniform
    // Halves of every chunk, in chunk order: [lo, mid) when non-empty, then [mid, hi).
    int base = 0;
    for (int start = 0; start < n; start += kThreads) {
      const int i = start + tid;
      int cnt = 0, lo = 0, hi = 0, mid = 0;
      if (i < n) {
        lo = lo_s[i];
        hi = hi_s[i];
        mid = lo + (hi - lo) / 2;
        cnt = mid > lo ? 2 : 1;
      }
      int total = 0;
      const int at = base + block_exclusive_scan(cnt, scratch, &total);
      if (i < n) {
        if (mid > lo) {
          half_lo[at] = lo;
          half_hi[at] = mid;
          half_lo[at + 1] = mid;
          half_hi[at + 1] = hi;
        } else {
          half_lo[at] = lo;
          half_hi[at] = hi;
        }
      }
      base += total;
    }
    if (tid == 0) n_halves_s = base;
    __syncthreads();
    const int n_halves = n_halves_s;
    // Score: max over the centre block's keys of q·k, one warp per half.
    for (int i = warp; i < n_halves; i += kWarps) {
      const int rep = (half_lo[i] + half_hi[i] - 1) / 2;
      const int t_end = min(p.end, p.sink + (rep + 1) * bs);
      float best = -INFINITY;
      for (int t = p.sink + rep * bs; t < t_end; ++t) {
        float kx[kDpl];
        const int64_t ref = kv_row(p.kv, p.kv.block_table, t, g, lane);
        load_k<T, kDpl>(p.kv, ref, lane, kx);
        if (ref < 0) from_host += kv_row_bytes_of<T>(p.kv);
        for (int r = 0; r < R; ++r) {  // the max over the mask's query rows
          float dot = 0.0f;
FATHOM_UNROLL
          for (int j = 0; j < kDpl; ++j) {
            const int c = lane + 32 * j;
            if (c < d) dot += q_s[r * d + c] * kx[j];
          }
          best = fmaxf(best, warp_sum(dot));
        }
      }
      if (lane == 0) score_s[i] = best;
    }
    __syncthreads();
    // Keep the best n of the halves (ties: lower index), in index order.
    base = 0;
    for (int start = 0; start < n_halves; start += kThreads) {
      const int i = start + tid;
      bool keep = false;
      int lo = 0, hi = 0;
      if (i < n_halves) {
        const float s = score_s[i];
        int rank = 0;
        for (int j = 0; j < n_halves; ++j) {
          const float o = score_s[j];
          rank += (o > s || (o == s && j < i)) ? 1 : 0;
        }
        keep = rank < n;
        lo = half_lo[i];
        hi = half_hi[i];
      }
      int total = 0;
      const int at = base + block_exclusive_scan(keep ? 1 : 0, scratch, &total);
      if (keep) {  // at < n; chunk reads of this iteration are done (the barrier in the scan)
        lo_s[at] = lo;
        hi_s[at] = hi;
      }
      base += total;
    }
    __syncthreads();
  }
  for (int i = tid; i < R * n; i += kThreads) {  // the same list for each of the mask's heads
    p.block_starts[static_cast<int64_t>(h0) * n + i] = p.sink + lo_s[i % n] * bs;
    count_write(sizeof(int32_t));
  }
  add_host_bytes_uniform(p.kv, from_host, lane);
}

// Virtual indices: [0, sink_hi) sinks, then n_keep·bs block positions, then the window.
struct HipPositions {
  const int32_t* starts;  // [n_heads][n_keep]
  int32_t n_keep, bs, sink_hi, win_lo, S;
  bool dense;
  __device__ __forceinline__ int count(int, int, int) const {
    return dense ? S : sink_hi + n_keep * bs + (S - win_lo);
  }
  __device__ __forceinline__ int at(int, int, int h, int i, int lane) const {
    if (dense || i < sink_hi) return i;
    i -= sink_hi;
    if (i < n_keep * bs) {
      const int t = load_uniform(starts + static_cast<int64_t>(h) * n_keep + i / bs, lane) + i % bs;
      return t >= win_lo ? -1 : t;  // inside the window: the window covers it (dedup)
    }
    return win_lo + (i - n_keep * bs);
  }
};

template <typename T>
cudaError_t launch_mask(const MaskParams& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.n_heads / p.rows_per_mask));
  switch (dims_per_lane(p.kv.head_dim)) {
    case 1: FATHOM_LAUNCH((hip_mask_kernel<T, 1>), grid, dim3(kThreads), 0, stream, p); break;
    case 2: FATHOM_LAUNCH((hip_mask_kernel<T, 2>), grid, dim3(kThreads), 0, stream, p); break;
    case 4: FATHOM_LAUNCH((hip_mask_kernel<T, 4>), grid, dim3(kThreads), 0, stream, p); break;
    default: FATHOM_LAUNCH((hip_mask_kernel<T, 8>), grid, dim3(kThreads), 0, stream, p); break;
  }
  return cudaGetLastError();
}

int32_t virtual_count(const DecodeArgs& args, const HipConfig& c, const HipMaskInfo& info) {
  const int32_t S = args.pos + 1;
  if (info.dense) return S;
  return std::min(c.sink, S) + info.n_keep * c.block_size_k + (S - std::max(0, args.pos - c.window));
}

}  // namespace hip_detail

HipMaskInfo plan_hip_mask(const PagedKvView&, const DecodeArgs& args, const HipConfig& c) {
  HipMaskInfo info;
  info.pos = args.pos;
  const int32_t t_mid = args.pos - c.window - c.sink;
  if (t_mid <= c.mask_k || c.block_size_k <= 0 || c.mask_k < c.block_size_k) return info;
  info.dense = false;
  info.n_keep = c.mask_k / c.block_size_k;
  info.n_blocks = (t_mid + c.block_size_k - 1) / c.block_size_k;
  int32_t longest = (info.n_blocks + info.n_keep - 1) / info.n_keep;
  while (longest > 1) {
    longest = (longest + 1) / 2;
    ++info.max_iterations;
  }
  return info;
}

AttnBytes hip_estimate_mask_bytes_bound(const PagedKvView& kv, const DecodeArgs& args, const HipConfig& c,
                                        const HipMaskInfo& info) {
  AttnBytes b;
  if (info.dense) return b;
  const int64_t masks = c.per_kv_head ? kv.n_kv_heads : args.n_heads;
  const int64_t keys = masks * info.max_iterations * 2 * info.n_keep * c.block_size_k;
  b.kv_read = keys * static_cast<int64_t>(kv_row_bytes(kv.dtype, kv.head_dim));
  b.other_read = keys * 4 + static_cast<int64_t>(args.n_heads) * kv.head_dim * 4;
  b.written = static_cast<int64_t>(args.n_heads) * info.n_keep * 4;
  return b;
}

cudaError_t hip_estimate_mask(const PagedKvView& kv, const DecodeArgs& args, const HipConfig& c,
                              const HipMaskInfo& info, int32_t* block_starts, cudaStream_t stream) {
  using namespace attn_common;
  if (info.dense || args.n_heads == 0) return cudaSuccess;
  if (kv.head_dim <= 0 || kv.head_dim > kMaxHeadDim || kv.n_kv_heads <= 0 || args.n_heads % kv.n_kv_heads != 0 ||
      info.n_keep <= 0 || info.n_keep > kHipMaxKeep || block_starts == nullptr || info.pos != args.pos ||
      (c.per_kv_head && !hip_group_fits_one_mask(args.n_heads / kv.n_kv_heads, kv.head_dim)) ||
      (kv.dtype == KvDtype::kI8 && kv.k_rows == nullptr)) {
    return cudaErrorInvalidValue;
  }
  hip_detail::MaskParams p{};
  p.kv = make_kv_dev(kv);
  p.q = args.q;
  p.block_starts = block_starts;
  p.n_heads = args.n_heads;
  p.group = args.n_heads / kv.n_kv_heads;
  p.n_keep = info.n_keep;
  p.n_blocks = info.n_blocks;
  p.sink = c.sink;
  p.end = args.pos - c.window;  // sink + T′
  p.block_size_k = c.block_size_k;
  p.rows_per_mask = c.per_kv_head ? p.group : 1;
  switch (kv.dtype) {
    case KvDtype::kF32: return hip_detail::launch_mask<float>(p, stream);
    case KvDtype::kF16: return hip_detail::launch_mask<__half>(p, stream);
    case KvDtype::kI8: return hip_detail::launch_mask<uint8_t>(p, stream);
  }
  return cudaErrorInvalidValue;
}

HipAttentionPlan plan_hip_sparse_attention(const PagedKvView& kv, const DecodeArgs& args, const HipConfig& c,
                                           const HipMaskInfo& info, int32_t keys_per_split) {
  HipAttentionPlan plan;
  plan.keys_per_split = std::max(1, keys_per_split);
  plan.n_splits = std::max(1, (hip_detail::virtual_count(args, c, info) + plan.keys_per_split - 1) / plan.keys_per_split);
  plan.workspace_floats =
      plan.n_splits == 1 ? 0 : static_cast<size_t>(args.n_heads) * plan.n_splits * (static_cast<size_t>(kv.head_dim) + 2);
  return plan;
}

AttnBytes hip_sparse_attention_bytes(const PagedKvView& kv, const DecodeArgs& args, const HipConfig& c,
                                     const HipMaskInfo& info, const HipAttentionPlan& plan) {
  const int64_t H = args.n_heads, rows = hip_detail::virtual_count(args, c, info);
  AttnBytes b = attn_common::attend_partial_fixed_bytes(1, args.n_heads, kv.head_dim, plan.n_splits);
  b.kv_read += H * rows * 2 * static_cast<int64_t>(kv_row_bytes(kv.dtype, kv.head_dim));
  b.other_read += H * rows * 4;  // block-table entries
  if (!info.dense) b.other_read += H * info.n_keep * c.block_size_k * 4;  // block starts, once per position
  if (plan.n_splits > 1) b += attn_common::merge_bytes(H, plan.n_splits, kv.head_dim, false);
  return b;
}

cudaError_t hip_sparse_attention(const PagedKvView& kv, const DecodeArgs& args, const HipConfig& c,
                                 const HipMaskInfo& info, const int32_t* block_starts, const HipAttentionPlan& plan,
                                 float* workspace, cudaStream_t stream) {
  using namespace attn_common;
  if (args.n_heads == 0) return cudaSuccess;
  if (kv.head_dim <= 0 || kv.head_dim > kMaxHeadDim || kv.n_kv_heads <= 0 || args.n_heads % kv.n_kv_heads != 0 ||
      args.pos < 0 || (!info.dense && (block_starts == nullptr || args.pos < info.pos)) || plan.n_splits <= 0 ||
      (plan.n_splits > 1 && workspace == nullptr) ||
      (kv.dtype == KvDtype::kI8 && (kv.k_rows == nullptr || kv.v_rows == nullptr))) {
    return cudaErrorInvalidValue;
  }
  AttendParams p{};
  p.kv = make_kv_dev(kv);
  p.q = args.q;
  p.out = args.out;
  p.part_acc = workspace;
  p.part_ml = workspace == nullptr ? nullptr
                                   : workspace + static_cast<size_t>(args.n_heads) * plan.n_splits * kv.head_dim;
  p.n_heads = args.n_heads;
  p.group = args.n_heads / kv.n_kv_heads;
  p.head_tiles = p.group;  // one query head per block: every head has its own mask
  p.keys_per_split = plan.keys_per_split;
  p.n_splits = plan.n_splits;
  p.scale = args.scale;
  const int32_t S = args.pos + 1;
  const hip_detail::HipPositions positions{block_starts, info.n_keep, c.block_size_k, std::min(c.sink, S),
                                           std::max(0, args.pos - c.window), S, info.dense};
  cudaError_t err = launch_attend(kv.dtype, 1, p, positions, 1, stream);
  if (err != cudaSuccess || plan.n_splits == 1) return err;
  MergeParams mp{};
  mp.part_acc = p.part_acc;
  mp.part_ml = p.part_ml;
  mp.out = args.out;
  mp.n_splits = plan.n_splits;
  mp.head_dim = kv.head_dim;
  mp.kv = p.kv;
  mp.group = p.group;
  FATHOM_LAUNCH(merge_kernel<0>, dim3(static_cast<unsigned>(args.n_heads)), dim3(kThreads), 0, stream, mp);
  return cudaGetLastError();
}

}  // namespace fathom::cuda
