// Embedding lookup: one block per token, 256 threads striding over the row's elements; thread
// i decodes element i alone (its block's scale is re-read per element, a cache hit), so the
// output writes and the quant reads of a warp are contiguous. A lookup moves dim·(bytes per
// element + 4) bytes per token: negligible next to one layer, so no more elaborate tiling.
#include "kernels/cuda/embedding.h"

#include "kernels/cuda/quant_device.h"

namespace fathom::cuda {
namespace embedding_detail {  // named: the kernels' names stay unique across the .cu files

using namespace quant_device;
constexpr int kThreads = 256;

// a * b rounded to f32 before any following add (the ref's `rounded()`): no FMA contraction.
__device__ __forceinline__ float mul_rn(float a, float b) {
#ifdef __CUDACC__
  return __fmul_rn(a, b);
#else
  volatile float p = a * b;
  return p;
#endif
}

__device__ __forceinline__ uint16_t load_u16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}

template <GgmlType kType>
__device__ __forceinline__ float element(const uint8_t* row, int64_t i) {
  if constexpr (kType == GgmlType::F32) {
    return reinterpret_cast<const float*>(row)[i];
  } else if constexpr (kType == GgmlType::F16) {
    return f16_bits(reinterpret_cast<const uint16_t*>(row)[i]);
  } else if constexpr (kType == GgmlType::BF16) {
    return bf16_bits(reinterpret_cast<const uint16_t*>(row)[i]);
  } else if constexpr (kType == GgmlType::Q8_0) {
    const uint8_t* b = row + (i / 32) * sizeof(quant::BlockQ8_0);
    return static_cast<float>(static_cast<int8_t>(b[2 + i % 32])) * f16_bits(load_u16(b));
  } else if constexpr (kType == GgmlType::Q4_K) {
    const auto* b = reinterpret_cast<const quant::BlockQ4_K*>(row) + i / 256;
    const int r = static_cast<int>(i % 256), j = r / 32, l = r % 32;
    float sc, m;
    scale_min_k4(j, b->scales, &sc, &m);
    const uint8_t byte = b->qs[32 * (j / 2) + l];
    const float q = static_cast<float>(j % 2 ? byte >> 4 : byte & 0xF);
    return mul_rn(f16_bits(b->d) * sc, q) - f16_bits(b->dmin) * m;
  } else if constexpr (kType == GgmlType::Q2_K || kType == GgmlType::Q3_K) {
    // Element 128 h + 32 j + l of a super-block: bits 2j of qs[32 h + l], sub-block r / 16.
    const int r = static_cast<int>(i % 256), h = r / 128, j = (r % 128) / 32, l = r % 32;
    if constexpr (kType == GgmlType::Q2_K) {
      const auto* b = reinterpret_cast<const quant::BlockQ2_K*>(row) + i / 256;
      const uint8_t sc = b->scales[r / 16];
      const float q = static_cast<float>((b->qs[32 * h + l] >> (2 * j)) & 3);
      return mul_rn(f16_bits(b->d) * static_cast<float>(sc & 0xF), q) - f16_bits(b->dmin) * static_cast<float>(sc >> 4);
    } else {
      const uint8_t* b = row + (i / 256) * sizeof(quant::BlockQ3_K);
      const int q = ((b[32 + 32 * h + l] >> (2 * j)) & 3) - ((b[l] >> (4 * h + j)) & 1 ? 0 : 4);
      return f16_bits(load_u16(b + 108)) * q3_k_scale(b + 96, r / 16) * static_cast<float>(q);
    }
  } else if constexpr (kType == GgmlType::IQ4_NL) {
    const uint8_t* b = row + (i / 32) * sizeof(quant::BlockIQ4_NL);
    const int t = static_cast<int>(i % 32);
    const uint8_t byte = b[2 + t % 16];
    return f16_bits(load_u16(b)) * iq4nl_level(t < 16 ? byte & 0xF : byte >> 4);
  } else if constexpr (kType == GgmlType::MXFP4) {
    const uint8_t* b = row + (i / 32) * sizeof(quant::BlockMXFP4);
    const int t = static_cast<int>(i % 32);
    const uint8_t byte = b[1 + t % 16];
    return mxfp4_value(t < 16 ? byte & 0xF : byte >> 4) * e8m0_half(b[0]);
  } else if constexpr (kType == GgmlType::IQ4_XS) {
    const uint8_t* b = row + (i / 256) * sizeof(quant::BlockIQ4_XS);
    const int r = static_cast<int>(i % 256), g = r / 32, t = r % 32;
    const uint8_t byte = b[8 + 16 * g + t % 16];
    return f16_bits(load_u16(b)) * iq4_xs_scale(b, g) * iq4nl_level(t < 16 ? byte & 0xF : byte >> 4);
  } else {
    static_assert(kType == GgmlType::Q6_K, "embedding: unsupported type");
    const uint8_t* b = row + (i / 256) * sizeof(quant::BlockQ6_K);
    const int r = static_cast<int>(i % 256), n = r / 128, quarter = (r % 128) / 32, l = r % 32;
    const uint8_t ql = b[64 * n + l + 32 * (quarter & 1)];
    const uint8_t qh = b[128 + 32 * n + l];
    const int q = ((quarter >= 2 ? ql >> 4 : ql & 0xF) | (((qh >> (2 * quarter)) & 3) << 4)) - 32;
    const auto sc = static_cast<int8_t>(b[192 + 8 * n + l / 16 + 2 * quarter]);
    return f16_bits(load_u16(b + 208)) * static_cast<float>(sc) * static_cast<float>(q);
  }
}

__device__ __forceinline__ void put(float* o, float v) { *o = v; }
__device__ __forceinline__ void put(__half* o, float v) { *o = __float2half_rn(v); }

// grid (n_tokens), block (kThreads); Out: float or __half (the f32 value rounded to nearest)
template <GgmlType kType, typename Out>
__global__ void __launch_bounds__(kThreads) embedding_kernel(const uint8_t* __restrict__ table, int64_t row_bytes,
                                                             int64_t n_rows, int64_t dim,
                                                             const int32_t* __restrict__ ids, float scale,
                                                             Out* __restrict__ out) {
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  Out* o = out + t * dim;
  const bool valid = id >= 0 && id < n_rows;
  const uint8_t* row = table + (valid ? id : 0) * row_bytes;
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) put(o + i, valid ? element<kType>(row, i) * scale : 0.0f);
}

