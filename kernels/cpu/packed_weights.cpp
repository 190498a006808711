#include "kernels/cpu/packed_weights.h"

#include <cstring>

#include "engine/error.h"
#include "kernels/cpu/matmul_kernels.h"
#include "kernels/cpu/quant_blocks.h"

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
    default: return {sizeof(BlockQ5_1), offsetof(BlockQ5_1, qs), offsetof(BlockQ5_1, qh), offsetof(BlockQ5_1, d), offsetof(BlockQ5_1, m)};
  }
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
  const int qb = PackedWeights::quant_bytes(type);
  uint8_t* scales = dst + nb * qb;
  const int sb = PackedWeights::scale_bytes(type);
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* q = dst + b * qb;
    uint8_t* s = scales + b * sb;
    if (type == GgmlType::Q8_0) {
      for (int j = 0; j < 8; ++j)
        for (int r = 0; r < kRows; ++r)
          for (int t = 0; t < 4; ++t) {
            const uint8_t v = r0 + r < N ? W[(r0 + r) * row_bytes + b * sizeof(BlockQ8_0) + offsetof(BlockQ8_0, qs) + 4 * j + t]
                                         : uint8_t{0};
            q[64 * j + 4 * r + t] = static_cast<uint8_t>(v ^ 0x80);  // s8 -> s8 + 128 (rows past N: 0 -> 128, d = 0)
          }
      gather_f16(W, row_bytes, r0, N, b, sizeof(BlockQ8_0), offsetof(BlockQ8_0, d), s);
    } else {
      const NibbleFormat f = nibble_format(type);
      const auto byte_at = [&](int r, int off) -> uint8_t {
        return r0 + r < N ? W[(r0 + r) * row_bytes + b * f.block + off] : uint8_t{0};
      };
      for (int j = 0; j < 4; ++j)
        for (int r = 0; r < kRows; ++r)
          for (int t = 0; t < 4; ++t) q[64 * j + 4 * r + t] = byte_at(r, f.qs + 4 * j + t);
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

}  // namespace

int PackedWeights::quant_bytes(GgmlType type) {
  switch (type) {
    case GgmlType::Q8_0: return 512;
    case GgmlType::Q5_0: case GgmlType::Q5_1: return 320;
    default: return 256;
  }
}
int PackedWeights::scale_bytes(GgmlType type) { return type == GgmlType::Q4_1 || type == GgmlType::Q5_1 ? 64 : 32; }

bool PackedWeights::supported(GgmlType type) {
  const int f = detail::fmt_index(type);
  return f >= 0 && detail::dot_packed_fn(f) != nullptr;
}

PackedWeights::PackedWeights(GgmlType type, const void* W, int64_t N, int64_t K)
    : type_(type), rows_(N), cols_(K) {
  FATHOM_CHECK(type == GgmlType::Q8_0 || type == GgmlType::Q4_0 || type == GgmlType::Q4_1 ||
                   type == GgmlType::Q5_0 || type == GgmlType::Q5_1,
               "PackedWeights: only Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 are packed");
  FATHOM_CHECK(N > 0 && K > 0 && K % 32 == 0, "PackedWeights: bad shape");
  const int64_t nb = K / 32;
  // Rounded up to whole cache lines: every panel's quant vectors stay 64-byte aligned.
  panel_bytes_ = static_cast<size_t>((nb * (quant_bytes(type) + scale_bytes(type)) + 63) / 64 * 64);
  buffer_ = HugePageBuffer(panel_bytes_ * static_cast<size_t>(panels()));
  const auto* w = static_cast<const uint8_t*>(W);
  const size_t row_bytes = ggml_row_size(type, K);
  uint8_t* out = reinterpret_cast<uint8_t*>(buffer_.data());
  for (int64_t p = 0; p < panels(); ++p) pack_panel(type, w, row_bytes, p * kRows, N, nb, out + p * panel_bytes_);
}

}  // namespace fathom::cpu
