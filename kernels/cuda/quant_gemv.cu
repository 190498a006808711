// Quantized GEMV. Launch: grid (ceil(n_out / 4)), block 128 = 4 warps, one warp per output row;
// the row's blocks are read by the warp together so every load instruction of the warp covers
// a contiguous span of the row (coalesced), each lane accumulates f32 partial dots for the n_x
// activation rows, and a shuffle tree reduces the 32 lanes at the end (lane 0 writes y).
//   Q8_0 (34-byte blocks of 32): 8 lanes per block, 4 blocks (136 bytes) per warp step; a lane
//        reads 4 quants (two 16-bit loads: blocks are only 2-byte aligned) and a float4 of x.
//   Q4_K (144-byte super-blocks of 256): the warp reads one super-block per step; lane l takes
//        the 32-bit word l of qs (bytes 4l..4l+3 of 128: 4 low nibbles of sub-block 2(l/8),
//        4 high nibbles of sub-block 2(l/8)+1) and two float4 of x; the sub-block scale and
//        min multiply the partial sums once: d·sc·Σq·x − dmin·m·Σx.
//   Q6_K (210-byte super-blocks): lane l decodes elements l + {0, 32, 64, 96} of each half
//        (the ref's loop order): byte loads of ql/qh contiguous across lanes, x loads too.
//   Q2_K (84 bytes), Q3_K (110): lane l decodes elements 128 h + 32 j + l (h < 2, j < 4) from
//        the bytes qs[32 h + l] (and Q3_K's hmask[l]): byte loads contiguous across lanes, x too.
//   IQ4_XS (136 bytes): lane l takes the 32-bit word l of qs (4 bytes of 32-group l / 4: its
//        elements 4 (l % 4) + {0..3} in the low nibbles, + 16 in the high ones), as Q4_K.
//   IQ4_NL (18-byte blocks of 32), MXFP4 (17): 4 lanes per block, 8 blocks per warp step; a
//        lane reads 4 bytes of qs (IQ4_NL: two 16-bit loads; MXFP4, byte-aligned: 4 byte loads)
//        and two float4 of x, as Q8_0.
// Bytes per output row: the row of W once plus n_x·K·4 of x (x is re-read by every warp but
// stays in L1/L2), so the kernel is bound by W's bytes, as decode GEMV should be.
// Five to kQuantGemvMaxRows activation rows (batched decode, speculative verify rows) take the
// many-row kernel: block (g, j) of grid (ceil(n_x / 4), ceil(n_out / R)) multiplies activation
// rows 4g..4g+3 with weight rows R j..R j + R - 1, R / 4 a warp (kRowsPerWarp: 4 for most formats,
// so R = 16; Q6_K 2, Q2_K and Q3_K 1). A lane decodes its columns of the warp's rows and every x
// value it loads serves all of them, so x's cache traffic per weight is 1 / kRowsPerWarp of the
// one-row kernel's. The groups are the grid's fastest dimension: the blocks reading the same
// weight rows run side by side, so W comes from DRAM about once a launch and the other groups
// find it in L2. A row's result is bitwise the one-row kernel's (quant_rows.h: the same
// operations per row; both kernels go through warp_rows).
#include "kernels/cuda/quant_gemv.h"

#include "kernels/cuda/quant_rows.h"