// Elements per block and bytes per block of the supported types (0: unsupported).
inline void type_layout(GgmlType type, int64_t* block, int64_t* bytes) {
  *block = 1;
  *bytes = 0;
  switch (type) {
    case GgmlType::F32: *bytes = 4; return;
    case GgmlType::F16:
    case GgmlType::BF16: *bytes = 2; return;
    case GgmlType::Q8_0: *block = 32; *bytes = sizeof(quant::BlockQ8_0); return;
    case GgmlType::Q4_K: *block = 256; *bytes = sizeof(quant::BlockQ4_K); return;
    case GgmlType::Q6_K: *block = 256; *bytes = sizeof(quant::BlockQ6_K); return;
    case GgmlType::Q2_K: *block = 256; *bytes = sizeof(quant::BlockQ2_K); return;
    case GgmlType::Q3_K: *block = 256; *bytes = sizeof(quant::BlockQ3_K); return;
    case GgmlType::IQ4_NL: *block = 32; *bytes = sizeof(quant::BlockIQ4_NL); return;
    case GgmlType::IQ4_XS: *block = 256; *bytes = sizeof(quant::BlockIQ4_XS); return;
    case GgmlType::MXFP4: *block = 32; *bytes = sizeof(quant::BlockMXFP4); return;
    default: return;
  }
}

template <GgmlType kType, typename Out>
void launch(const void* table, int64_t row_bytes, int64_t n_rows, int64_t dim, const int32_t* ids, int64_t n_tokens,
            float scale, Out* out, cudaStream_t stream) {
  FATHOM_LAUNCH((embedding_kernel<kType, Out>), dim3(static_cast<unsigned>(n_tokens)), dim3(kThreads), 0, stream,
                static_cast<const uint8_t*>(table), row_bytes, n_rows, dim, ids, scale, out);
}

template <typename Out>
cudaError_t lookup(const void* table, GgmlType type, int64_t n_rows, int64_t dim, const int32_t* ids,
                   int64_t n_tokens, float scale, Out* out, cudaStream_t stream) {
  int64_t block = 0, bytes = 0;
  type_layout(type, &block, &bytes);
  if (n_tokens == 0) return cudaSuccess;
  if (bytes == 0 || dim <= 0 || dim % block != 0 || n_tokens < 0 || n_tokens > 0x7fffffff || n_rows <= 0)
    return cudaErrorInvalidValue;
  const int64_t row_bytes = dim / block * bytes;
  switch (type) {
    case GgmlType::F32: launch<GgmlType::F32>(table, row_bytes, n_rows, dim, ids, n_tokens, scale, out, stream); break;
    case GgmlType::F16: launch<GgmlType::F16>(table, row_bytes, n_rows, dim, ids, n_tokens, scale, out, stream); break;
    case GgmlType::BF16: launch<GgmlType::BF16>(table, row_bytes, n_rows, dim, ids, n_tokens, scale, out, stream); break;
    case GgmlType::Q8_0: launch<GgmlType::Q8_0>(table, row_bytes, n_rows, dim, ids, n_tokens, scale, out, stream); break;
    case GgmlType::Q4_K: launch<GgmlType::Q4_K>(table, row_bytes, n_rows, dim, ids, n_tokens, scale, out, stream); break;
    case GgmlType::Q6_K: launch<GgmlType::Q6_K>(table, row_bytes, n_rows, dim, ids, n_tokens, scale, out, stream); break;
    case GgmlType::Q2_K: launch<GgmlType::Q2_K>(table, row_bytes, n_rows, dim, ids, n_tokens, scale, out, stream); break;
    case GgmlType::Q3_K: launch<GgmlType::Q3_K>(table, row_bytes, n_rows, dim, ids, n_tokens, scale, out, stream); break;
    case GgmlType::IQ4_NL: launch<GgmlType::IQ4_NL>(table, row_bytes, n_rows, dim, ids, n_tokens, scale, out, stream); break;
    case GgmlType::IQ4_XS: launch<GgmlType::IQ4_XS>(table, row_bytes, n_rows, dim, ids, n_tokens, scale, out, stream); break;
    case GgmlType::MXFP4: launch<GgmlType::MXFP4>(table, row_bytes, n_rows, dim, ids, n_tokens, scale, out, stream); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace embedding_detail

cudaError_t embedding_lookup(const void* table, GgmlType type, int64_t n_rows, int64_t dim, const int32_t* ids,
                             int64_t n_tokens, float scale, float* out, cudaStream_t stream) {
  return embedding_detail::lookup(table, type, n_rows, dim, ids, n_tokens, scale, out, stream);
}

cudaError_t embedding_lookup_f16(const void* table, GgmlType type, int64_t n_rows, int64_t dim, const int32_t* ids,
                                 int64_t n_tokens, float scale, __half* out, cudaStream_t stream) {
  return embedding_detail::lookup(table, type, n_rows, dim, ids, n_tokens, scale, out, stream);
}

}  // namespace fathom::cuda
