// RoPE from a per-position angle cache. Why a cache instead of computing angles in the kernel:
// angle = pos · base^(-2i/d) in f32 has an absolute error of ~pos·2^-24 rad (0.008 rad at
// 128k), visible in attention at long context; the cache holds the double-precision angles of
// cpu::rope_table rounded once, so device and CPU rotate by identical cos/sin.
// Launch: grid (n_tokens), block 128; thread j of the block handles pairs j, j + 128, ... of the
// token's n_heads · rope_dim/2 pairs (head-major), so a warp touches consecutive pairs of one
// head: contiguous for NeoX, stride-2 floats (still one 256-byte span) for adjacent pairs.
#include "kernels/cuda/rope.h"

namespace fathom::cuda {
namespace rope_detail {  // named: the kernels' names stay unique across the .cu files

constexpr int kThreads = 128;

template <bool kNeox>
__global__ void __launch_bounds__(kThreads) rope_kernel(float* x, const int32_t* __restrict__ pos, int64_t token_stride,
                                                        int32_t n_heads, int32_t head_dim, int32_t rope_dim,
                                                        const float* __restrict__ cos_cache,
                                                        const float* __restrict__ sin_cache) {
  const int64_t t = blockIdx.x;
  const int half = rope_dim / 2;
  const int64_t row = static_cast<int64_t>(pos[t]) * half;
  float* xt = x + t * token_stride;
  for (int j = static_cast<int>(threadIdx.x); j < n_heads * half; j += kThreads) {
    const int h = j / half, i = j % half;
    float* v = xt + static_cast<int64_t>(h) * head_dim;
    const int a = kNeox ? i : 2 * i, b = kNeox ? i + half : 2 * i + 1;
    const float c = cos_cache[row + i], s = sin_cache[row + i];
    const float x0 = v[a], x1 = v[b];
    v[a] = x0 * c - x1 * s;
    v[b] = x0 * s + x1 * c;
  }
}

}  // namespace rope_detail

cudaError_t rope(float* x, const int32_t* pos, int64_t n_tokens, int64_t token_stride, int32_t n_heads,
                 int32_t head_dim, int32_t rope_dim, bool neox, const float* cos_cache, const float* sin_cache,
                 cudaStream_t stream) {
  using namespace rope_detail;
  if (n_tokens == 0) return cudaSuccess;
  if (n_tokens < 0 || n_tokens > 0x7fffffff || n_heads <= 0 || rope_dim < 2 || rope_dim % 2 != 0 ||
      rope_dim > head_dim || token_stride < static_cast<int64_t>(n_heads) * head_dim)
    return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(n_tokens));
  if (neox) {
    FATHOM_LAUNCH(rope_kernel<true>, grid, dim3(kThreads), 0, stream, x, pos, token_stride, n_heads, head_dim,
                  rope_dim, cos_cache, sin_cache);
  } else {
    FATHOM_LAUNCH(rope_kernel<false>, grid, dim3(kThreads), 0, stream, x, pos, token_stride, n_heads, head_dim,
                  rope_dim, cos_cache, sin_cache);
  }
  return cudaGetLastError();
}

}  // namespace fathom::cuda
