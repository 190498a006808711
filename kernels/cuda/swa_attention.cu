// ALISA sparse window attention on the device (contract: kernels/cuda/swa_attention.h).
#include "kernels/cuda/swa_attention.h"

#include <algorithm>
#include <cmath>

namespace fathom::cuda {
namespace swa_detail {  // named: the kernels' names stay unique across the .cu files

using namespace attn_common;

// The kept positions, the same list for every kv head.
struct KeptPositions {
  const int32_t* kept;
  int32_t n;
  __device__ __forceinline__ int count(int, int, int) const { return n; }
  __device__ __forceinline__ int at(int, int, int, int i, int lane) const { return load_uniform(kept + i, lane); }
};

struct LseParams {
  const float* part_ml;  // [n_heads][n_splits][2]
  float* lse;            // [n_heads]
  int32_t n_heads, n_splits;
};

// grid (1), kThreads: thread h: lse_h = M + log Σ_s l_s e^(m_s − M), M = max_s m_s.
__global__ void __launch_bounds__(kThreads) lse_kernel(LseParams p) {
  for (int h = static_cast<int>(threadIdx.x); h < p.n_heads; h += static_cast<int>(blockDim.x)) {
    const float* ml = p.part_ml + static_cast<int64_t>(h) * p.n_splits * 2;
    float m = -INFINITY;
    for (int s = 0; s < p.n_splits; ++s) {
      count_other(4);
      m = fmaxf(m, ml[2 * s]);
    }
    float l = 0.0f;
    for (int s = 0; s < p.n_splits; ++s) {
      count_other(8);
      if (ml[2 * s] != -INFINITY) l += ml[2 * s + 1] * expf(ml[2 * s] - m);
    }
    count_write(4);
    p.lse[h] = m + logf(l);
  }
}

struct WeightsParams {
  KvDev kv;
  const float* q;       // [n_heads][head_dim]
  const int32_t* kept;  // [n_kept]
  const float* lse;     // [n_heads]
  float* weights;       // [n_kept]
  int32_t n_heads, group;
  float scale;
};

// grid (n_kept), 32 threads: the warp of kept position i reads its K row per kv head, recomputes
// every query head's logit (the same dot product and warp sum as WarpSoftmax) and writes
// Σ_h e^(logit_h − lse_h), heads in ascending order.
template <typename T, int kDpl>
__global__ void __launch_bounds__(32) swa_weights_kernel(WeightsParams p) {
  const int i = static_cast<int>(blockIdx.x), lane = static_cast<int>(threadIdx.x);
  const int t = load_uniform(p.kept + i, lane);
  float w = 0.0f;
  int64_t from_host = 0;  // bytes (warp-uniform)
  for (int g = 0; g < p.kv.n_kv_heads; ++g) {
    float kx[kDpl];
    const int64_t ref = kv_row(p.kv, p.kv.block_table, t, g, lane);
    load_k<T, kDpl>(p.kv, ref, lane, kx);
    if (ref < 0) from_host += kv_row_bytes_of<T>(p.kv);
    for (int j = 0; j < p.group; ++j) {
      const int h = g * p.group + j;
      float dot = 0.0f;
FATHOM_UNROLL
      for (int d = 0; d < kDpl; ++d) {
        const int c = lane + 32 * d;
        if (c < p.kv.head_dim) {
          count_other(4);
          dot += p.q[static_cast<int64_t>(h) * p.kv.head_dim + c] * kx[d];
        }
      }
      const float logit = warp_sum(dot) * p.scale;
      w += expf(logit - load_uniform(p.lse + h, lane));
    }
  }
  if (lane == 0) {
    count_write(4);
    p.weights[i] = w;
  }
  add_host_bytes_uniform(p.kv, from_host, lane);
}

template <typename T>
cudaError_t launch_weights(const WeightsParams& p, int n_kept, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(n_kept));
  switch (dims_per_lane(p.kv.head_dim)) {
    case 1: FATHOM_LAUNCH((swa_weights_kernel<T, 1>), grid, dim3(32), 0, stream, p); break;
    case 2: FATHOM_LAUNCH((swa_weights_kernel<T, 2>), grid, dim3(32), 0, stream, p); break;
    case 4: FATHOM_LAUNCH((swa_weights_kernel<T, 4>), grid, dim3(32), 0, stream, p); break;
    default: FATHOM_LAUNCH((swa_weights_kernel<T, 8>), grid, dim3(32), 0, stream, p); break;
  }
  return cudaGetLastError();
}

}  // namespace swa_detail

