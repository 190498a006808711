// Grouped expert GEMV: block (128 = 4 warps), one warp per output row of one item's expert, the
// row's dot products with the item's 1..4 pair rows of x as quant_gemv computes them
// (quant_rows.h); the item's count picks the instantiation inside the kernel (uniform per block).
// gather_rows / combine_experts: one thread per output float.
#include "kernels/cuda/moe.h"

#include "kernels/cuda/quant_rows.h"

namespace fathom::cuda {
namespace moe_detail {  // named: the kernels' names stay unique across the .cu files

using namespace quant_rows;
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;

template <GgmlType kType, int kNx>
__device__ __forceinline__ void rows_of(const uint8_t* row, int64_t k, const float* x, int lane, float* y,
                                        int64_t n_out) {
  float acc[kNx];
FATHOM_UNROLL
  for (int m = 0; m < kNx; ++m) acc[m] = 0.0f;
  row_dot<kType, kNx>(row, k, x, lane, acc);
FATHOM_UNROLL
  for (int m = 0; m < kNx; ++m) {
    const float s = warp_sum(acc[m]);
    if (lane == 0) y[m * n_out] = s;
  }
}

// grid (ceil(n_out / kWarps), n_items), block (kThreads)
template <GgmlType kType>
__global__ void __launch_bounds__(kThreads) grouped_gemv_kernel(const uint8_t* __restrict__ w, int64_t expert_stride,
                                                                int64_t row_bytes, int64_t n_out, int64_t k,
                                                                const float* __restrict__ x, float* __restrict__ y,
                                                                const ExpertRows* __restrict__ items) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarps + static_cast<int>(threadIdx.x) / 32;
  if (n >= n_out) return;  // whole warps exit together: the shuffles stay full-warp
  const ExpertRows item = items[blockIdx.y];
  const uint8_t* row = w + item.expert * expert_stride + n * row_bytes;
  const float* xi = x + static_cast<int64_t>(item.first) * k;
  float* yi = y + static_cast<int64_t>(item.first) * n_out + n;
  switch (item.count) {
    case 1: rows_of<kType, 1>(row, k, xi, lane, yi, n_out); break;
    case 2: rows_of<kType, 2>(row, k, xi, lane, yi, n_out); break;
    case 3: rows_of<kType, 3>(row, k, xi, lane, yi, n_out); break;
    default: rows_of<kType, 4>(row, k, xi, lane, yi, n_out); break;
  }
}

// Elements and bytes per block of each format grouped_gemv reads (kernels/ggml_type.h's table).
template <GgmlType kType>
constexpr int64_t kBlock = kType == GgmlType::F32 || kType == GgmlType::F16 ? 1
                           : kType == GgmlType::Q8_0 || kType == GgmlType::IQ4_NL || kType == GgmlType::MXFP4 ? 32
                                                                                                          : 256;
template <GgmlType kType>
constexpr int64_t kBlockBytes = kType == GgmlType::F32 ? 4 : kType == GgmlType::F16 ? 2
                                : kType == GgmlType::Q8_0 ? 34 : kType == GgmlType::IQ4_NL ? 18
                                : kType == GgmlType::MXFP4 ? 17 : kType == GgmlType::Q4_K ? 144
                                : kType == GgmlType::Q6_K ? 210 : kType == GgmlType::Q2_K ? 84
                                : kType == GgmlType::Q3_K ? 110 : 136;  // IQ4_XS

template <GgmlType kType>
cudaError_t launch(const void* w, int64_t expert_stride, int64_t n_out, int64_t k, const float* x, float* y,
                   const ExpertRows* items, int32_t n_items, cudaStream_t stream) {
  if (k % kBlock<kType> != 0) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>((n_out + kWarps - 1) / kWarps), static_cast<unsigned>(n_items));
  FATHOM_LAUNCH((grouped_gemv_kernel<kType>), grid, dim3(kThreads), 0, stream, static_cast<const uint8_t*>(w),
                expert_stride, k / kBlock<kType> * kBlockBytes<kType>, n_out, k, x, y, items);
  return cudaGetLastError();
}

__global__ void gather_rows_kernel(const float* __restrict__ x, const int32_t* __restrict__ rows, int64_t n,
                                   int64_t width, float* __restrict__ out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * width) return;
  out[i] = x[static_cast<int64_t>(rows[i / width]) * width + i % width];
}

