#pragma once
// Matrix multiplication against weights in their stored GGUF format, multi-threaded and
// SIMD-dispatched at run time (AVX-512 VNNI / AVX2 / portable).
//   W: [N rows][K] in `wtype` (row stride ggml_row_size(wtype, K) bytes), as in GGUF
//      (a tensor with dims {K, N}).
//   x: [M][K] f32 activations (row stride K);  y: [M][N] f32 (row stride N).
// y[m][n] = sum_k x[m][k] * W[n][k].
// Precision::kF32: weights are dequantized on the fly in registers and multiplied with f32
//   activations (f32 accumulation): matches an f32 reference up to summation order.
// Precision::kQ8: activations are quantized on the fly to 8-bit blocks and multiplied with
//   integer dot products (VNNI) where that is how the format is fast, as ggml does it.
//   Faster; adds activation-quantization error.
//   Activations are quantized per 32-element block: q = round(x / d), d = max|x| / 127, so
//   |x - d q| <= d / 2 and |y - y_exact| <= sum over blocks b of d_b / 2 * sum_{k in b} |W[n][k]|
//   (plus f32 rounding). Float weight formats (F32, F16, BF16) always use the kF32 path.
//   kQ8 is the faster choice for decode (M <= 4); for prefill (larger M) kF32 is faster, as
//   it dequantizes each weight tile once into f32 and runs a register-blocked f32 GEMM.
// Threads take contiguous chunks of W rows (~32 KB) first come first served. K must be a
// multiple of the format's block size. The pool must not be running another job.
#include <cstdint>

#include "kernels/cpu/packed_weights.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/ggml_type.h"

namespace fathom::cpu {

enum class Precision { kF32, kQ8 };

// packed (optional): the same W repacked at load (packed_weights.h). kQ8 reads it instead of W
// when this SIMD level has a kernel for it; kF32 always reads W.
void matmul(ThreadPool& pool, GgmlType wtype, const void* W, int64_t N, int64_t K, const float* x,
            int64_t M, float* y, Precision precision = Precision::kF32, const PackedWeights* packed = nullptr);

// One weight matrix of a matmul_group and where its result goes: W [N][K] in `type`
// (GGUF layout, as for matmul), y [M][N] f32; packed as for matmul.
struct MatmulTarget {
  GgmlType type;
  const void* W;
  int64_t N;
  float* y;
  const PackedWeights* packed = nullptr;
};

// Several matmuls that share the input x [M][K] (Q, K and V; gate and up) as one pool job:
// targets[i].y = x . targets[i].W^T. For kQ8, x is quantized once and the row chunks of all
// matrices are handed out from one queue, so small matrices (K/V projections of a few rows)
// no longer cost a fork/join each and the threads balance across the whole group. Every
// output is bitwise equal to what matmul() gives for the same target (same kernels, same
// rows). kF32 (and float weight formats) run the targets one after the other.
void matmul_group(ThreadPool& pool, const MatmulTarget* targets, int count, int64_t K, const float* x,
                  int64_t M, Precision precision = Precision::kF32);

// One row of W (row index `row`, K elements) dequantized to f32: embedding lookup.
// Bit-exact with ref::dequantize_row.
void dequantize_row(GgmlType wtype, const void* W, int64_t K, int64_t row, float* dst);

// True when matmul / dequantize_row accept `wtype`.
bool matmul_supports(GgmlType wtype);

// Name of the SIMD level chosen at run time: "avx512", "avx2" or "portable".
// The environment variable FATHOM_SIMD=portable|avx2|avx512 caps the level (read once).
const char* simd_level();

// Tests: caps the level at `level` ("portable", "avx2", "avx512"); the effective level is the
// lower of this and what the CPU supports. Returns false (and changes nothing) when the CPU
// does not support `level` or the name is unknown. Not thread-safe with concurrent matmuls.
bool set_simd_level_for_testing(const char* level);

// "amx" when batched Q4_K, Q6_K and Q8_0 matmuls over PackedWeights run on AMX-INT8 tiles (the AVX-512
// level, a CPU and OS that allow AMX, FATHOM_AMX=0 not set), else "off". A row's result is the
// same bits either way.
const char* amx_matmul();

// Tests and benchmarks: turns the AMX packed kernels on or off (on: false, changing nothing,
// where the CPU or OS does not allow them). Not thread-safe with concurrent matmuls.
bool set_amx_matmul_for_testing(bool on);

// Tests and benchmarks: activation rows per packed-kernel call, 1..the level's most (a batch of
// M rows is then run in ceil(M / rows) passes over each panel); 0 restores the level's own.
// Results do not change (every row takes the same instructions); speed does. Returns the
// setting before. Not thread-safe with concurrent matmuls.
int set_packed_rows_per_call_for_testing(int rows);

// Benchmarks: the software prefetch distance in bytes of the AVX-512 VNNI panel kernels
// (DotArgs::prefetch_bytes), over their own choice (prefetch_distance); 0 restores that. A batch
// of more rows than a call takes still sets its own distance for its last pass over a sub-chunk
// (run_rows), and the AVX2 and AMX panel kernels ignore it. Results do not change. Returns the
// setting before. Not thread-safe with concurrent matmuls.
int64_t set_packed_prefetch_bytes_for_testing(int64_t bytes);

}  // namespace fathom::cpu
