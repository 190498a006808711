// Grouped expert GEMV: block (128 = 4 warps), one warp per output row of one item's expert, the
// row's dot products with the item's 1..4 pair rows of x as quant_gemv computes them
// (quant_rows.h); the item's count picks the instantiation inside the kernel (uniform per block).
// Grouped expert GEMM (prefill): block 256 threads, one (item, 64-output tile) each; k in steps
// of kTK = 32 through shared memory, both tiles k-major as f32 (ws[kk][n] the expert's weights
// dequantized, xs[kk][m] the item's pair rows, zeros past n_out, k and the item's count: 2 × 8 KiB).
//   Load: thread t decodes 8 consecutive elements (8 (t / 64) .. + 7 of the step) of weight row
//     t % 64 and of pair row t % 64; a warp's 32 threads store 32 consecutive floats of a k row
//     (no bank conflict). 8 elements always lie in one block / scale group of every format, so
//     a thread reads one block header and 8 quant bytes (as 32- or 16-bit loads where the format
//     aligns them); the warps of a block cover the tile's bytes together, so its global reads
//     are the tile once (L1 serves the neighbours' sectors).
//   Multiply: thread (tx = t % 16, ty = t / 16) owns a 4 × 4 register block, rows 4ty..4ty+3 of
//     the item and outputs 4tx..4tx+3: per kk one float4 of xs (2 addresses per warp: broadcast)
//     and one of ws (16 consecutive float4: no conflict), 16 FMAs. Threads whose 4 rows are all
//     past the item's count skip the products (a warp owns 8 rows: small items idle whole warps).
//   Why 64 × 64 × 32: 64 rows halve the reads of an expert against 32 (Mixtral-like top-2 of 8
//     prefills give each expert ~T/4 pairs) while a 4 × 4 block keeps 16 accumulators per thread
//     (under 64 registers: 4 blocks of 256 per SM on sm_80 / sm_90's 64 K registers); 16 KiB of
//     static shared memory per block leaves sm_80's 164 KiB (sm_90's 228 KiB) for those 4 blocks
//     and more; kTK = 32 is one block of the 32-element formats and one scale group of the
//     K-quants, so no stage splits a header. f32 FMAs, no tensor cores (the emulator has no mma;
//     the weights' reads, not the FLOPs, are what the grouping saves).
// gather_rows / combine_experts: one thread per output float.
#include "kernels/cuda/moe.h"

#include "kernels/cuda/quant_rows.h"

