#pragma once
// Weight matrices repacked at load time into row panels for the kQ8 decode kernels
// (llama.cpp's "repack" idea): 16 rows of W are interleaved so that one 64-byte load holds
// 4 consecutive quants of each of the 16 rows, one VNNI dot product (_mm512_dpbusd_epi32 against
// 4 activation bytes broadcast to every lane) advances all 16 rows by 4 columns, and a panel's
// 16 results leave the kernel as one vector store — no per-row horizontal sums, no per-row
// scale gathering. The stored kernels (matmul_dotq8_*.cpp) spend about as many instructions per
// row as the row has bytes; the panel kernels about a third of that, so they keep up with
// memory at decode. AVX2 reads the same layout as two 8-row halves per 64 bytes, with maddubs
// instead of dpbusd (matmul_packed_avx2.cpp).
//
// Layout: panel p covers rows [16p, 16p + 16) (rows past N are zero), K / 32 blocks of 32
// columns (K-quants: K / 256 super-blocks); panel_bytes() apart, 64-byte aligned, in 2 MiB pages where the kernel allows
// (HugePageBuffer: one TLB entry per 2 MiB instead of per 4 KiB of a streamed matrix).
//   quants: K / 32 chunks of kQuantBytes, then scales: K / 32 chunks of kScaleBytes.
//   Q8_0: quants 8 x 64 bytes; vector j, lane r = q[r][4j .. 4j + 3] + 128 (unsigned bytes).
//         scales: d of the 16 rows (f16).
//   Q4_0, Q4_1, IQ4_NL: quants 4 x 64 bytes; vector j, lane r = qs[r][4j .. 4j + 3] as stored (low
//         nibbles: columns 4j..4j+3, high nibbles: 16 + 4j..16 + 4j + 3).
//         scales: d of the 16 rows (f16), then (Q4_1) m of the 16 rows (f16).
//   Q5_0, Q5_1: the Q4 quants, then 64 bytes of 5th bits: byte j of lane r holds, in bits
//         0..3, those of columns 4j..4j+3 and, in bits 4..7, those of 16 + 4j..16 + 4j + 3 (the
//         elements of vector j's low / high nibbles). scales as Q4_0 / Q4_1.
//   Q4_K, Q6_K: per 256-column super-block instead of per 32 columns (byte maps in
//         packed_weights.cpp, pack_q4_k / pack_q6_k): each 32-column sub-block's quants in the
//         Q4 nibble layout (Q6_K: plus its 2-bit highs), the rows' sub-block scales (and Q4_K
//         mins) as bytes, and the rows' d (dmin). Same bytes per row as stored (+1% padding, Q6_K).
//   IQ4_XS: as Q4_K without mins: the level indices as nibbles, the rows' signed 6-bit scales,
//         their d (+3% padding). Q3_K: per sub-block two vectors of 2-bit quants and one of 3rd
//         bits (pack_q3_k), 16-column scales as Q6_K's, the rows' d (+5.5% over stored). Q2_K:
//         Q3_K's 2-bit vectors, the stored scale|min bytes per 16 columns, d and dmin (no padding).
// Values are exactly the stored ones (no requantization): results match the stored kernels'
// up to f32 summation order.
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/huge_buffer.h"
#include "kernels/ggml_type.h"

namespace fathom {
class ThreadPool;
}

namespace fathom::cpu {

class PackedWeights {
 public:
  static constexpr int kPanelRows = 16;

  // True when this machine's kernels read `type` packed at the SIMD level active now (AVX-512
  // VNNI and AVX2: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q6_K, IQ4_XS).
  static bool supported(GgmlType type);

  // W: [N][K] in `type`, GGUF layout (as matmul takes it). Requires supported(type).
  // Owns its memory (a HugePageBuffer: whole 2 MiB pages, so meant for large or single matrices).
  PackedWeights(GgmlType type, const void* W, int64_t N, int64_t K);
  // Writes into dst (bytes_for(type, N, K) bytes, 64-byte aligned, outliving this object): many
  // matrices packed into one arena share its huge pages instead of rounding each up to 2 MiB.
  // With a pool, its threads pack the panels (the same bytes; model load: the first touch of the
  // arena's pages and the repacking both split over the cores).
  PackedWeights(GgmlType type, const void* W, int64_t N, int64_t K, uint8_t* dst, ThreadPool* pool = nullptr);
  static size_t bytes_for(GgmlType type, int64_t N, int64_t K);

  GgmlType type() const { return type_; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  int64_t panels() const { return (rows_ + kPanelRows - 1) / kPanelRows; }
  size_t panel_bytes() const { return panel_bytes_; }
  const uint8_t* data() const { return data_; }
  size_t bytes() const { return panel_bytes_ * static_cast<size_t>(panels()); }

 private:
  GgmlType type_;
  int64_t rows_, cols_;
  size_t panel_bytes_;
  HugePageBuffer buffer_;  // empty when packed into caller memory
  const uint8_t* data_ = nullptr;
  void pack(const void* W, uint8_t* dst, ThreadPool* pool);
};

}  // namespace fathom::cpu
