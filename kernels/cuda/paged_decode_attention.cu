// Split-K paged decode attention.
//   Pass 1, grid (n_splits, n_heads, n_q), 4 warps: each warp walks every 4th key of the chunk;
//   its 32 lanes split head_dim (lane c, c+32, ... : coalesced 128-byte rows), reduce q·k with
//   shuffles and keep an online softmax (max m, sum l, unnormalised acc). The 4 warp states meet
//   in shared memory. With one split the block writes the output directly; otherwise it writes
//   (acc, m, l) to the workspace and pass 2 merges the chunks: M = max m_s,
//   out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M).
// Bytes: each block reads its chunk of K and V once, but the `group` query heads that share a
// kv head are separate blocks, so KV is fetched once per query head (L2 absorbs part of the
// repeat). Processing a whole GQA group per block is the next step for this kernel.
#include "kernels/cuda/paged_decode_attention.h"

#include <algorithm>

namespace fathom::cuda {
namespace decode_attention_detail {  // named: tests include several .cu files in one TU

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kMaxHeadDim = 256;
constexpr unsigned kFullMask = 0xffffffffu;

struct DecodeParams {
  const void* k;               // [num_blocks][n_kv_heads][block_size][head_dim]
  const void* v;               // same layout as k
  const int32_t* block_table;  // logical block -> physical block
  const float* q;              // [n_q][n_heads][head_dim]
  float* out;                  // [n_q][n_heads][head_dim]
  float* part_acc;             // [n_q][n_heads][n_splits][head_dim]
  float* part_ml;              // [n_q][n_heads][n_splits][2]: running max, sum of exponentials
  int32_t block_size, n_kv_heads, head_dim;
  int32_t n_heads, pos0, window;
  int32_t keys_per_split, n_splits;
  float scale;
};

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

// T: KV element type; kDimsPerLane = ceil(head_dim / 32) rounded up to a power of two.
template <typename T, int kDimsPerLane>
__global__ void __launch_bounds__(kThreads) decode_partial_kernel(DecodeParams p) {
  __shared__ float acc_s[kWarps][32 * kDimsPerLane];
  __shared__ float m_s[kWarps];
  __shared__ float l_s[kWarps];
  const int split = static_cast<int>(blockIdx.x), h = static_cast<int>(blockIdx.y), qi = static_cast<int>(blockIdx.z);
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  const int d = p.head_dim;
  const int pos = p.pos0 + qi;
  const int lo = p.window > 0 ? max(0, pos - p.window + 1) : 0;
  const int start = lo + split * p.keys_per_split;
  const int end = min(pos + 1, start + p.keys_per_split);
  const int g = h / (p.n_heads / p.n_kv_heads);
  const T* __restrict__ k = static_cast<const T*>(p.k);
  const T* __restrict__ v = static_cast<const T*>(p.v);

  float q[kDimsPerLane], acc[kDimsPerLane];
  const float* qrow = p.q + (static_cast<int64_t>(qi) * p.n_heads + h) * d;
FATHOM_UNROLL
  for (int j = 0; j < kDimsPerLane; ++j) {
    const int c = lane + 32 * j;
    q[j] = c < d ? qrow[c] : 0.0f;
    acc[j] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int t = start + warp; t < end; t += kWarps) {
    const int64_t row = (static_cast<int64_t>(p.block_table[t / p.block_size]) * p.n_kv_heads + g) * p.block_size +
                        t % p.block_size;
    const T* krow = k + row * d;
    const T* vrow = v + row * d;
    float dot = 0.0f;
FATHOM_UNROLL
    for (int j = 0; j < kDimsPerLane; ++j) {
      const int c = lane + 32 * j;
      if (c < d) dot += q[j] * to_f32(krow[c]);
    }
    const float logit = warp_sum(dot) * p.scale;
    const float m_new = fmaxf(m, logit);
    const float correction = expf(m - m_new);  // 0 on the first key (m = -inf)
    const float weight = expf(logit - m_new);
    l = l * correction + weight;
FATHOM_UNROLL
    for (int j = 0; j < kDimsPerLane; ++j) {
      const int c = lane + 32 * j;
      acc[j] = acc[j] * correction + (c < d ? weight * to_f32(vrow[c]) : 0.0f);
    }
    m = m_new;
  }
FATHOM_UNROLL
  for (int j = 0; j < kDimsPerLane; ++j) acc_s[warp][lane + 32 * j] = acc[j];
  if (lane == 0) {
    m_s[warp] = m;
    l_s[warp] = l;
  }
  __syncthreads();

  float m_all = -INFINITY;
FATHOM_UNROLL
  for (int w = 0; w < kWarps; ++w) m_all = fmaxf(m_all, m_s[w]);
  float w_scale[kWarps];
  float l_all = 0.0f;
FATHOM_UNROLL
  for (int w = 0; w < kWarps; ++w) {
    w_scale[w] = m_s[w] == -INFINITY ? 0.0f : expf(m_s[w] - m_all);  // a warp without keys weighs 0
    l_all += l_s[w] * w_scale[w];
  }
  const int64_t head_row = static_cast<int64_t>(qi) * p.n_heads + h;
  for (int c = static_cast<int>(threadIdx.x); c < d; c += kThreads) {
    float o = 0.0f;
FATHOM_UNROLL
    for (int w = 0; w < kWarps; ++w) o += acc_s[w][c] * w_scale[w];
    if (p.n_splits == 1) {
      p.out[head_row * d + c] = o / l_all;
    } else {
      p.part_acc[(head_row * p.n_splits + split) * d + c] = o;
    }
  }
  if (p.n_splits > 1 && threadIdx.x == 0) {
    p.part_ml[(head_row * p.n_splits + split) * 2 + 0] = m_all;  // -inf for a chunk past the range
    p.part_ml[(head_row * p.n_splits + split) * 2 + 1] = l_all;
  }
}

// grid (n_heads, n_q), block kThreads: log-sum-exp merge of the splits of one (query, head).
__global__ void __launch_bounds__(kThreads) decode_merge_kernel(DecodeParams p) {
  const int h = static_cast<int>(blockIdx.x), qi = static_cast<int>(blockIdx.y);
  const int d = p.head_dim;
  const int64_t head_row = static_cast<int64_t>(qi) * p.n_heads + h;
  const float* ml = p.part_ml + head_row * p.n_splits * 2;
  const float* acc = p.part_acc + head_row * p.n_splits * d;
  float m_all = -INFINITY;
  for (int s = 0; s < p.n_splits; ++s) m_all = fmaxf(m_all, ml[2 * s]);
  float l_all = 0.0f;
  for (int s = 0; s < p.n_splits; ++s) {
    if (ml[2 * s] != -INFINITY) l_all += ml[2 * s + 1] * expf(ml[2 * s] - m_all);
  }
  const float inv_l = 1.0f / l_all;
  for (int c = static_cast<int>(threadIdx.x); c < d; c += kThreads) {
    float o = 0.0f;
    for (int s = 0; s < p.n_splits; ++s) {
      if (ml[2 * s] != -INFINITY) o += acc[static_cast<int64_t>(s) * d + c] * expf(ml[2 * s] - m_all);
    }
    p.out[head_row * d + c] = o * inv_l;
  }
}

template <typename T>
cudaError_t launch_partial(const DecodeParams& p, dim3 grid, cudaStream_t stream) {
  void (*kernel)(DecodeParams) = nullptr;
  if (p.head_dim <= 32) {
    kernel = decode_partial_kernel<T, 1>;
  } else if (p.head_dim <= 64) {
    kernel = decode_partial_kernel<T, 2>;
  } else if (p.head_dim <= 128) {
    kernel = decode_partial_kernel<T, 4>;
  } else {
    kernel = decode_partial_kernel<T, 8>;
  }
  FATHOM_LAUNCH(kernel, grid, dim3(kThreads), 0, stream, p);
  return cudaGetLastError();
}

int32_t longest_key_range(const AttentionArgs& a) {
  const int32_t last = a.pos0 + a.n_q - 1;  // the last query sees the most keys
  return a.window > 0 ? std::min(a.window, last + 1) : last + 1;
}

}  // namespace decode_attention_detail

DecodeAttentionPlan plan_paged_decode_attention(const PagedKvView& kv, const AttentionArgs& args,
                                                int32_t keys_per_split) {
  using decode_attention_detail::longest_key_range;
  DecodeAttentionPlan plan;
  plan.keys_per_split = std::max<int32_t>(1, keys_per_split);
  plan.n_splits = std::max<int32_t>(1, (longest_key_range(args) + plan.keys_per_split - 1) / plan.keys_per_split);
  plan.workspace_floats = plan.n_splits == 1 ? 0
                                             : static_cast<size_t>(args.n_q) * args.n_heads * plan.n_splits *
                                                   (static_cast<size_t>(kv.head_dim) + 2);
  return plan;
}

cudaError_t paged_decode_attention(const PagedKvView& kv, const AttentionArgs& args, const DecodeAttentionPlan& plan,
                                   float* workspace, cudaStream_t stream) {
  using decode_attention_detail::DecodeParams;
  using decode_attention_detail::kMaxHeadDim;
  using decode_attention_detail::kThreads;
  using decode_attention_detail::launch_partial;
  using decode_attention_detail::decode_merge_kernel;
  if (args.n_q == 0 || args.n_heads == 0) return cudaSuccess;
  if (kv.head_dim <= 0 || kv.head_dim > kMaxHeadDim || kv.n_kv_heads <= 0 || args.n_heads % kv.n_kv_heads != 0 ||
      kv.block_size <= 0 || args.n_q < 0 || args.pos0 < 0 || plan.keys_per_split <= 0 || plan.n_splits <= 0 ||
      (plan.n_splits > 1 && workspace == nullptr) || args.n_q > 65535 || args.n_heads > 65535) {
    return cudaErrorInvalidValue;
  }
  DecodeParams p{};
  p.k = kv.k;
  p.v = kv.v;
  p.block_table = kv.block_table;
  p.q = args.q;
  p.out = args.out;
  p.part_acc = workspace;
  p.part_ml = workspace == nullptr
                  ? nullptr
                  : workspace + static_cast<size_t>(args.n_q) * args.n_heads * plan.n_splits * kv.head_dim;
  p.block_size = kv.block_size;
  p.n_kv_heads = kv.n_kv_heads;
  p.head_dim = kv.head_dim;
  p.n_heads = args.n_heads;
  p.pos0 = args.pos0;
  p.window = args.window;
  p.keys_per_split = plan.keys_per_split;
  p.n_splits = plan.n_splits;
  p.scale = args.scale;
  const dim3 grid(static_cast<unsigned>(plan.n_splits), static_cast<unsigned>(args.n_heads),
                  static_cast<unsigned>(args.n_q));
  cudaError_t err = cudaSuccess;
  switch (kv.dtype) {
    case KvDtype::kF32: err = launch_partial<float>(p, grid, stream); break;
    case KvDtype::kF16: err = launch_partial<__half>(p, grid, stream); break;
    case KvDtype::kI8: return cudaErrorInvalidValue;  // INT8 KV: not yet in this kernel
  }
  if (err != cudaSuccess || plan.n_splits == 1) return err;
  FATHOM_LAUNCH(decode_merge_kernel, dim3(static_cast<unsigned>(args.n_heads), static_cast<unsigned>(args.n_q)),
                dim3(kThreads), 0, stream, p);
  return cudaGetLastError();
}

}  // namespace fathom::cuda