namespace fathom::cuda {
namespace moe_detail {  // named: the kernels' names stay unique across the .cu files

using namespace quant_rows;
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;

// Q3_K's kernel, with its four row counts inline, spills at the 64 registers ptxas (CUDA 13.0)
// gives it on sm_90 by default; asking for 5 blocks per SM lets it take 96 (the others as before).
template <GgmlType kType>
constexpr int kGemvMinBlocks = kType == GgmlType::Q3_K ? 5 : 0;

// grid (ceil(n_out / kWarps), n_items), block (kThreads)
template <GgmlType kType>
__global__ void __launch_bounds__(kThreads, kGemvMinBlocks<kType>) grouped_gemv_kernel(const uint8_t* __restrict__ w, int64_t expert_stride,
                                                                int64_t row_bytes, int64_t n_out, int64_t k,
                                                                const float* __restrict__ x, float* __restrict__ y,
                                                                const ExpertRows* __restrict__ items) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarps + static_cast<int>(threadIdx.x) / 32;
  if (n >= n_out) return;  // whole warps exit together: the shuffles stay full-warp
  const ExpertRows item = items[blockIdx.y];
  const uint8_t* we = w + item.expert * expert_stride;
  const float* xi = x + static_cast<int64_t>(item.first) * k;
  float* yi = y + static_cast<int64_t>(item.first) * n_out;
  switch (item.count) {
    case 1: warp_rows<kType, 1, 1>(we, row_bytes, n_out, n, k, xi, yi, lane); break;
    case 2: warp_rows<kType, 1, 2>(we, row_bytes, n_out, n, k, xi, yi, lane); break;
    case 3: warp_rows<kType, 1, 3>(we, row_bytes, n_out, n, k, xi, yi, lane); break;
    default: warp_rows<kType, 1, 4>(we, row_bytes, n_out, n, k, xi, yi, lane); break;
  }
}

// Elements and bytes per block of each format grouped_gemv reads (kernels/ggml_type.h's table).
template <GgmlType kType>
constexpr int64_t kBlock = kType == GgmlType::F32 || kType == GgmlType::F16 || kType == GgmlType::BF16 ? 1
                           : kType == GgmlType::Q8_0 || kType == GgmlType::IQ4_NL || kType == GgmlType::MXFP4 ? 32
                                                                                                          : 256;
template <GgmlType kType>
constexpr int64_t kBlockBytes = kType == GgmlType::F32 ? 4 : kType == GgmlType::F16 || kType == GgmlType::BF16 ? 2
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

// ---- grouped GEMM ----
constexpr int kTM = kGroupedGemmRows;  // pair rows per item
constexpr int kTN = 64;                // outputs per block
constexpr int kTK = 32;                // k per shared-memory stage
constexpr int kGemmThreads = 256;
static_assert(kTM == 64 && kTN == 64 && kTK == 32 && kGemmThreads == 256,
              "the loader's and the 4 x 4 register blocks' thread maps assume these sizes");

template <GgmlType kType>
constexpr bool kFloat = kType == GgmlType::F32 || kType == GgmlType::F16 || kType == GgmlType::BF16;

// The 8 bytes at p as two little-endian words: p 4-byte aligned / 2-byte aligned / any.
__device__ __forceinline__ void bytes8_u32(const uint8_t* p, uint32_t* w) {
  const uint32_t* q = reinterpret_cast<const uint32_t*>(p);
  w[0] = q[0];
  w[1] = q[1];
}
__device__ __forceinline__ void bytes8_u16(const uint8_t* p, uint32_t* w) {
  const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
  w[0] = h[0] | static_cast<uint32_t>(h[1]) << 16;
  w[1] = h[2] | static_cast<uint32_t>(h[3]) << 16;
}
__device__ __forceinline__ void bytes8_u8(const uint8_t* p, uint32_t* w) {
  w[0] = p[0] | p[1] << 8 | p[2] << 16 | static_cast<uint32_t>(p[3]) << 24;
  w[1] = p[4] | p[5] << 8 | p[6] << 16 | static_cast<uint32_t>(p[7]) << 24;
}
// Byte j (0..7, a constant once unrolled) of the two words.
__device__ __forceinline__ uint32_t byte_of(const uint32_t* w, int j) { return (w[j / 4] >> (8 * (j % 4))) & 0xFF; }

// v[j] = element e + j (j < 8) of a quantized row (e a multiple of 8, e + 8 <= k), as
// ref::dequantize_row computes it (the same products in the same order; nvcc may fuse a product
// and the subtraction of Q2_K's / Q4_K's min into one FMA).
template <GgmlType kType>
__device__ __forceinline__ void decode8(const uint8_t* row, int64_t e, float* v) {
  uint32_t q[2];
  if constexpr (kType == GgmlType::Q8_0) {  // 34-byte blocks of 32, 2-byte aligned
    const uint8_t* blk = row + e / 32 * 34;
    const float d = f16_bits(*reinterpret_cast<const uint16_t*>(blk));
    bytes8_u16(blk + 2 + e % 32, q);
FATHOM_UNROLL
    for (int j = 0; j < 8; ++j) v[j] = static_cast<float>(static_cast<int8_t>(byte_of(q, j))) * d;
  } else if constexpr (kType == GgmlType::IQ4_NL || kType == GgmlType::MXFP4) {
    // 18 / 17-byte blocks of 32: element o < 16 the low nibble of qs[o], o >= 16 the high one of qs[o - 16]
    constexpr int64_t kBytes = kType == GgmlType::IQ4_NL ? 18 : 17;
    const uint8_t* blk = row + e / 32 * kBytes;
    const int o = static_cast<int>(e % 32), shift = 4 * (o / 16);
    if constexpr (kType == GgmlType::IQ4_NL) {
      const float d = f16_bits(*reinterpret_cast<const uint16_t*>(blk));
      bytes8_u16(blk + 2 + o % 16, q);
FATHOM_UNROLL
      for (int j = 0; j < 8; ++j) v[j] = d * iq4nl_level((byte_of(q, j) >> shift) & 0xF);
    } else {
      const float d = e8m0_half(blk[0]);
      bytes8_u8(blk + 1 + o % 16, q);
FATHOM_UNROLL
      for (int j = 0; j < 8; ++j) v[j] = mxfp4_value((byte_of(q, j) >> shift) & 0xF) * d;
    }
  } else if constexpr (kType == GgmlType::Q4_K) {  // element 64 c + 32 hi + l: nibble hi of qs[32 c + l]
    const uint8_t* blk = row + e / 256 * 144;
    const int i = static_cast<int>(e % 256), c = i / 64, hi = (i / 32) % 2, l = i % 32;
    const uint16_t* h = reinterpret_cast<const uint16_t*>(blk);
    float sc, m;
    scale_min_k4(2 * c + hi, blk + 4, &sc, &m);
    const float d1 = f16_bits(h[0]) * sc, m1 = f16_bits(h[1]) * m;
    bytes8_u32(blk + 16 + 32 * c + l, q);
FATHOM_UNROLL
    for (int j = 0; j < 8; ++j) v[j] = d1 * static_cast<float>((byte_of(q, j) >> (4 * hi)) & 0xF) - m1;
  } else if constexpr (kType == GgmlType::Q6_K) {
    // element 128 n + 32 g + l: nibble g / 2 of ql[64 n + 32 (g % 2) + l], bits 2g of qh[32 n + l]
    const uint8_t* blk = row + e / 256 * 210;
    const int i = static_cast<int>(e % 256), n = i / 128, g = (i % 128) / 32, l = i % 32;
    const float d = f16_bits(*reinterpret_cast<const uint16_t*>(blk + 208));
    const float ds = d * static_cast<float>(reinterpret_cast<const int8_t*>(blk)[192 + 8 * n + 2 * g + l / 16]);
    uint32_t qh[2];
    bytes8_u16(blk + 64 * n + 32 * (g % 2) + l, q);
    bytes8_u16(blk + 128 + 32 * n + l, qh);
FATHOM_UNROLL
    for (int j = 0; j < 8; ++j) {
      const int lo = (byte_of(q, j) >> (4 * (g / 2))) & 0xF, hi = (byte_of(qh, j) >> (2 * g)) & 3;
      v[j] = ds * static_cast<float>((lo | hi << 4) - 32);
    }
  } else if constexpr (kType == GgmlType::Q2_K || kType == GgmlType::Q3_K) {
    // element 128 h + 32 j + l: bits 2j of qs[32 h + l] (Q3_K: and bit 4h + j of hmask[l])
    constexpr bool kQ3 = kType == GgmlType::Q3_K;
    const uint8_t* blk = row + e / 256 * (kQ3 ? 110 : 84);
    const int i = static_cast<int>(e % 256), h = i / 128, g = (i % 128) / 32, l = i % 32, shift = 2 * g;
    if constexpr (kQ3) {
      const float dl = f16_bits(*reinterpret_cast<const uint16_t*>(blk + 108)) * q3_k_scale(blk + 96, i / 16);
      uint32_t hm[2];
      bytes8_u16(blk + 32 + 32 * h + l, q);
      bytes8_u16(blk + l, hm);
FATHOM_UNROLL
      for (int j = 0; j < 8; ++j) {
        const int low = (byte_of(q, j) >> shift) & 3, high = (byte_of(hm, j) >> (4 * h + g)) & 1;
        v[j] = dl * static_cast<float>(low - (high ? 0 : 4));
      }
    } else {
      const uint16_t* dd = reinterpret_cast<const uint16_t*>(blk + 80);
      const uint32_t sc = blk[i / 16];
      const float dl = f16_bits(dd[0]) * static_cast<float>(sc & 0xF), ml = f16_bits(dd[1]) * static_cast<float>(sc >> 4);
      bytes8_u32(blk + 16 + 32 * h + l, q);
FATHOM_UNROLL
      for (int j = 0; j < 8; ++j) v[j] = dl * static_cast<float>((byte_of(q, j) >> shift) & 3) - ml;
    }
  } else {
    static_assert(kType == GgmlType::IQ4_XS, "a format decode8 does not read");
    // element 32 g + 16 hi + t: nibble hi of qs[16 g + t]
    const uint8_t* blk = row + e / 256 * 136;
    const int i = static_cast<int>(e % 256), g = i / 32, o = i % 32, shift = 4 * (o / 16);
    const float dl = f16_bits(*reinterpret_cast<const uint16_t*>(blk)) * iq4_xs_scale(blk, g);
    bytes8_u32(blk + 8 + 16 * g + o % 16, q);
FATHOM_UNROLL
    for (int j = 0; j < 8; ++j) v[j] = dl * iq4nl_level((byte_of(q, j) >> shift) & 0xF);
  }
}

// Element i of a float-format row.
template <GgmlType kType>
__device__ __forceinline__ float float_at(const uint8_t* row, int64_t i) {
  if constexpr (kType == GgmlType::F32) return reinterpret_cast<const float*>(row)[i];
  else if constexpr (kType == GgmlType::F16) return f16_bits(reinterpret_cast<const uint16_t*>(row)[i]);
  else return bf16_bits(reinterpret_cast<const uint16_t*>(row)[i]);
}

// v[j] = element e + j of a weight row (e a multiple of 8, e < k), 0 past k.
template <GgmlType kType>
__device__ __forceinline__ void load_w8(const uint8_t* row, int64_t e, int64_t k, float* v) {
  if constexpr (!kFloat<kType>) {
    decode8<kType>(row, e, v);  // k is a multiple of the block (32 or 256): e + 8 <= k
  } else if (k % 8 == 0) {      // rows 16-byte aligned: 16- or 32-byte vector loads
    if constexpr (kType == GgmlType::F32) {
      const float4* p = reinterpret_cast<const float4*>(row) + e / 4;
      const float4 a = p[0], b = p[1];
      v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    } else {
      const int4 h = reinterpret_cast<const int4*>(row)[e / 8];
      const uint32_t words[4] = {static_cast<uint32_t>(h.x), static_cast<uint32_t>(h.y), static_cast<uint32_t>(h.z),
                                 static_cast<uint32_t>(h.w)};
FATHOM_UNROLL
      for (int j = 0; j < 8; ++j) {
        const uint16_t bits = static_cast<uint16_t>(words[j / 2] >> (16 * (j % 2)));
        v[j] = kType == GgmlType::F16 ? f16_bits(bits) : bf16_bits(bits);
      }
    }
  } else {
FATHOM_UNROLL
    for (int j = 0; j < 8; ++j) v[j] = e + j < k ? float_at<kType>(row, e + j) : 0.0f;
  }
}

// v[j] = x row element e + j (e a multiple of 8, e < k), 0 past k.
__device__ __forceinline__ void load_x8(const float* row, int64_t e, int64_t k, float* v) {
  if (k % 4 == 0 && e + 8 <= k) {  // rows 16-byte aligned
    const float4 a = *reinterpret_cast<const float4*>(row + e), b = *reinterpret_cast<const float4*>(row + e + 4);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else {
FATHOM_UNROLL
    for (int j = 0; j < 8; ++j) v[j] = e + j < k ? row[e + j] : 0.0f;
  }
}

// grid (ceil(n_out / kTN), n_items), block (kGemmThreads)
template <GgmlType kType>
__global__ void __launch_bounds__(kGemmThreads) grouped_gemm_kernel(const uint8_t* __restrict__ w, int64_t expert_stride,
                                                                    int64_t row_bytes, int64_t n_out, int64_t k,
                                                                    const float* __restrict__ x, float* __restrict__ y,
                                                                    const ExpertRows* __restrict__ items) {
  __shared__ float4 xs[kTK][kTM / 4];  // xs[kk][m]: the item's pair rows, k-major
  __shared__ float4 ws[kTK][kTN / 4];  // ws[kk][n]: the expert's tile of outputs, dequantized, k-major
  float* xs_f = reinterpret_cast<float*>(xs);
  float* ws_f = reinterpret_cast<float*>(ws);
  const int t = static_cast<int>(threadIdx.x);
  const ExpertRows item = items[blockIdx.y];
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kTN;
  // Loader: weight row n0 + r and pair row r, elements 8 c .. 8 c + 7 of each stage.
  const int r = t % kTM, c = t / kTM;
  const bool w_live = n0 + r < n_out, x_live = r < item.count;
  const uint8_t* w_row = w + item.expert * expert_stride + (w_live ? (n0 + r) * row_bytes : 0);
  const float* x_row = x + (static_cast<int64_t>(item.first) + (x_live ? r : 0)) * k;
  // Multiply: rows 4 ty .. 4 ty + 3, outputs n0 + 4 tx .. n0 + 4 tx + 3.
  const int tx = t % (kTN / 4), ty = t / (kTN / 4);
  const bool rows_live = 4 * ty < item.count;
  float acc[4][4];
FATHOM_UNROLL
  for (int i = 0; i < 4; ++i)
FATHOM_UNROLL
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
  for (int64_t k0 = 0; k0 < k; k0 += kTK) {
    const int64_t e = k0 + 8 * c;
    float v[8];
    if (w_live && e < k) {
      load_w8<kType>(w_row, e, k, v);
    } else {
FATHOM_UNROLL
      for (int j = 0; j < 8; ++j) v[j] = 0.0f;
    }
FATHOM_UNROLL
    for (int j = 0; j < 8; ++j) ws_f[(8 * c + j) * kTN + r] = v[j];
    if (x_live && e < k) {
      load_x8(x_row, e, k, v);
    } else {
FATHOM_UNROLL
      for (int j = 0; j < 8; ++j) v[j] = 0.0f;
    }
FATHOM_UNROLL
    for (int j = 0; j < 8; ++j) xs_f[(8 * c + j) * kTM + r] = v[j];
    __syncthreads();
    if (rows_live) {
FATHOM_UNROLL
      for (int kk = 0; kk < kTK; ++kk) {
        const float4 a = xs[kk][ty], b = ws[kk][tx];
        const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
FATHOM_UNROLL
        for (int i = 0; i < 4; ++i)
FATHOM_UNROLL
          for (int j = 0; j < 4; ++j) acc[i][j] += av[i] * bv[j];
      }
    }
    __syncthreads();
  }
FATHOM_UNROLL
  for (int i = 0; i < 4; ++i) {
    const int m = 4 * ty + i;
    if (m >= item.count) break;
    float* y_row = y + (static_cast<int64_t>(item.first) + m) * n_out;
FATHOM_UNROLL
    for (int j = 0; j < 4; ++j) {
      const int64_t n = n0 + 4 * tx + j;
      if (n < n_out) y_row[n] = acc[i][j];
    }
  }
}

template <GgmlType kType>
cudaError_t launch_gemm(const void* w, int64_t expert_stride, int64_t n_out, int64_t k, const float* x, float* y,
                        const ExpertRows* items, int32_t n_items, cudaStream_t stream) {
  if (k % kBlock<kType> != 0) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>((n_out + kTN - 1) / kTN), static_cast<unsigned>(n_items));
  FATHOM_LAUNCH((grouped_gemm_kernel<kType>), grid, dim3(kGemmThreads), 0, stream, static_cast<const uint8_t*>(w),
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

// The arguments both grouped launchers accept (moe.h): shapes, 16-byte alignment, and a grid of
// ceil(n_out / outputs_per_block) x n_items blocks within CUDA's limits.
bool valid_grouped_args(const void* w, int64_t expert_stride, int64_t n_out, int64_t k, const float* x,
                        const ExpertRows* items, int32_t n_items, int64_t outputs_per_block) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return n_out >= 0 && (n_out + outputs_per_block - 1) / outputs_per_block <= 0x7fffffff && n_items >= 0 &&
         n_items <= 65535 && k > 0 && expert_stride >= 0 && expert_stride % 16 == 0 && aligned(w) && aligned(x) &&
         items != nullptr;
}

}  // namespace moe_detail

cudaError_t grouped_gemv(GgmlType type, const void* w, int64_t expert_stride, int64_t n_out, int64_t k, const float* x,
                         float* y, const ExpertRows* items, int32_t n_items, cudaStream_t stream) {
  using namespace moe_detail;
  if (n_out == 0 || n_items == 0) return cudaSuccess;
  if (!valid_grouped_args(w, expert_stride, n_out, k, x, items, n_items, kWarps)) return cudaErrorInvalidValue;
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

cudaError_t grouped_gemm(GgmlType type, const void* w, int64_t expert_stride, int64_t n_out, int64_t k, const float* x,
                         float* y, const ExpertRows* items, int32_t n_items, cudaStream_t stream) {
  using namespace moe_detail;
  if (n_out == 0 || n_items == 0) return cudaSuccess;
  if (!valid_grouped_args(w, expert_stride, n_out, k, x, items, n_items, kTN)) return cudaErrorInvalidValue;
  switch (type) {
    case GgmlType::F32: return launch_gemm<GgmlType::F32>(w, expert_stride, n_out, k, x, y, items, n_items, stream);
    case GgmlType::F16: return launch_gemm<GgmlType::F16>(w, expert_stride, n_out, k, x, y, items, n_items, stream);
    case GgmlType::BF16: return launch_gemm<GgmlType::BF16>(w, expert_stride, n_out, k, x, y, items, n_items, stream);
    case GgmlType::Q8_0: return launch_gemm<GgmlType::Q8_0>(w, expert_stride, n_out, k, x, y, items, n_items, stream);
    case GgmlType::Q4_K: return launch_gemm<GgmlType::Q4_K>(w, expert_stride, n_out, k, x, y, items, n_items, stream);
    case GgmlType::Q6_K: return launch_gemm<GgmlType::Q6_K>(w, expert_stride, n_out, k, x, y, items, n_items, stream);
    case GgmlType::Q2_K: return launch_gemm<GgmlType::Q2_K>(w, expert_stride, n_out, k, x, y, items, n_items, stream);
    case GgmlType::Q3_K: return launch_gemm<GgmlType::Q3_K>(w, expert_stride, n_out, k, x, y, items, n_items, stream);
    case GgmlType::IQ4_XS: return launch_gemm<GgmlType::IQ4_XS>(w, expert_stride, n_out, k, x, y, items, n_items, stream);
    case GgmlType::IQ4_NL: return launch_gemm<GgmlType::IQ4_NL>(w, expert_stride, n_out, k, x, y, items, n_items, stream);
    case GgmlType::MXFP4: return launch_gemm<GgmlType::MXFP4>(w, expert_stride, n_out, k, x, y, items, n_items, stream);
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