__global__ void combine_experts_kernel(const float* __restrict__ y, const int32_t* __restrict__ pair,
                                       const float* __restrict__ weight, int64_t tokens, int32_t used, int64_t width,
                                       float* __restrict__ out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= tokens * width) return;
  const int64_t t = i / width, d = i % width;
  float s = 0.0f;
  for (int32_t j = 0; j < used; ++j) {
    const int32_t p = pair[t * used + j];
    s += weight[p] * y[static_cast<int64_t>(p) * width + d];
  }
  out[i] = s;
}

constexpr int kElementThreads = 256;

}  // namespace moe_detail

cudaError_t grouped_gemv(GgmlType type, const void* w, int64_t expert_stride, int64_t n_out, int64_t k, const float* x,
                         float* y, const ExpertRows* items, int32_t n_items, cudaStream_t stream) {
  using namespace moe_detail;
  if (n_out == 0 || n_items == 0) return cudaSuccess;
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (n_out < 0 || (n_out + kWarps - 1) / kWarps > 0x7fffffff || n_items < 0 || n_items > 65535 || k <= 0 ||
      expert_stride < 0 || expert_stride % 16 != 0 || !aligned(w) || !aligned(x) || items == nullptr)
    return cudaErrorInvalidValue;
  switch (type) {
    case GgmlType::F32: return launch<GgmlType::F32>(w, expert_stride, n_out, k, x, y, items, n_items, stream);
    case GgmlType::F16: return launch<GgmlType::F16>(w, expert_stride, n_out, k, x, y, items, n_items, stream);
    case GgmlType::Q8_0: return launch<GgmlType::Q8_0>(w, expert_stride, n_out, k, x, y, items, n_items, stream);
    case GgmlType::Q4_K: return launch<GgmlType::Q4_K>(w, expert_stride, n_out, k, x, y, items, n_items, stream);
    case GgmlType::Q6_K: return launch<GgmlType::Q6_K>(w, expert_stride, n_out, k, x, y, items, n_items, stream);
    case GgmlType::Q2_K: return launch<GgmlType::Q2_K>(w, expert_stride, n_out, k, x, y, items, n_items, stream);
    case GgmlType::Q3_K: return launch<GgmlType::Q3_K>(w, expert_stride, n_out, k, x, y, items, n_items, stream);
    case GgmlType::IQ4_XS: return launch<GgmlType::IQ4_XS>(w, expert_stride, n_out, k, x, y, items, n_items, stream);
    case GgmlType::IQ4_NL: return launch<GgmlType::IQ4_NL>(w, expert_stride, n_out, k, x, y, items, n_items, stream);
    case GgmlType::MXFP4: return launch<GgmlType::MXFP4>(w, expert_stride, n_out, k, x, y, items, n_items, stream);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t gather_rows(const float* x, const int32_t* rows, int64_t n, int64_t width, float* out,
                        cudaStream_t stream) {
  using namespace moe_detail;
  const int64_t total = n * width;
  if (total == 0) return cudaSuccess;
  if (total < 0 || (total + kElementThreads - 1) / kElementThreads > 0x7fffffff) return cudaErrorInvalidValue;
  FATHOM_LAUNCH(gather_rows_kernel, dim3(static_cast<unsigned>((total + kElementThreads - 1) / kElementThreads)),
                dim3(kElementThreads), 0, stream, x, rows, n, width, out);
  return cudaGetLastError();
}

cudaError_t combine_experts(const float* y, const int32_t* pair, const float* weight, int64_t tokens, int32_t used,
                            int64_t width, float* out, cudaStream_t stream) {
  using namespace moe_detail;
  const int64_t total = tokens * width;
  if (total == 0) return cudaSuccess;
  if (total < 0 || used < 1 || (total + kElementThreads - 1) / kElementThreads > 0x7fffffff)
    return cudaErrorInvalidValue;
  FATHOM_LAUNCH(combine_experts_kernel, dim3(static_cast<unsigned>((total + kElementThreads - 1) / kElementThreads)),
                dim3(kElementThreads), 0, stream, y, pair, weight, tokens, used, width, out);
  return cudaGetLastError();
}

}  // namespace fathom::cuda
