#pragma once
// Internal interface between the matmul driver (matmul.cpp) and its per-SIMD-level kernels
// (matmul_portable.cpp, matmul_*_avx2.cpp, matmul_*_avx512.cpp). Not for use outside kernels/cpu.
#include <cstddef>
#include <cstdint>

#include "kernels/ggml_type.h"

namespace fathom::cpu::detail {

// Weight formats matmul reads, as a dense index into the kernel tables.
enum Fmt : int {
  kF32, kF16, kBF16, kQ4_0, kQ4_1, kQ5_0, kQ5_1, kQ8_0, kQ4_K, kQ5_K, kQ6_K, kQ2_K, kQ3_K, kIQ4_NL, kIQ4_XS,
  kMXFP4, kFmtCount
};
// -1 when matmul cannot read `t`.
int fmt_index(GgmlType t);

constexpr int kMaxMr = 4;     // activation rows one dot kernel call handles
constexpr int kMaxPackedMr = 8;    // the most rows a packed kernel keeps in registers
constexpr int kManyPackedMr = 64;  // the most rows any table's packed calls take (packed_max_mr)
constexpr int kActBlock = 32;  // activation quantization block (elements)

// One call computes y[m][n] for m in [0, mr) and n in [n0, n1):
//   y[m * ldy + n] = sum_k x[m][k] * W[n][k].
struct DotArgs {
  const uint8_t* w;  // row n starts at w + n * row_bytes
  size_t row_bytes;
  int64_t K;
  int mr;  // 1..kMaxMr (packed kernels: 1..KernelTable::packed_max_mr)
  // f32 activations (Precision::kF32): x [mr][ldx]; bsum [mr][ldb]: sums of x over each
  // 32-element block (only for Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K; null otherwise).
  const float* x = nullptr;
  int64_t ldx = 0;
  const float* bsum = nullptr;
  int64_t ldb = 0;
  // 8-bit activations (Precision::kQ8), one block per 32 elements of a row:
  //   x[k] ~= qd[k / 32] * q[k];  qsum[b] = sum of the 32 q of block b.
  // Row m's block b: its 32 q at q + m * ldq + b * ldqb, its qd, qsum and qds at index
  // m * ldqs + b * ldsb, its two qsum16 at twice that index. Row-major (every kernel):
  // ldq = K, ldqb = 32, ldqs = K / 32, ldsb = 1. Block-major (the packed kernels of a table with
  // packed_block_major, for a call of M rows): ldq = 32, ldqb = 32 M, ldqs = 1, ldsb = M.
  const int8_t* q = nullptr;
  int64_t ldq = 0, ldqb = 32;
  const float* qd = nullptr;
  const int32_t* qsum = nullptr;
  const int16_t* qsum16 = nullptr;  // sums over 16-element halves (Q2_K, Q3_K, Q6_K)
  const float* qds = nullptr;  // qd[b] * float(qsum[b])
  const int32_t* q16x32 = nullptr;  // 32 * qsum16 as int32 (Q6_K's offset, broadcast from memory)
  int64_t ldqs = 0, ldsb = 1;
  // The same activations in the nibble-split order (KernelTable::q8_split formats): per group
  // g of 4 blocks, xs[g][0..63] = the first 16 q of blocks 4g..4g+3 (16 each, the elements a
  // low nibble holds), xs[g][64..127] = their last 16 q (blocks past K are zero).
  // xs row stride: ldsg groups of 128 bytes.
  const int8_t* xs = nullptr;  // [mr][ldsg][128]
  int64_t ldsg = 0;
  float* y = nullptr;
  int64_t ldy = 0;
  // Packed kernels (KernelTable::dot_packed): w is PackedWeights::data(), row_bytes its
  // panel_bytes(), [n0, n1) are panels, and rows_total = N (the last panel stores N - 16 p rows).
  int64_t rows_total = 0;
  // The AVX-512 VNNI panel kernels' prefetch distance in bytes when > 0 (else their own). A
  // batch of more rows than a call takes visits each sub-chunk of panels once per call: the first
  // call streams it from DRAM, the others find it in L2. run_rows sets the last call's distance
  // to the sub-chunk's bytes, so that it brings the next sub-chunk into L2 while it computes.
  int64_t prefetch_bytes = 0;
};

using DequantFn = void (*)(const void* src, float* dst, int64_t n);
using DotFn = void (*)(const DotArgs& a, int64_t n0, int64_t n1);
// Quantizes one row x[0..K) (K multiple of 32) into q[K], qd[K/32], qsum[K/32], qsum16[K/16].
// q = round-half-away(x / d), d = max|x| / 127 (d = 0 and q = 0 for an all-zero block).
using QuantizeQ8Fn = void (*)(const float* x, int64_t K, int8_t* q, float* qd, int32_t* qsum,
                              int16_t* qsum16);
// y[m][n] (+)= sum_{k<K} x[m][k] * w[n][k] for m < M, n < N; x [M][ldx], w [N][ldw], y [M][ldy].
// Overwrites y when !accumulate.
using GemmF32Fn = void (*)(const float* x, int64_t ldx, const float* w, int64_t ldw, int64_t M,
                           int64_t N, int64_t K, float* y, int64_t ldy, bool accumulate);

// A null entry means "use the portable kernel".
struct KernelTable {
  DequantFn dequant[kFmtCount] = {};
  DotFn dot_f32[kFmtCount] = {};
  DotFn dot_q8[kFmtCount] = {};
  bool q8_split[kFmtCount] = {};  // dot_q8[f] reads DotArgs::xs / qds
  DotFn dot_packed[kFmtCount] = {};  // kQ8 over PackedWeights panels (no portable fallback)
  // Activation rows one dot_packed call takes (<= kManyPackedMr): each unpacked weight vector
  // serves that many rows before the next is unpacked.
  int packed_max_mr = kMaxMr;
  // Formats whose packed kernel takes another most (nonzero entries; AMX: Q4_K, Q6_K, Q8_0 16).
  int packed_max_mr_of[kFmtCount] = {};
  // dot_packed reads the activations through DotArgs::ldqb and ldsb, so a batch's can be laid
  // out block-major: a block's rows side by side, and the row loop reads consecutive cache lines
  // instead of one line per row K bytes apart (AVX2 at 16 rows: 8-19% faster a matrix).
  bool packed_block_major = false;
  QuantizeQ8Fn quantize_q8 = nullptr;
  GemmF32Fn gemm_f32 = nullptr;
};

const KernelTable& portable_kernels();
const KernelTable& avx2_kernels();    // defined in matmul_*_avx2.cpp
const KernelTable& avx512_kernels();  // defined in matmul_*_avx512.cpp

// Registration hooks the per-ISA files fill in (each file adds its own entries).
// Called once, and only when the CPU supports the ISA.
void register_avx2_dequant(KernelTable& t);   // matmul_dequant_avx2.cpp
void register_avx2_dot_f32(KernelTable& t);   // matmul_dotf32_avx2.cpp
void register_avx2_dot_q8(KernelTable& t);    // matmul_dotq8_avx2.cpp
void register_avx2_gemm(KernelTable& t);      // matmul_avx2.cpp (also quantize_q8)
void register_avx2_dot_packed(KernelTable& t);  // matmul_packed_avx2.cpp
void register_avx512_dequant(KernelTable& t);
void register_avx512_dot_f32(KernelTable& t);
void register_avx512_dot_q8(KernelTable& t);
void register_avx512_gemm(KernelTable& t);
void register_avx512_dot_packed(KernelTable& t);  // matmul_packed_avx512.cpp
// After the AVX-512 hooks, where the CPU and OS allow AMX-INT8 (cpu::amx_int8_usable): batched
// Q4_K, Q6_K and Q8_0 on tiles, small calls still to the AVX-512 kernels.
void register_amx_dot_packed(KernelTable& t);     // matmul_packed_amx.cpp

// The packed kernel of format f at the active SIMD level, or null (then the stored layout is read).
DotFn dot_packed_fn(int f);

}  // namespace fathom::cpu::detail
