// KV append, two kernels on one stream:
//   rows:  grid (n_tokens, n_kv_heads), block 128. The block finds its token's sequence by a
//          binary search of seq_token_start (broadcast loads), then its threads stride over
//          head_dim: coalesced reads of the f32 rows, coalesced writes of the K and V rows, and
//          the k_t column (stride block_size elements: scattered, but head_dim elements per
//          token only). INT8: min and max of the row by warp shuffles + shared memory first,
//          then the same rounding as cpu::kv_store_int8_row (rintf = nearbyint, nearest even).
//   sums:  grid (n_seqs, n_kv_heads), block 128; thread c owns dimension c (and c + 128, ...)
//          and walks its sequence's new tokens in order with the running V sum and K moments in
//          registers (read once before the first token: this block's, or the previous block's
//          when it opens a block; written at each block's last new row). One thread per
//          dimension makes the sequential dependency free of races and reproduces the one-by-one
//          updates exactly; the serial walk is a few flops per token and thread.
#include "kernels/cuda/kv_append.h"

#include "kernels/paged_kv.h"

namespace fathom::cuda {
namespace kv_append_detail {  // named: the kernels' names stay unique across the .cu files

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFullMask = 0xffffffffu;

// Index of the sequence owning token i: the last s with start[s] <= i.
__device__ __forceinline__ int find_seq(const int32_t* start, int n_seqs, int i) {
  int lo = 0, hi = n_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (start[mid] <= i) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

template <KvStoreType kType>
struct Store;
template <>
struct Store<KvStoreType::kF32> {
  using T = float;
  __device__ static T cvt(float x) { return x; }
};
template <>
struct Store<KvStoreType::kF16> {
  using T = __half;
  __device__ static T cvt(float x) { return __float2half_rn(x); }
};
template <>
struct Store<KvStoreType::kBF16> {
  using T = __nv_bfloat16;
  __device__ static T cvt(float x) { return __float2bfloat16_rn(x); }
};

// Block-wide min and max of `lo`/`hi` (every thread of the block calls it).
__device__ __forceinline__ void block_min_max(float* lo, float* hi) {
  __shared__ float s_lo[kWarps], s_hi[kWarps];
  float a = *lo, b = *hi;
  for (int offset = 16; offset > 0; offset >>= 1) {
    a = fminf(a, __shfl_xor_sync(kFullMask, a, offset));
    b = fmaxf(b, __shfl_xor_sync(kFullMask, b, offset));
  }
  const int warp = static_cast<int>(threadIdx.x) / 32;
  if (threadIdx.x % 32 == 0) {
    s_lo[warp] = a;
    s_hi[warp] = b;
  }
  __syncthreads();
  a = s_lo[0];
  b = s_hi[0];
  for (int w = 1; w < kWarps; ++w) {
    a = fminf(a, s_lo[w]);
    b = fmaxf(b, s_hi[w]);
  }
  __syncthreads();  // s_lo / s_hi are reused by the next row's call
  *lo = a;
  *hi = b;
}

// Quantizes one row of d floats into dst (cpu::kv_store_int8_row) and returns its parameters
// via `row` (written by thread 0); also mirrors the bytes into a k_t column when kt != null.
__device__ __forceinline__ void store_int8_row(const float* src, int d, uint8_t* dst, KvInt8Row* row, uint8_t* kt,
                                               int kt_stride) {
  float lo = INFINITY, hi = -INFINITY;
  for (int c = static_cast<int>(threadIdx.x); c < d; c += kThreads) {
    lo = fminf(lo, src[c]);
    hi = fmaxf(hi, src[c]);
  }
  block_min_max(&lo, &hi);
  const float scale = (hi - lo) / 255.0f;
  if (threadIdx.x == 0) {
    row->scale = scale;
    row->min = lo;
  }
  const float inv = scale == 0.0f ? 0.0f : 1.0f / scale;
  for (int c = static_cast<int>(threadIdx.x); c < d; c += kThreads) {
    const uint8_t q = scale == 0.0f ? 0 : static_cast<uint8_t>(fminf(fmaxf(rintf((src[c] - lo) * inv), 0.0f), 255.0f));
    dst[c] = q;
    if (kt) kt[static_cast<int64_t>(c) * kt_stride] = q;
  }
}

// grid (n_tokens, n_kv_heads), block (kThreads)
template <KvStoreType kType>
__global__ void __launch_bounds__(kThreads) kv_rows_kernel(KvCacheLayer cache, KvAppendBatch batch) {
  const int i = static_cast<int>(blockIdx.x), h = static_cast<int>(blockIdx.y);
  const int s = find_seq(batch.seq_token_start, batch.n_seqs, i);
  const int32_t pos = batch.positions[i];
  const int bs = cache.block_size, d = cache.head_dim;
  const int64_t tile = static_cast<int64_t>(batch.block_tables[static_cast<int64_t>(s) * batch.table_stride + pos / bs]) *
                           cache.n_kv_heads + h;
  const int slot = pos % bs;
  const int64_t row = tile * bs + slot;  // row index, also into k_rows / v_rows
  const float* kr = batch.k + static_cast<int64_t>(i) * batch.k_token_stride + static_cast<int64_t>(h) * d;
  const float* vr = batch.v + static_cast<int64_t>(i) * batch.v_token_stride + static_cast<int64_t>(h) * d;
  const int64_t kt_col = tile * bs * d + slot;  // element (c, slot) of the tile at kt_col + c * bs
  if constexpr (kType == KvStoreType::kI8) {
    uint8_t* kt = cache.k_t ? static_cast<uint8_t*>(cache.k_t) + kt_col : nullptr;
    store_int8_row(kr, d, static_cast<uint8_t*>(cache.k) + row * d, cache.k_rows + row, kt, bs);
    store_int8_row(vr, d, static_cast<uint8_t*>(cache.v) + row * d, cache.v_rows + row, nullptr, 0);
  } else {
    using T = typename Store<kType>::T;
    T* kd = static_cast<T*>(cache.k) + row * d;
    T* vd = static_cast<T*>(cache.v) + row * d;
    T* kt = cache.k_t ? static_cast<T*>(cache.k_t) + kt_col : nullptr;
    for (int c = static_cast<int>(threadIdx.x); c < d; c += kThreads) {
      const T kq = Store<kType>::cvt(kr[c]);
      kd[c] = kq;
      vd[c] = Store<kType>::cvt(vr[c]);
      if (kt) kt[static_cast<int64_t>(c) * bs] = kq;
    }
  }
}

// grid (n_seqs, n_kv_heads), block (kThreads): the running V sums and K moments, thread c owning
// dimension c (and c + kThreads, ...) of one sequence's new tokens in position order. The running
// values live in registers: read once from the position before the first new token, written
// where a block's last new row is (what a block's entry holds).
__global__ void __launch_bounds__(kThreads) kv_sums_kernel(KvCacheLayer cache, KvAppendBatch batch) {
  const int s = static_cast<int>(blockIdx.x), h = static_cast<int>(blockIdx.y);
  const int bs = cache.block_size, d = cache.head_dim;
  const int32_t* table = batch.block_tables + static_cast<int64_t>(s) * batch.table_stride;
  const int first = batch.seq_token_start[s], last = batch.seq_token_start[s + 1];
  if (first == last) return;
  const int32_t pos0 = batch.positions[first];
  // The sums before pos0: its own block's tile, or at a block's first slot the previous block's.
  const int64_t before = pos0 % bs != 0 ? static_cast<int64_t>(table[pos0 / bs]) * cache.n_kv_heads + h
                         : pos0 > 0     ? static_cast<int64_t>(table[pos0 / bs - 1]) * cache.n_kv_heads + h
                                        : -1;
  for (int c = static_cast<int>(threadIdx.x); c < d; c += kThreads) {
    float v_run = 0.0f, mean = 0.0f, m2 = 0.0f;
    if (before >= 0) {
      if (cache.v_sum) v_run = cache.v_sum[before * d + c];
      if (cache.k_moments) {
        mean = cache.k_moments[before * 2 * d + c];
        m2 = cache.k_moments[before * 2 * d + d + c];
      }
    }
    for (int i = first; i < last; ++i) {
      const int32_t pos = batch.positions[i];
      v_run += batch.v[static_cast<int64_t>(i) * batch.v_token_stride + static_cast<int64_t>(h) * d + c];
      key_moments_update(batch.k[static_cast<int64_t>(i) * batch.k_token_stride + static_cast<int64_t>(h) * d + c], pos, mean, m2);
      if (batch.running != nullptr && batch.running_row[s] >= 0) {
        float* out = batch.running + ((static_cast<int64_t>(batch.running_row[s]) + (i - first)) * cache.n_kv_heads + h) * 3 * d;
        out[c] = v_run;
        out[d + c] = mean;
        out[2 * d + c] = m2;
      }
      if (i + 1 < last && (pos + 1) % bs != 0) continue;  // not the block's last new row
      const int64_t tile = static_cast<int64_t>(table[pos / bs]) * cache.n_kv_heads + h;
      if (cache.v_sum) cache.v_sum[tile * d + c] = v_run;
      if (cache.k_moments) {
        cache.k_moments[tile * 2 * d + c] = mean;
        cache.k_moments[tile * 2 * d + d + c] = m2;
      }
    }
  }
}

// grid (n_kv_heads), block (kThreads): block `block`'s running planes from `running`.
__global__ void __launch_bounds__(kThreads) kv_set_running_kernel(KvCacheLayer cache, int32_t block, const float* running) {
  const int h = static_cast<int>(blockIdx.x), d = cache.head_dim;
  const int64_t tile = static_cast<int64_t>(block) * cache.n_kv_heads + h;
  const float* in = running + static_cast<int64_t>(h) * 3 * d;
  for (int c = static_cast<int>(threadIdx.x); c < d; c += kThreads) {
    if (cache.v_sum) cache.v_sum[tile * d + c] = in[c];
    if (cache.k_moments) {
      cache.k_moments[tile * 2 * d + c] = in[d + c];
      cache.k_moments[tile * 2 * d + d + c] = in[2 * d + c];
    }
  }
}

// grid (n_kv_heads), block (kThreads): block `block`'s running planes into `running` (the
// layout kv_set_running_kernel reads; planes the layer lacks are left as they are).
__global__ void __launch_bounds__(kThreads) kv_get_running_kernel(KvCacheLayer cache, int32_t block, float* running) {
  const int h = static_cast<int>(blockIdx.x), d = cache.head_dim;
  const int64_t tile = static_cast<int64_t>(block) * cache.n_kv_heads + h;
  float* out = running + static_cast<int64_t>(h) * 3 * d;
  for (int c = static_cast<int>(threadIdx.x); c < d; c += kThreads) {
    if (cache.v_sum) out[c] = cache.v_sum[tile * d + c];
    if (cache.k_moments) {
      out[d + c] = cache.k_moments[tile * 2 * d + c];
      out[2 * d + c] = cache.k_moments[tile * 2 * d + d + c];
    }
  }
}

}  // namespace kv_append_detail

cudaError_t kv_get_running(const KvCacheLayer& cache, int32_t block, float* running, cudaStream_t stream) {
  using namespace kv_append_detail;
  if (block < 0 || !running || cache.n_kv_heads <= 0 || cache.n_kv_heads > 65535 || cache.head_dim <= 0)
    return cudaErrorInvalidValue;
  if (!cache.v_sum && !cache.k_moments) return cudaSuccess;
  FATHOM_LAUNCH(kv_get_running_kernel, dim3(static_cast<unsigned>(cache.n_kv_heads)), dim3(kThreads), 0, stream, cache,
                block, running);
  return cudaGetLastError();
}

cudaError_t kv_set_running(const KvCacheLayer& cache, int32_t block, const float* running, cudaStream_t stream) {
  using namespace kv_append_detail;
  if (block < 0 || !running || cache.n_kv_heads <= 0 || cache.n_kv_heads > 65535 || cache.head_dim <= 0)
    return cudaErrorInvalidValue;
  if (!cache.v_sum && !cache.k_moments) return cudaSuccess;
  FATHOM_LAUNCH(kv_set_running_kernel, dim3(static_cast<unsigned>(cache.n_kv_heads)), dim3(kThreads), 0, stream, cache,
                block, running);
  return cudaGetLastError();
}

cudaError_t kv_append(const KvCacheLayer& cache, const KvAppendBatch& batch, cudaStream_t stream) {
  using namespace kv_append_detail;
  if (batch.n_tokens == 0) return cudaSuccess;
  const int64_t row_elems = static_cast<int64_t>(cache.n_kv_heads) * cache.head_dim;
  if (batch.n_tokens < 0 || batch.n_seqs <= 0 || cache.block_size <= 0 || cache.n_kv_heads <= 0 ||
      cache.n_kv_heads > 65535 || cache.head_dim <= 0 || batch.k_token_stride < row_elems ||
      batch.v_token_stride < row_elems || !cache.k || !cache.v ||
      (cache.dtype == KvStoreType::kI8 && (!cache.k_rows || !cache.v_rows)) || (batch.running && !batch.running_row))
    return cudaErrorInvalidValue;
  const dim3 rows_grid(static_cast<unsigned>(batch.n_tokens), static_cast<unsigned>(cache.n_kv_heads));
  switch (cache.dtype) {
    case KvStoreType::kF32:
      FATHOM_LAUNCH(kv_rows_kernel<KvStoreType::kF32>, rows_grid, dim3(kThreads), 0, stream, cache, batch);
      break;
    case KvStoreType::kF16:
      FATHOM_LAUNCH(kv_rows_kernel<KvStoreType::kF16>, rows_grid, dim3(kThreads), 0, stream, cache, batch);
      break;
    case KvStoreType::kBF16:
      FATHOM_LAUNCH(kv_rows_kernel<KvStoreType::kBF16>, rows_grid, dim3(kThreads), 0, stream, cache, batch);
      break;
    case KvStoreType::kI8:
      FATHOM_LAUNCH(kv_rows_kernel<KvStoreType::kI8>, rows_grid, dim3(kThreads), 0, stream, cache, batch);
      break;
  }
  if (cache.v_sum || cache.k_moments) {
    const dim3 sum_grid(static_cast<unsigned>(batch.n_seqs), static_cast<unsigned>(cache.n_kv_heads));
    FATHOM_LAUNCH(kv_sums_kernel, sum_grid, dim3(kThreads), 0, stream, cache, batch);
  }
  return cudaGetLastError();
}

}  // namespace fathom::cuda
