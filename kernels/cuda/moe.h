#pragma once
// Mixture-of-experts ops on the device: the expert matmuls as one grouped launch per projection
// (a GEMV for decode-sized runs of pairs, a GEMM for prefill-sized ones), and the gather /
// weighted-combine of the (token, slot) pairs around them.
// Spec: a double dot product per (pair, output) against each expert's rows (ref::dequantize_row);
// the combine as cpu backend's (test_cuda_moe compares both).
#include <cstdint>

#include "kernels/cuda/emu/cuda_emu.h"
#include "kernels/ggml_type.h"

namespace fathom::cuda {

// A run of consecutive pair rows that share an expert: rows [first, first + count) of x and y;
// 1..4 rows for grouped_gemv, 1..kGroupedGemmRows for grouped_gemm.
struct ExpertRows {
  int32_t expert;
  int32_t first;
  int32_t count;
};

// Most pair rows of one grouped_gemm item (its tile of rows).
constexpr int32_t kGroupedGemmRows = 64;

// For every item i and output n < n_out: y[r][n] = Σ_k W_e[n][k] · x[r][k], e = items[i].expert,
// r in the item's rows. Grid (ceil(n_out / 4), n_items): one launch reads each item's expert rows
// once for all of its (<= 4) pairs, so an expert's matrix is read once per 4 of its pairs.
//   w: the stacked experts; expert e's [n_out] rows start at w + e · expert_stride bytes, each row
//      ggml_row_size(type, k) bytes, 16-byte aligned; type: a quant_gemv format, F16 or F32
//   x: [rows][k] f32 (16-byte aligned), y: [rows][n_out] f32; items: device array [n_items]
// Returns cudaErrorInvalidValue on an unsupported type, shape or alignment.
cudaError_t grouped_gemv(GgmlType type, const void* w, int64_t expert_stride, int64_t n_out, int64_t k, const float* x,
                         float* y, const ExpertRows* items, int32_t n_items, cudaStream_t stream);

// The same product as grouped_gemv, for items of 1..kGroupedGemmRows rows: grid (ceil(n_out / 64),
// n_items), a block dequantizes a 64-output tile of its item's expert once (32 columns of k at a
// time, into shared memory) and multiplies it with all the item's rows, f32 accumulation; so an
// expert with n pairs is read ceil(n / kGroupedGemmRows) times. Prefill-sized runs; for runs of
// <= 4 pairs grouped_gemv reads as few bytes without the shared-memory staging.
//   type: a quant_gemv format (k a multiple of its block), F16, BF16 or F32 (any k); w, x, y,
//   items and the alignment as grouped_gemv's. Returns cudaErrorInvalidValue on an unsupported
//   type, shape or alignment.
cudaError_t grouped_gemm(GgmlType type, const void* w, int64_t expert_stride, int64_t n_out, int64_t k, const float* x,
                         float* y, const ExpertRows* items, int32_t n_items, cudaStream_t stream);

// out[p] = x[rows[p]] for p < n: rows of `width` floats (device pointers).
cudaError_t gather_rows(const float* x, const int32_t* rows, int64_t n, int64_t width, float* out,
                        cudaStream_t stream);

// out[t] = Σ_{j < used} weight[pair[t·used + j]] · y[pair[t·used + j]] for t < tokens, rows of
// `width` floats, summed in slot order j (device pointers).
cudaError_t combine_experts(const float* y, const int32_t* pair, const float* weight, int64_t tokens, int32_t used,
                            int64_t width, float* out, cudaStream_t stream);

}  // namespace fathom::cuda
