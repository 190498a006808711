// SparQ decode attention: approximate scores from r query components, top-k gather, exact
// attention over the gathered rows, mean-value reallocation. See sparq_attention.h for the steps.
#include "kernels/cuda/sparq_attention.h"

#include <algorithm>
#include <cstring>

namespace fathom::cuda {
namespace sparq_detail {  // named: the kernels' names stay unique across the .cu files

using namespace attn_common;

constexpr int kMaxGroup = 8;

struct SparqParams {
  KvDev kv;
  const float* q;  // [n_heads][head_dim]
  int32_t* words;  // the workspace (SparqPlan offsets)
  int32_t S, r, k, l, group;
  bool key_spread;
  int32_t score_keys_per_split, score_splits;
  size_t scores, summed, score_ml, i1, i2, alpha;
  float scale;
};

__device__ __forceinline__ float* fptr(const SparqParams& p, size_t off) { return reinterpret_cast<float*>(p.words + off); }

// grid (score_splits, n_kv_heads), kThreads.
template <typename T>
__global__ void __launch_bounds__(kThreads) sparq_scores_kernel(SparqParams p) {
  __shared__ float q_s[kMaxGroup][kMaxHeadDim];
  __shared__ float qsel_s[kMaxGroup][kMaxHeadDim];
  __shared__ float a_s[kMaxHeadDim];
  __shared__ float w_s[kMaxHeadDim];  // step 1's weight per component: √σ[c], or 1
  __shared__ int i1_s[kMaxHeadDim];
  __shared__ float factor_s[kMaxGroup];
  __shared__ float red_s[32];
  const int split = static_cast<int>(blockIdx.x), g = static_cast<int>(blockIdx.y);
  const int tid = static_cast<int>(threadIdx.x), d = p.kv.head_dim, G = p.group, S = p.S;
  for (int i = tid; i < G * d; i += kThreads) {
    q_s[i / d][i % d] = p.q[static_cast<int64_t>(g) * G * d + i];
    count_other(sizeof(float));
  }
  // The keys' spread over [0, pos] from the M2 row of the moments at the tile of pos (either tier).
  const float* m2 = nullptr;
  if (p.key_spread) {
    const int32_t blk = p.kv.block_table[(S - 1) / p.kv.block_size];
    m2 = (blk < 0 ? p.kv.host.k_moments : p.kv.k_moments) + (slot_of_entry(blk) * p.kv.n_kv_heads + g) * 2 * d + d;
    if (tid == 0) {
      count_other(sizeof(int32_t));
      if (blk < 0 && p.kv.host_read != nullptr) atomicAdd(p.kv.host_read, static_cast<unsigned long long>(d) * 4);
    }
  }
  for (int c = tid; c < d; c += kThreads) {
    w_s[c] = m2 != nullptr ? sqrtf(key_spread_of_m2(m2[c], S)) : 1.0f;
    if (m2 != nullptr) count_kv(sizeof(float));
  }
  __syncthreads();
  // Step 1: a = Σ_group |q|·w; I1 = top-r by rank (ties: lower index), i1_s in rank order.
  for (int c = tid; c < d; c += kThreads) {
    float a = 0.0f;
    for (int j = 0; j < G; ++j) a += fabsf(q_s[j][c]) * w_s[c];
    a_s[c] = a;
  }
  __syncthreads();
  for (int c = tid; c < d; c += kThreads) {
    const float a = a_s[c];
    int rank = 0;
    for (int c2 = 0; c2 < d; ++c2) {
      const float b = a_s[c2];
      rank += (b > a || (b == a && c2 < c)) ? 1 : 0;
    }
    if (rank < p.r) i1_s[rank] = c;
  }
  __syncthreads();
  // Step 2's temperature: factor_h = scale·√(‖q_h·w‖₁ / ‖(q_h·w)[I1]‖₁).
  if (tid < G) {
    float l1 = 0.0f, l1_r = 0.0f;
    for (int c = 0; c < d; ++c) l1 += fabsf(q_s[tid][c]) * w_s[c];
    for (int i = 0; i < p.r; ++i) l1_r += fabsf(q_s[tid][i1_s[i]]) * w_s[i1_s[i]];
    factor_s[tid] = p.scale * (l1_r > 0.0f ? sqrtf(l1 / l1_r) : 1.0f);
  }
  for (int i = tid; i < G * p.r; i += kThreads) qsel_s[i / p.r][i % p.r] = q_s[i / p.r][i1_s[i % p.r]];
  if (split == 0 && tid < p.r) {
    p.words[p.i1 + static_cast<size_t>(g) * p.r + tid] = i1_s[tid];
    count_write(sizeof(int32_t));
  }
  __syncthreads();
  // ŝ_h[t] for this chunk, one key per thread (consecutive threads: consecutive slots of a k_t row).
  float m[kMaxGroup], l[kMaxGroup];
FATHOM_UNROLL
  for (int j = 0; j < kMaxGroup; ++j) {
    m[j] = -INFINITY;
    l[j] = 0.0f;
  }
  // Step 1 reads the transposed K where stored (r rows of each tile), else K's rows; in the tier
  // the block's table entry names.
  const bool kt = p.kv.k_t != nullptr;
  const T* __restrict__ kbase_dev = static_cast<const T*>(kt ? p.kv.k_t : p.kv.k);
  const T* __restrict__ kbase_host = static_cast<const T*>(kt ? p.kv.host.k_t : p.kv.host.k);
  const int begin = split * p.score_keys_per_split, end = min(S, begin + p.score_keys_per_split);
  const int bs = p.kv.block_size;
  int64_t from_host = 0;  // this thread's reads of the host tier, bytes
  for (int t = begin + tid; t < end; t += kThreads) {
    const int32_t blk = p.kv.block_table[t / bs];
    count_other(sizeof(int32_t));
    const bool host = blk < 0;
    const int64_t tile = slot_of_entry(blk) * p.kv.n_kv_heads + g, row = tile * bs + t % bs;
    const T* __restrict__ kbase = host ? kbase_host : kbase_dev;
    if (host) from_host += static_cast<int64_t>(p.r) * sizeof(T) + (std::is_same_v<T, uint8_t> ? sizeof(KvInt8Row) : 0);
    float scale8 = 1.0f, offset8 = 0.0f;
    if constexpr (std::is_same_v<T, uint8_t>) {
      const KvInt8Row rp = (host ? p.kv.host.k_rows : p.kv.k_rows)[row];
      count_kv(sizeof(KvInt8Row));
      scale8 = rp.scale;
      offset8 = rp.min;
    }
    float dots[kMaxGroup];
FATHOM_UNROLL
    for (int j = 0; j < kMaxGroup; ++j) dots[j] = 0.0f;
    for (int i = 0; i < p.r; ++i) {
      const int c = i1_s[i];
      const int64_t off = kt ? (tile * d + c) * bs + t % bs : row * d + c;
      float x = to_f32(kbase[off]);
      count_kv(sizeof(T));
      if constexpr (std::is_same_v<T, uint8_t>) x = scale8 * x + offset8;
FATHOM_UNROLL
      for (int j = 0; j < kMaxGroup; ++j) {
        if (j < G) dots[j] += qsel_s[j][i] * x;
      }
    }
    float sum = 0.0f;
FATHOM_UNROLL
    for (int j = 0; j < kMaxGroup; ++j) {
      if (j < G) {
        const float s = dots[j] * factor_s[j];
        fptr(p, p.scores)[static_cast<int64_t>(g * G + j) * S + t] = s;
        count_write(sizeof(float));
        sum += s;
        const float m_new = fmaxf(m[j], s);
        l[j] = l[j] * expf(m[j] - m_new) + expf(s - m_new);
        m[j] = m_new;
      }
    }
    fptr(p, p.summed)[static_cast<int64_t>(g) * S + t] = sum;
    count_write(sizeof(float));
  }
  add_host_bytes_lanes(p.kv, from_host, tid % 32);
  // Per-chunk softmax statistics of ŝ_h (for α's denominator).
FATHOM_UNROLL
  for (int j = 0; j < kMaxGroup; ++j) {
    if (j < G) {
      const float mx = block_reduce(m[j], true, red_s);
      const float lx = block_reduce(m[j] == -INFINITY ? 0.0f : l[j] * expf(m[j] - mx), false, red_s);
      if (tid == 0) {
        float* ml = fptr(p, p.score_ml) + (static_cast<int64_t>(g * G + j) * p.score_splits + split) * 2;
        ml[0] = mx;
        ml[1] = lx;
        count_write(2 * sizeof(float));
      }
    }
  }
}

// grid (n_kv_heads), kThreads.
__global__ void __launch_bounds__(kThreads) sparq_select_kernel(SparqParams p) {
  __shared__ int hist[256];
  __shared__ int scratch[40];
  __shared__ uint32_t prefix_s;
  __shared__ int need_s;
  __shared__ float red_s[32];
  const int g = static_cast<int>(blockIdx.x), tid = static_cast<int>(threadIdx.x);
  const int S = p.S, n_cand = S - p.l, n_rest = p.k - p.l, G = p.group;
  const float* summed = fptr(p, p.summed) + static_cast<int64_t>(g) * S;
  int32_t* sel = p.words + p.i2 + static_cast<size_t>(g) * p.k;
  if (n_rest > 0) {
    // The n_rest best candidates by Σŝ (ties: the lower position), in ascending order.
    auto key_of = [&](int t) {
      count_other(sizeof(float));
      return ordered_key(summed[t]);
    };
    int need = 0;
    const uint32_t threshold = block_radix_select(key_of, n_cand, n_rest, hist, &prefix_s, &need_s, &need);
    block_select_ascending(key_of, n_cand, threshold, need, sel, scratch);
    if (tid == 0) count_write(static_cast<int64_t>(n_rest) * sizeof(int32_t));
  }
  for (int i = tid; i < p.l; i += kThreads) {  // the forced window, by flag (never by score)
    sel[n_rest + i] = S - p.l + i;
    count_write(sizeof(int32_t));
  }
  __syncthreads();
  // α_h = Σ_{t∈I2} e^(ŝ_h[t] − M_h) / L_h, (M_h, L_h) merged from the score chunks.
  for (int j = 0; j < G; ++j) {
    const int h = g * G + j;
    const float* ml = fptr(p, p.score_ml) + static_cast<int64_t>(h) * p.score_splits * 2;
    float M = -INFINITY, L = 0.0f;
    for (int s = 0; s < p.score_splits; ++s) M = fmaxf(M, ml[2 * s]);
    for (int s = 0; s < p.score_splits; ++s) L += ml[2 * s + 1] * expf(ml[2 * s] - M);
    if (tid == 0) count_other(static_cast<int64_t>(p.score_splits) * 2 * sizeof(float));
    const float* scores = fptr(p, p.scores) + static_cast<int64_t>(h) * S;
    float num = 0.0f;
    for (int i = tid; i < p.k; i += kThreads) {
      num += expf(scores[sel[i]] - M);
      count_other(sizeof(int32_t) + sizeof(float));
    }
    num = block_reduce(num, false, red_s);
    if (tid == 0) {
      fptr(p, p.alpha)[h] = num / L;
      count_write(sizeof(float));
    }
  }
}

// Gathered positions: I2 of kv head g.
struct ListPositions {
  const int32_t* sel;  // [n_kv_heads][k]
  int32_t k;
  __device__ __forceinline__ int count(int, int, int) const { return k; }
  __device__ __forceinline__ int at(int, int g, int, int i, int lane) const {
    return load_uniform(sel + static_cast<int64_t>(g) * k + i, lane);
  }
};

}  // namespace sparq_detail

SparqPlan plan_sparq_decode_attention(const PagedKvView& kv, const DecodeArgs& args, const SparqConfig& config,
                                      int32_t score_keys_per_split, int32_t attend_keys_per_split) {
  SparqPlan p;
  const int32_t d = kv.head_dim;
  p.S = args.pos + 1;
  p.group = kv.n_kv_heads > 0 ? std::max(1, args.n_heads / kv.n_kv_heads) : 1;
  p.r = std::clamp(config.r < 0 ? d / 8 : config.r, 1, std::max(1, d));
  p.k = std::clamp(config.k, 1, p.S);
  p.l = std::clamp(config.l < 0 ? config.k / 4 : config.l, 1, p.k);
  p.reallocation = config.reallocation;
  p.key_spread = config.key_spread;
  p.score_keys_per_split = std::max(1, score_keys_per_split);
  p.score_splits = (p.S + p.score_keys_per_split - 1) / p.score_keys_per_split;
  p.attend_keys_per_split = std::max(1, attend_keys_per_split);
  p.attend_splits = (p.k + p.attend_keys_per_split - 1) / p.attend_keys_per_split;
  p.rows_per_cta = attn_common::rows_per_cta(p.group, attn_common::dims_per_lane(d));
  p.head_tiles = (p.group + p.rows_per_cta - 1) / p.rows_per_cta;
  const size_t H = static_cast<size_t>(std::max(0, args.n_heads)), KV = static_cast<size_t>(std::max(0, kv.n_kv_heads));
  size_t off = 0;
  p.scores = off, off += H * p.S;
  p.summed = off, off += KV * p.S;
  p.score_ml = off, off += H * p.score_splits * 2;
  p.i1 = off, off += KV * p.r;
  p.i2 = off, off += KV * p.k;
  p.alpha = off, off += H;
  p.part = off, off += H * p.attend_splits * (static_cast<size_t>(d) + 2);
  p.workspace_words = off;
  return p;
}

AttnBytes sparq_decode_attention_bytes(const PagedKvView& kv, const DecodeArgs& args, const SparqPlan& p) {
  const int64_t d = kv.head_dim, KV = kv.n_kv_heads, G = p.group, S = p.S, k = p.k;
  const int64_t elem = static_cast<int64_t>(kv_dtype_bytes(kv.dtype));
  const int64_t params = kv.dtype == KvDtype::kI8 ? static_cast<int64_t>(sizeof(KvInt8Row)) : 0;
  AttnBytes b;
  // 1: scores.
  b.other_read += KV * (p.score_splits * G * d * 4 + S * 4);
  b.kv_read += KV * S * (p.r * elem + params);
  if (p.key_spread) {  // each block reads the M2 row of its kv head and its block-table entry
    b.kv_read += KV * p.score_splits * d * 4;
    b.other_read += KV * p.score_splits * 4;
  }
  b.written += KV * (p.r * 4 + S * (G + 1) * 4 + G * p.score_splits * 8);
  // 2: select and α.
  const int64_t n_cand = S - p.l;
  b.other_read += KV * ((p.k > p.l ? 6 * n_cand * 4 : 0) + G * (p.score_splits * 8 + k * 8));
  b.written += KV * (k * 4 + G * 4);
  // 3: gather attention (each block re-reads its I2 entries and block-table entries).
  const int64_t ctas_per_key = KV * p.head_tiles;
  b.kv_read += ctas_per_key * k * 2 * static_cast<int64_t>(kv_row_bytes(kv.dtype, kv.head_dim));
  b.other_read += ctas_per_key * k * 8;
  b += attn_common::attend_partial_fixed_bytes(1, args.n_heads, kv.head_dim, p.attend_splits, true);
  // 4: merge (+ reallocation).
  b += attn_common::merge_bytes(args.n_heads, p.attend_splits, kv.head_dim, p.reallocation);
  return b;
}

cudaError_t sparq_decode_attention(const PagedKvView& kv, const DecodeArgs& args, const SparqPlan& plan,
                                   void* workspace, cudaStream_t stream) {
  using namespace attn_common;
  using namespace sparq_detail;
  if (args.n_heads == 0) return cudaSuccess;
  if (kv.head_dim <= 0 || kv.head_dim > kMaxHeadDim || kv.n_kv_heads <= 0 || args.n_heads % kv.n_kv_heads != 0 ||
      args.n_heads / kv.n_kv_heads > kMaxGroup || kv.block_size <= 0 || args.pos < 0 || workspace == nullptr ||
      plan.S != args.pos + 1 || plan.group != args.n_heads / kv.n_kv_heads || kv.n_kv_heads > 65535 ||
      (plan.reallocation && kv.v_sum == nullptr) || (plan.key_spread && kv.k_moments == nullptr) ||
      (kv.dtype == KvDtype::kI8 && (kv.k_rows == nullptr || kv.v_rows == nullptr))) {
    return cudaErrorInvalidValue;
  }
  SparqParams sp{};
  sp.kv = make_kv_dev(kv);
  sp.q = args.q;
  sp.words = static_cast<int32_t*>(workspace);
  sp.S = plan.S;
  sp.r = plan.r;
  sp.k = plan.k;
  sp.l = plan.l;
  sp.group = plan.group;
  sp.key_spread = plan.key_spread;
  sp.score_keys_per_split = plan.score_keys_per_split;
  sp.score_splits = plan.score_splits;
  sp.scores = plan.scores;
  sp.summed = plan.summed;
  sp.score_ml = plan.score_ml;
  sp.i1 = plan.i1;
  sp.i2 = plan.i2;
  sp.alpha = plan.alpha;
  sp.scale = args.scale;
  const dim3 score_grid(static_cast<unsigned>(plan.score_splits), static_cast<unsigned>(kv.n_kv_heads));
  switch (kv.dtype) {
    case KvDtype::kF32: FATHOM_LAUNCH(sparq_scores_kernel<float>, score_grid, dim3(kThreads), 0, stream, sp); break;
    case KvDtype::kF16: FATHOM_LAUNCH(sparq_scores_kernel<__half>, score_grid, dim3(kThreads), 0, stream, sp); break;
    case KvDtype::kI8: FATHOM_LAUNCH(sparq_scores_kernel<uint8_t>, score_grid, dim3(kThreads), 0, stream, sp); break;
  }
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  FATHOM_LAUNCH(sparq_select_kernel, dim3(static_cast<unsigned>(kv.n_kv_heads)), dim3(kThreads), 0, stream, sp);
  if ((err = cudaGetLastError()) != cudaSuccess) return err;

  float* base = static_cast<float*>(workspace);
  AttendParams ap{};
  ap.kv = sp.kv;
  ap.q = args.q;
  ap.out = args.out;
  ap.part_acc = base + plan.part;
  ap.part_ml = base + plan.part + static_cast<size_t>(args.n_heads) * plan.attend_splits * kv.head_dim;
  ap.n_heads = args.n_heads;
  ap.group = plan.group;
  ap.head_tiles = plan.head_tiles;
  ap.keys_per_split = plan.attend_keys_per_split;
  ap.n_splits = plan.attend_splits;
  ap.scale = args.scale;
  ap.partial_only = true;
  const ListPositions positions{static_cast<const int32_t*>(workspace) + plan.i2, plan.k};
  if ((err = launch_attend(kv.dtype, plan.rows_per_cta, ap, positions, 1, stream)) != cudaSuccess) return err;
  MergeParams mp{};
  mp.part_acc = ap.part_acc;
  mp.part_ml = ap.part_ml;
  mp.out = args.out;
  mp.n_splits = plan.attend_splits;
  mp.head_dim = kv.head_dim;
  mp.alpha = plan.reallocation ? base + plan.alpha : nullptr;
  mp.kv = sp.kv;
  mp.pos = args.pos;
  mp.group = plan.group;
  FATHOM_LAUNCH(merge_kernel<0>, dim3(static_cast<unsigned>(args.n_heads)), dim3(kThreads), 0, stream, mp);
  return cudaGetLastError();
}

}  // namespace fathom::cuda