SwaPlan plan_swa_attention(const PagedKvView& kv, const DecodeArgs& args, int32_t n_kept, int32_t keys_per_split) {
  SwaPlan p;
  p.n_kept = n_kept;
  p.group = kv.n_kv_heads > 0 ? std::max(1, args.n_heads / kv.n_kv_heads) : 1;
  p.rows_per_cta = attn_common::rows_per_cta(p.group, attn_common::dims_per_lane(kv.head_dim));
  p.head_tiles = (p.group + p.rows_per_cta - 1) / p.rows_per_cta;
  p.keys_per_split = std::max(1, keys_per_split);
  p.n_splits = std::max(1, (n_kept + p.keys_per_split - 1) / p.keys_per_split);
  const size_t H = static_cast<size_t>(std::max(0, args.n_heads));
  p.part = 0;
  p.lse = H * p.n_splits * (static_cast<size_t>(kv.head_dim) + 2);
  p.workspace_floats = p.lse + H;
  return p;
}

AttnBytes swa_attention_bytes(const PagedKvView& kv, const DecodeArgs& args, const SwaPlan& p) {
  const int64_t KV = kv.n_kv_heads, n = p.n_kept, H = args.n_heads, d = kv.head_dim;
  const int64_t row = static_cast<int64_t>(kv_row_bytes(kv.dtype, kv.head_dim));
  AttnBytes b;
  // Gather attention: every CTA reads its K and V rows and its list and block-table entries.
  b.kv_read += KV * p.head_tiles * n * 2 * row;
  b.other_read += KV * p.head_tiles * n * 8;
  b += attn_common::attend_partial_fixed_bytes(1, args.n_heads, kv.head_dim, p.n_splits, true);
  b += attn_common::merge_bytes(H, p.n_splits, kv.head_dim, false);
  // Per-head log-sum-exp of the partials.
  b.other_read += H * p.n_splits * 12;
  b.written += H * 4;
  // Weights: each kept position's K row per kv head again, its list and table entries, the queries and lse.
  b.kv_read += n * KV * row;
  b.other_read += n * (4 + KV * 4 + H * d * 4 + H * 4);
  b.written += n * 4;
  return b;
}

cudaError_t swa_attention(const PagedKvView& kv, const DecodeArgs& args, const int32_t* kept, const SwaPlan& plan,
                          float* weights, float* workspace, cudaStream_t stream) {
  using namespace attn_common;
  using namespace swa_detail;
  if (kv.head_dim < 1 || kv.head_dim > 256 || kv.n_kv_heads < 1 || args.n_heads % kv.n_kv_heads != 0 ||
      plan.n_kept < 1 || kept == nullptr || weights == nullptr || workspace == nullptr)
    return cudaErrorInvalidValue;
  AttendParams ap{};
  ap.kv = make_kv_dev(kv);
  ap.q = args.q;
  ap.out = args.out;
  ap.part_acc = workspace + plan.part;
  ap.part_ml = ap.part_acc + static_cast<size_t>(args.n_heads) * plan.n_splits * kv.head_dim;
  ap.n_heads = args.n_heads;
  ap.group = plan.group;
  ap.head_tiles = plan.head_tiles;
  ap.keys_per_split = plan.keys_per_split;
  ap.n_splits = plan.n_splits;
  ap.scale = args.scale;
  ap.partial_only = true;
  cudaError_t err = launch_attend(kv.dtype, plan.rows_per_cta, ap, KeptPositions{kept, plan.n_kept}, 1, stream);
  if (err != cudaSuccess) return err;
  MergeParams mp{};
  mp.part_acc = ap.part_acc;
  mp.part_ml = ap.part_ml;
  mp.out = args.out;
  mp.n_splits = plan.n_splits;
  mp.head_dim = kv.head_dim;
  mp.kv = ap.kv;
  mp.pos = args.pos;
  mp.group = plan.group;
  FATHOM_LAUNCH(merge_kernel<0>, dim3(static_cast<unsigned>(args.n_heads)), dim3(kThreads), 0, stream, mp);
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  LseParams lp{ap.part_ml, workspace + plan.lse, args.n_heads, plan.n_splits};
  FATHOM_LAUNCH(lse_kernel, dim3(1), dim3(kThreads), 0, stream, lp);
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  const WeightsParams wp{ap.kv, args.q, kept, workspace + plan.lse, weights, args.n_heads, plan.group, args.scale};
  switch (kv.dtype) {
    case KvDtype::kF32: return launch_weights<float>(wp, plan.n_kept, stream);
    case KvDtype::kF16: return launch_weights<__half>(wp, plan.n_kept, stream);
    case KvDtype::kI8: return launch_weights<uint8_t>(wp, plan.n_kept, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace fathom::cuda
