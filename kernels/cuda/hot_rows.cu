// Row copies into a device hot-row cache and its map updates (kernels/cuda/hot_rows.h). Bandwidth
// bound and small (a HiP mask refresh's rows): one block of 64 threads per row copies it in
// 4-byte words (head_dim · element size is a multiple of 4 for every dtype and head_dim here).
#include "kernels/cuda/hot_rows.h"

#include <algorithm>

namespace fathom::cuda {
namespace row_cache_detail {  // named: the kernels' names stay unique across the .cu files

constexpr int kThreads = 64;

__device__ __forceinline__ void copy_words(uint32_t* dst, const uint32_t* src, int64_t words) {
  for (int64_t w = threadIdx.x; w < words; w += kThreads) dst[w] = src[w];
}

__global__ void __launch_bounds__(kThreads) copy_rows_kernel(KvTierPlanes from, KvCacheLayer to, int64_t row_words,
                                                             const KvRowCopy* copies) {
  const KvRowCopy c = copies[blockIdx.x];
  if (c.parts & 1) {
    copy_words(static_cast<uint32_t*>(to.k) + c.dst * row_words, static_cast<const uint32_t*>(from.k) + c.src * row_words,
               row_words);
    if (to.k_rows != nullptr && threadIdx.x == 0) to.k_rows[c.dst] = from.k_rows[c.src];
  }
  if (c.parts & 2) {
    copy_words(static_cast<uint32_t*>(to.v) + c.dst * row_words, static_cast<const uint32_t*>(from.v) + c.src * row_words,
               row_words);
    if (to.v_rows != nullptr && threadIdx.x == 0) to.v_rows[c.dst] = from.v_rows[c.src];
  }
}

__global__ void __launch_bounds__(256) scatter_kernel(int32_t* map, const int64_t* index, const int32_t* value,
                                                      int32_t n) {
  for (int32_t i = static_cast<int32_t>(blockIdx.x * 256 + threadIdx.x); i < n;
       i += static_cast<int32_t>(gridDim.x * 256))
    map[index[i]] = value[i];
}

}  // namespace row_cache_detail

cudaError_t copy_kv_rows(const KvTierPlanes& from, const KvCacheLayer& to, KvDtype dtype, const KvRowCopy* copies,
                         int32_t n, cudaStream_t stream) {
  using namespace row_cache_detail;
  if (n < 0 || (to.head_dim * static_cast<int64_t>(kv_dtype_bytes(dtype))) % 4 != 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const int64_t row_words = to.head_dim * static_cast<int64_t>(kv_dtype_bytes(dtype)) / 4;
  FATHOM_LAUNCH(copy_rows_kernel, dim3(static_cast<unsigned>(n)), dim3(kThreads), 0, stream, from, to, row_words, copies);
  return cudaGetLastError();
}

cudaError_t scatter_int32(int32_t* map, const int64_t* index, const int32_t* value, int32_t n, cudaStream_t stream) {
  using namespace row_cache_detail;
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 1024));
  FATHOM_LAUNCH(scatter_kernel, dim3(blocks), dim3(256), 0, stream, map, index, value, n);
  return cudaGetLastError();
}

}  // namespace fathom::cuda
