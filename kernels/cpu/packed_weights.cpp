#include "kernels/cpu/packed_weights.h"

#include <cstring>

#include "base/error.h"
#include "kernels/cpu/matmul_kernels.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/quant_blocks.h"

namespace fathom::cpu {
namespace {

using namespace fathom::quant;
constexpr int kRows = PackedWeights::kPanelRows;

// Byte offsets within a block of the 32-element nibble formats (-1: absent).
struct NibbleFormat {
  int block, qs, qh, d, m;
};
NibbleFormat nibble_format(GgmlType type) {
  switch (type) {
    case GgmlType::Q4_0: return {sizeof(BlockQ4_0), offsetof(BlockQ4_0, qs), -1, offsetof(BlockQ4_0, d), -1};
    case GgmlType::Q4_1: return {sizeof(BlockQ4_1), offsetof(BlockQ4_1, qs), -1, offsetof(BlockQ4_1, d), offsetof(BlockQ4_1, m)};
    case GgmlType::Q5_0: return {sizeof(BlockQ5_0), offsetof(BlockQ5_0, qs), offsetof(BlockQ5_0, qh), offsetof(BlockQ5_0, d), -1};
    case GgmlType::IQ4_NL: return {sizeof(BlockIQ4_NL), offsetof(BlockIQ4_NL, qs), -1, offsetof(BlockIQ4_NL, d), -1};
    default: return {sizeof(BlockQ5_1), offsetof(BlockQ5_1, qs), offsetof(BlockQ5_1, qh), offsetof(BlockQ5_1, d), offsetof(BlockQ5_1, m)};
  }
}

// Bytes of one 32-column block of a panel of the 32-element formats: quants, then scales.
int quant_bytes(GgmlType type) {
  switch (type) {
    case GgmlType::Q8_0: return 512;
    case GgmlType::Q5_0: case GgmlType::Q5_1: return 320;
    default: return 256;
  }
}
int scale_bytes(GgmlType type) { return type == GgmlType::Q4_1 || type == GgmlType::Q5_1 ? 64 : 32; }

// The panel interleave: dst[64 v + 4 r + t] = byte(r, 4 v + t) for vectors v < `vectors`, i.e.
// vector v holds bytes 4v..4v+3 of each of the 16 rows (one 32-bit lane per row).
template <typename Byte>
void interleave_rows(uint8_t* dst, int vectors, Byte byte) {
  for (int v = 0; v < vectors; ++v)
    for (int r = 0; r < kRows; ++r)
      for (int t = 0; t < 4; ++t) dst[64 * v + 4 * r + t] = byte(r, 4 * v + t);
}

// Copies the 16 rows' f16 field at byte `field` of block b into dst[0..16) (zero past N).
void gather_f16(const uint8_t* W, size_t row_bytes, int64_t r0, int64_t N, int64_t b, int block_bytes,
                int field, uint8_t* dst) {
  for (int r = 0; r < kRows; ++r) {
    uint16_t h = 0;
    if (r0 + r < N) std::memcpy(&h, W + (r0 + r) * row_bytes + b * block_bytes + field, 2);
    std::memcpy(dst + 2 * r, &h, 2);
  }
}

// One panel (rows r0..r0+15) of Q8_0, Q4_x or Q5_x into dst (panel_bytes).
void pack_panel(GgmlType type, const uint8_t* W, size_t row_bytes, int64_t r0, int64_t N, int64_t nb,
                uint8_t* dst) {
  const int qb = quant_bytes(type);
  uint8_t* scales = dst + nb * qb;
  const int sb = scale_bytes(type);
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* q = dst + b * qb;
    uint8_t* s = scales + b * sb;
    if (type == GgmlType::Q8_0) {
      const auto byte_at = [&](int r, int off) -> uint8_t {
        return r0 + r < N ? W[(r0 + r) * row_bytes + b * sizeof(BlockQ8_0) + off] : uint8_t{0};
      };
      // s8 -> s8 + 128 (rows past N: 0 -> 128, with d = 0).
      interleave_rows(q, 8, [&](int r, int k) { return static_cast<uint8_t>(byte_at(r, offsetof(BlockQ8_0, qs) + k) ^ 0x80); });
      gather_f16(W, row_bytes, r0, N, b, sizeof(BlockQ8_0), offsetof(BlockQ8_0, d), s);
    } else {
      const NibbleFormat f = nibble_format(type);
      const auto byte_at = [&](int r, int off) -> uint8_t {
        return r0 + r < N ? W[(r0 + r) * row_bytes + b * f.block + off] : uint8_t{0};
      };
      interleave_rows(q, 4, [&](int r, int k) { return byte_at(r, f.qs + k); });
      if (f.qh >= 0)  // Q5: the 5th bits, regrouped per quant vector (layout in the header)
        for (int r = 0; r < kRows; ++r) {
          uint32_t qh = 0;
          for (int t = 0; t < 4; ++t) qh |= static_cast<uint32_t>(byte_at(r, f.qh + t)) << (8 * t);
          for (int j = 0; j < 4; ++j) {
            uint8_t bits = 0;
            for (int t = 0; t < 4; ++t) {
              bits |= static_cast<uint8_t>(((qh >> (4 * j + t)) & 1u) << t);
              bits |= static_cast<uint8_t>(((qh >> (16 + 4 * j + t)) & 1u) << (4 + t));
            }
            q[256 + 4 * r + j] = bits;
          }
        }
      gather_f16(W, row_bytes, r0, N, b, f.block, f.d, s);
      if (f.m >= 0) gather_f16(W, row_bytes, r0, N, b, f.block, f.m, s + 32);
    }
  }
}

// ---- K-quants: one unit per 256-column super-block ---------------------------------------------

// Nibble vectors of one 32-column sub-block (4 x 64 bytes, the Q4_1 panel layout): vector v,
// lane r, byte t = q(r, 4v + t) | q(r, 16 + 4v + t) << 4, with q(r, k) the 4-bit value of
// column k of the sub-block.
template <typename Q>
void pack_nibbles(uint8_t* dst, Q q) {
  interleave_rows(dst, 4, [&](int r, int k) { return static_cast<uint8_t>((q(r, k) & 15) | (q(r, 16 + k) & 15) << 4); });
}

// Q4_K super-block i of rows r0..r0+15: [8 x 256 nibbles][8 x 16 sc][8 x 16 m][16 d][16 dmin].
void pack_q4_k(const uint8_t* W, size_t row_bytes, int64_t r0, int64_t N, int64_t i, uint8_t* dst) {
  const BlockQ4_K zero{};  // rows past N: d = dmin = 0
  auto block = [&](int r) {
    return r0 + r < N ? reinterpret_cast<const BlockQ4_K*>(W + (r0 + r) * row_bytes) + i : &zero;
  };
  for (int j = 0; j < 8; ++j) {
    // Sub-block j: chunk j / 2 of qs, low nibbles for even j, high for odd.
    pack_nibbles(dst + 256 * j, [&](int r, int k) { return block(r)->qs[32 * (j / 2) + k] >> (4 * (j % 2)); });
    for (int r = 0; r < kRows; ++r) scale_min_k4(j, block(r)->scales, &dst[2048 + 16 * j + r], &dst[2176 + 16 * j + r]);
  }
  for (int r = 0; r < kRows; ++r) {
    std::memcpy(dst + 2304 + 2 * r, &block(r)->d, 2);
    std::memcpy(dst + 2336 + 2 * r, &block(r)->dmin, 2);
  }
}

// The 6-bit value (0..63) of column k of a Q6_K super-block (ggml's layout, see ref::dequantize_row).
int q6_k_value(const BlockQ6_K& b, int k) {
  const int h = k / 128, l = k % 32, quarter = (k % 128) / 32;  // quarter 0..3: q1..q4 of ggml
  const uint8_t ql = b.ql[64 * h + 32 * (quarter % 2) + l];
  const int low = quarter < 2 ? ql & 15 : ql >> 4;
  const int high = (b.qh[32 * h + l] >> (2 * quarter)) & 3;
  return low | high << 4;
}

// Q6_K super-block i of rows r0..r0+15:
//   [8 x 256 low nibbles][8 x 128 high bits][8 x 32 scales][16 d] (+32 bytes padding)
// High bits of sub-block j: 2 vectors; vector p, lane r, byte t holds the 2-bit highs of the
// columns of nibble vectors 2p (bits 0-3) and 2p + 1 (bits 4-7): bits 0-1 its low-nibble column,
// bits 2-3 its high-nibble column. Scales of sub-block j: 16 rows' scale of columns 0..15, then
// of 16..31 (int8).
void pack_q6_k(const uint8_t* W, size_t row_bytes, int64_t r0, int64_t N, int64_t i, uint8_t* dst) {
  const BlockQ6_K zero{};  // rows past N: d = 0
  auto block = [&](int r) -> const BlockQ6_K& {
    return r0 + r < N ? reinterpret_cast<const BlockQ6_K*>(W + (r0 + r) * row_bytes)[i] : zero;
  };
  for (int j = 0; j < 8; ++j) {
    auto q = [&](int r, int k) { return q6_k_value(block(r), 32 * j + k); };
    pack_nibbles(dst + 256 * j, q);
    uint8_t* hb = dst + 2048 + 128 * j;
    for (int p = 0; p < 2; ++p)
      for (int r = 0; r < kRows; ++r)
        for (int t = 0; t < 4; ++t) {
          uint8_t bits = 0;
          for (int half = 0; half < 2; ++half) {
            const int v = 2 * p + half;
            bits |= static_cast<uint8_t>(((q(r, 4 * v + t) >> 4) | (q(r, 16 + 4 * v + t) >> 4) << 2) << (4 * half));
          }
          hb[64 * p + 4 * r + t] = bits;
        }
    for (int r = 0; r < kRows; ++r) {
      dst[3072 + 32 * j + r] = static_cast<uint8_t>(block(r).scales[2 * j]);
      dst[3072 + 32 * j + 16 + r] = static_cast<uint8_t>(block(r).scales[2 * j + 1]);
    }
  }
  for (int r = 0; r < kRows; ++r) std::memcpy(dst + 3328 + 2 * r, &block(r).d, 2);
}

// Q3_K super-block i of rows r0..r0+15, per sub-block j (32 columns) 192 bytes of quants:
//   [64: low 2 bits of columns 0..15][64: of columns 16..31][64: 3rd bits]
// then [8 x 32 scales][16 d] (+32 bytes padding). In the 2-bit vectors, byte t of lane r holds in
// bits 2k..2k+1 column 4k + t (+16); in the 3rd-bit vector, bit k column 4k + t and bit 4 + k
// column 16 + 4k + t: shifting by 2k (by k, 4 + k) gives nibble vector k of the Q4 layout.
// Scales of sub-block j: 16 rows' signed scale (-32..31) of columns 0..15, then of 16..31.
void pack_q3_k(const uint8_t* W, size_t row_bytes, int64_t r0, int64_t N, int64_t i, uint8_t* dst) {
  const BlockQ3_K zero{};  // rows past N: d = 0
  auto block = [&](int r) -> const BlockQ3_K& {
    return r0 + r < N ? reinterpret_cast<const BlockQ3_K*>(W + (r0 + r) * row_bytes)[i] : zero;
  };
  // Element e = 128 h + 32 j + l: bits 2j of qs[32 h + l] and bit 4h + j of hmask[l].
  auto low2 = [&](int r, int e) { return (block(r).qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3; };
  auto bit3 = [&](int r, int e) { return (block(r).hmask[e % 32] >> (e / 32)) & 1; };
  for (int j = 0; j < 8; ++j) {
    uint8_t* q = dst + 192 * j;
    for (int r = 0; r < kRows; ++r)
      for (int t = 0; t < 4; ++t) {
        uint8_t lo = 0, hi = 0, h3 = 0;
        for (int k = 0; k < 4; ++k) {
          const int c = 32 * j + 4 * k + t;
          lo |= static_cast<uint8_t>(low2(r, c) << (2 * k));
          hi |= static_cast<uint8_t>(low2(r, c + 16) << (2 * k));
          h3 |= static_cast<uint8_t>(bit3(r, c) << k | bit3(r, c + 16) << (4 + k));
        }
        q[4 * r + t] = lo;
        q[64 + 4 * r + t] = hi;
        q[128 + 4 * r + t] = h3;
      }
    for (int r = 0; r < kRows; ++r) {
      int8_t sc[16];
      q3_k_scales(block(r).scales, sc);
      dst[1536 + 32 * j + r] = static_cast<uint8_t>(sc[2 * j]);
      dst[1536 + 32 * j + 16 + r] = static_cast<uint8_t>(sc[2 * j + 1]);
    }
  }
  for (int r = 0; r < kRows; ++r) std::memcpy(dst + 1792 + 2 * r, &block(r).d, 2);
}

// Q2_K super-block i of rows r0..r0+15, per sub-block j (32 columns) 128 bytes of quants: the
// 2-bit vectors of pack_q3_k (columns 0..15, then 16..31); then [8 x 32 scale bytes][16 d][16 dmin]:
// the scale byte of sub-block j, columns 0..15 then 16..31, of the 16 rows, as stored (scale in the
// low nibble, min in the high one). Exactly the stored bytes per row.
void pack_q2_k(const uint8_t* W, size_t row_bytes, int64_t r0, int64_t N, int64_t i, uint8_t* dst) {
  const BlockQ2_K zero{};  // rows past N: d = dmin = 0
  auto block = [&](int r) -> const BlockQ2_K& {
    return r0 + r < N ? reinterpret_cast<const BlockQ2_K*>(W + (r0 + r) * row_bytes)[i] : zero;
  };
  auto low2 = [&](int r, int e) { return (block(r).qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3; };
  for (int j = 0; j < 8; ++j) {
    uint8_t* q = dst + 128 * j;
    for (int r = 0; r < kRows; ++r)
      for (int t = 0; t < 4; ++t) {
        uint8_t lo = 0, hi = 0;
        for (int k = 0; k < 4; ++k) {
          lo |= static_cast<uint8_t>(low2(r, 32 * j + 4 * k + t) << (2 * k));
          hi |= static_cast<uint8_t>(low2(r, 32 * j + 16 + 4 * k + t) << (2 * k));
        }
        q[4 * r + t] = lo;
        q[64 + 4 * r + t] = hi;
      }
    for (int r = 0; r < kRows; ++r) {
      dst[1024 + 32 * j + r] = block(r).scales[2 * j];
      dst[1024 + 32 * j + 16 + r] = block(r).scales[2 * j + 1];
    }
  }
  for (int r = 0; r < kRows; ++r) {
    std::memcpy(dst + 1280 + 2 * r, &block(r).d, 2);
    std::memcpy(dst + 1312 + 2 * r, &block(r).dmin, 2);
  }
}

// IQ4_XS super-block i of rows r0..r0+15: [8 x 256 nibbles (the level indices, Q4 layout)]
// [8 x 16 scales][16 d] (+32 bytes padding). Scales of sub-block j: 16 rows' signed scale.
void pack_iq4_xs(const uint8_t* W, size_t row_bytes, int64_t r0, int64_t N, int64_t i, uint8_t* dst) {
  const BlockIQ4_XS zero{};  // rows past N: d = 0
  auto block = [&](int r) -> const BlockIQ4_XS& {
    return r0 + r < N ? reinterpret_cast<const BlockIQ4_XS*>(W + (r0 + r) * row_bytes)[i] : zero;
  };
  for (int j = 0; j < 8; ++j) {
    // Column k < 16 of sub-block j: low nibble of qs[16 j + k]; column 16 + k: its high nibble.
    pack_nibbles(dst + 256 * j, [&](int r, int k) { return block(r).qs[16 * j + k % 16] >> (4 * (k / 16)); });
    for (int r = 0; r < kRows; ++r) dst[2048 + 16 * j + r] = static_cast<uint8_t>(iq4_xs_scale(block(r), j));
  }
  for (int r = 0; r < kRows; ++r) std::memcpy(dst + 2176 + 2 * r, &block(r).d, 2);
}

// Bytes per super-block panel (64-byte multiples).
constexpr int kQ4KUnit = 2368, kQ6KUnit = 3392, kQ3KUnit = 1856, kIQ4XSUnit = 2240, kQ2KUnit = 1344;

bool is_k_quant(GgmlType t) {
  return t == GgmlType::Q4_K || t == GgmlType::Q6_K || t == GgmlType::Q3_K || t == GgmlType::IQ4_XS ||
         t == GgmlType::Q2_K;
}
int k_unit_bytes(GgmlType t) {
  switch (t) {
    case GgmlType::Q2_K: return kQ2KUnit;
    case GgmlType::Q3_K: return kQ3KUnit;
    case GgmlType::Q4_K: return kQ4KUnit;
    case GgmlType::Q6_K: return kQ6KUnit;
    default: return kIQ4XSUnit;
  }
}

}  // namespace

bool PackedWeights::supported(GgmlType type) {
  const int f = detail::fmt_index(type);
  return f >= 0 && detail::dot_packed_fn(f) != nullptr;
}

namespace {

// Bytes of one panel (16 rows) of [K] columns in `type`, rounded up to whole cache lines so that
// every panel's quant vectors stay 64-byte aligned. Throws for an unsupported type or shape.
size_t panel_bytes_for(GgmlType type, int64_t N, int64_t K) {
  FATHOM_CHECK(type == GgmlType::Q8_0 || type == GgmlType::Q4_0 || type == GgmlType::Q4_1 ||
                   type == GgmlType::Q5_0 || type == GgmlType::Q5_1 || type == GgmlType::IQ4_NL || is_k_quant(type),
               "PackedWeights: only Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q6_K and IQ4_XS are packed");
  const int64_t unit = is_k_quant(type) ? 256 : 32;
  FATHOM_CHECK(N > 0 && K > 0 && K % unit == 0, "PackedWeights: bad shape");
  const int64_t unit_bytes = is_k_quant(type) ? k_unit_bytes(type) : quant_bytes(type) + scale_bytes(type);
  return static_cast<size_t>((K / unit * unit_bytes + 63) / 64 * 64);
}

}  // namespace

size_t PackedWeights::bytes_for(GgmlType type, int64_t N, int64_t K) {
  return panel_bytes_for(type, N, K) * static_cast<size_t>((N + kPanelRows - 1) / kPanelRows);
}

PackedWeights::PackedWeights(GgmlType type, const void* W, int64_t N, int64_t K)
    : type_(type), rows_(N), cols_(K), panel_bytes_(panel_bytes_for(type, N, K)) {
  buffer_ = HugePageBuffer(bytes());
  pack(W, reinterpret_cast<uint8_t*>(buffer_.data()), nullptr);
}

PackedWeights::PackedWeights(GgmlType type, const void* W, int64_t N, int64_t K, uint8_t* dst, ThreadPool* pool)
    : type_(type), rows_(N), cols_(K), panel_bytes_(panel_bytes_for(type, N, K)) {
  FATHOM_CHECK(reinterpret_cast<uintptr_t>(dst) % 64 == 0, "PackedWeights: destination not 64-byte aligned");
  pack(W, dst, pool);
}

void PackedWeights::pack(const void* W, uint8_t* out, ThreadPool* pool) {
  data_ = out;
  const int64_t N = rows_, K = cols_;
  const auto* w = static_cast<const uint8_t*>(W);
  const size_t row_bytes = ggml_row_size(type_, K);
  const int64_t nb = K / (is_k_quant(type_) ? 256 : 32);
  const auto pack_panel_p = [&](int64_t p) {
    uint8_t* dst = out + p * panel_bytes_;
    if (type_ == GgmlType::Q4_K)
      for (int64_t i = 0; i < nb; ++i) pack_q4_k(w, row_bytes, p * kRows, N, i, dst + i * kQ4KUnit);
    else if (type_ == GgmlType::Q6_K)
      for (int64_t i = 0; i < nb; ++i) pack_q6_k(w, row_bytes, p * kRows, N, i, dst + i * kQ6KUnit);
    else if (type_ == GgmlType::Q2_K)
      for (int64_t i = 0; i < nb; ++i) pack_q2_k(w, row_bytes, p * kRows, N, i, dst + i * kQ2KUnit);
    else if (type_ == GgmlType::Q3_K)
      for (int64_t i = 0; i < nb; ++i) pack_q3_k(w, row_bytes, p * kRows, N, i, dst + i * kQ3KUnit);
    else if (type_ == GgmlType::IQ4_XS)
      for (int64_t i = 0; i < nb; ++i) pack_iq4_xs(w, row_bytes, p * kRows, N, i, dst + i * kIQ4XSUnit);
    else
      pack_panel(type_, w, row_bytes, p * kRows, N, nb, dst);
  };
  if (pool == nullptr) {
    for (int64_t p = 0; p < panels(); ++p) pack_panel_p(p);
  } else {
    pool->parallel_for(panels(), [&](int64_t begin, int64_t end, int) {
      for (int64_t p = begin; p < end; ++p) pack_panel_p(p);
    });
  }
}

}  // namespace fathom::cpu