namespace fathom::cuda {
namespace quant_gemv_detail {  // named: the kernels' names stay unique across the .cu files

using namespace quant_rows;
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;

// grid (ceil(n_out / kWarps)), block (kThreads)
template <GgmlType kType, int kNx>
__global__ void __launch_bounds__(kThreads) quant_gemv_kernel(const uint8_t* __restrict__ w, int64_t row_bytes,
                                                              int64_t n_out, int64_t k, const float* __restrict__ x,
                                                              float* __restrict__ y) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarps + static_cast<int>(threadIdx.x) / 32;
  if (n >= n_out) return;  // whole warps exit together: the shuffles stay full-warp
  warp_rows<kType, 1, kNx>(w, row_bytes, n_out, n, k, x, y, lane);
}

// The many-row kernel (n_x > 4): kRowsPerWarp weight rows a warp, kGroupRows activation rows a block.
// Q2_K, Q3_K and Q6_K decode a lane's weights from several scattered bytes a row; at 4 rows a warp
// ptxas spills them (sm_80: Q3_K past 255 registers, Q6_K at 168), and at 2 Q2_K and Q3_K still
// take 245-254 registers (two blocks an SM). Q6_K takes 2 rows (102 registers), Q2_K and Q3_K one.
template <GgmlType kType>
constexpr int kRowsPerWarp = kType == GgmlType::Q2_K || kType == GgmlType::Q3_K ? 1 : kType == GgmlType::Q6_K ? 2 : 4;
constexpr int kGroupRows = 4;
template <GgmlType kType>
constexpr int64_t kRowsPerBlock = int64_t{kWarps} * kRowsPerWarp<kType>;
constexpr int64_t kMaxGridY = 65535;  // a launch's weight-row blocks; more rows: more launches

// grid (ceil(n_x / kGroupRows), blocks of kRowsPerBlock weight rows from row0), block (kThreads)
template <GgmlType kType>
__global__ void __launch_bounds__(kThreads) quant_gemv_many_kernel(const uint8_t* __restrict__ w, int64_t row_bytes,
                                                                   int64_t n_out, int64_t row0, int64_t k,
                                                                   const float* __restrict__ x, int32_t n_x,
                                                                   float* __restrict__ y) {
  constexpr int kR = kRowsPerWarp<kType>;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t n0 = row0 + static_cast<int64_t>(blockIdx.y) * kRowsPerBlock<kType> +
                     static_cast<int64_t>(threadIdx.x / 32) * kR;
  if (n0 >= n_out) return;  // whole warps exit together
  const int m0 = static_cast<int>(blockIdx.x) * kGroupRows;
  const float* xg = x + m0 * k;
  float* yg = y + m0 * n_out;
  switch (n_x - m0) {  // the block's activation rows: 4, or the remainder in the last group
    case 1: warp_rows<kType, kR, 1>(w, row_bytes, n_out, n0, k, xg, yg, lane); break;
    case 2: warp_rows<kType, kR, 2>(w, row_bytes, n_out, n0, k, xg, yg, lane); break;
    case 3: warp_rows<kType, kR, 3>(w, row_bytes, n_out, n0, k, xg, yg, lane); break;
    default: warp_rows<kType, kR, kGroupRows>(w, row_bytes, n_out, n0, k, xg, yg, lane); break;
  }
}

template <GgmlType kType>
void launch_many(const void* w, int64_t row_bytes, int64_t n_out, int64_t k, const float* x, int32_t n_x, float* y,
                 cudaStream_t stream) {
  const auto* wb = static_cast<const uint8_t*>(w);
  const int64_t blocks = (n_out + kRowsPerBlock<kType> - 1) / kRowsPerBlock<kType>;
  for (int64_t b0 = 0; b0 < blocks; b0 += kMaxGridY) {
    const dim3 grid(static_cast<unsigned>((n_x + kGroupRows - 1) / kGroupRows),
                    static_cast<unsigned>(blocks - b0 < kMaxGridY ? blocks - b0 : kMaxGridY));
    FATHOM_LAUNCH((quant_gemv_many_kernel<kType>), grid, dim3(kThreads), 0, stream, wb, row_bytes, n_out,
                  b0 * kRowsPerBlock<kType>, k, x, n_x, y);
  }
}

template <GgmlType kType>
void launch(const void* w, int64_t row_bytes, int64_t n_out, int64_t k, const float* x, int32_t n_x, float* y,
            cudaStream_t stream) {
  if (n_x > 4) {
    launch_many<kType>(w, row_bytes, n_out, k, x, n_x, y, stream);
    return;
  }
  const dim3 grid(static_cast<unsigned>((n_out + kWarps - 1) / kWarps));
  const auto* wb = static_cast<const uint8_t*>(w);
  switch (n_x) {
    case 1: FATHOM_LAUNCH((quant_gemv_kernel<kType, 1>), grid, dim3(kThreads), 0, stream, wb, row_bytes, n_out, k, x, y); break;
    case 2: FATHOM_LAUNCH((quant_gemv_kernel<kType, 2>), grid, dim3(kThreads), 0, stream, wb, row_bytes, n_out, k, x, y); break;
    case 3: FATHOM_LAUNCH((quant_gemv_kernel<kType, 3>), grid, dim3(kThreads), 0, stream, wb, row_bytes, n_out, k, x, y); break;
    default: FATHOM_LAUNCH((quant_gemv_kernel<kType, 4>), grid, dim3(kThreads), 0, stream, wb, row_bytes, n_out, k, x, y); break;
  }
}

}  // namespace quant_gemv_detail

cudaError_t quant_gemv(GgmlType type, const void* w, int64_t n_out, int64_t k, const float* x, int32_t n_x, float* y,
                       cudaStream_t stream) {
  using namespace quant_gemv_detail;
  if (n_out == 0) return cudaSuccess;
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (n_out < 0 || (n_out + kWarps - 1) / kWarps > 0x7fffffff || n_x < 1 || n_x > kQuantGemvMaxRows || k <= 0 || !aligned(w) ||
      !aligned(x))
    return cudaErrorInvalidValue;
  switch (type) {
    case GgmlType::Q8_0:
      if (k % 32 != 0) return cudaErrorInvalidValue;
      launch<GgmlType::Q8_0>(w, k / 32 * 34, n_out, k, x, n_x, y, stream);
      break;
    case GgmlType::Q4_K:
      if (k % 256 != 0) return cudaErrorInvalidValue;
      launch<GgmlType::Q4_K>(w, k / 256 * 144, n_out, k, x, n_x, y, stream);
      break;
    case GgmlType::Q6_K:
      if (k % 256 != 0) return cudaErrorInvalidValue;
      launch<GgmlType::Q6_K>(w, k / 256 * 210, n_out, k, x, n_x, y, stream);
      break;
    case GgmlType::Q2_K:
      if (k % 256 != 0) return cudaErrorInvalidValue;
      launch<GgmlType::Q2_K>(w, k / 256 * 84, n_out, k, x, n_x, y, stream);
      break;
    case GgmlType::Q3_K:
      if (k % 256 != 0) return cudaErrorInvalidValue;
      launch<GgmlType::Q3_K>(w, k / 256 * 110, n_out, k, x, n_x, y, stream);
      break;
    case GgmlType::IQ4_XS:
      if (k % 256 != 0) return cudaErrorInvalidValue;
      launch<GgmlType::IQ4_XS>(w, k / 256 * 136, n_out, k, x, n_x, y, stream);
      break;
    case GgmlType::IQ4_NL:
      if (k % 32 != 0) return cudaErrorInvalidValue;
      launch<GgmlType::IQ4_NL>(w, k / 32 * 18, n_out, k, x, n_x, y, stream);
      break;
    case GgmlType::MXFP4:
      if (k % 32 != 0) return cudaErrorInvalidValue;
      launch<GgmlType::MXFP4>(w, k / 32 * 17, n_out, k, x, n_x, y, stream);
      break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace fathom::cuda
