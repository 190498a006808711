#include "kernels/cpu/packed_weights.h"

#include <cstring>

#include "engine/error.h"
#include "kernels/cpu/matmul_kernels.h"
#include "kernels/cpu/quant_blocks.h"

namespace fathom::cpu {
namespace {

using namespace fathom::quant;
constexpr int kRows = PackedWeights::kPanelRows;

// Copies the 16 rows' f16 field at byte `field` of block b into dst[0..16) (zero past N).
void gather_f16(const uint8_t* W, size_t row_bytes, int64_t r0, int64_t N, int64_t b, int block_bytes,
                int field, uint8_t* dst) {
  for (int r = 0; r < kRows; ++r) {
    uint16_t h = 0;
    if (r0 + r < N) std::memcpy(&h, W + (r0 + r) * row_bytes + b * block_bytes + field, 2);
    std::memcpy(dst + 2 * r, &h, 2);
  }
}

// One panel (rows r0..r0+15) of Q8_0 or Q4_x into dst (panel_bytes).
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
      const bool q41 = type == GgmlType::Q4_1;
      const int block = q41 ? sizeof(BlockQ4_1) : sizeof(BlockQ4_0);
      const int qs = q41 ? offsetof(BlockQ4_1, qs) : offsetof(BlockQ4_0, qs);
      for (int j = 0; j < 4; ++j)
        for (int r = 0; r < kRows; ++r)
          for (int t = 0; t < 4; ++t)
            q[64 * j + 4 * r + t] = r0 + r < N ? W[(r0 + r) * row_bytes + b * block + qs + 4 * j + t] : uint8_t{0};
      gather_f16(W, row_bytes, r0, N, b, block, q41 ? offsetof(BlockQ4_1, d) : offsetof(BlockQ4_0, d), s);
      if (q41) gather_f16(W, row_bytes, r0, N, b, block, offsetof(BlockQ4_1, m), s + 32);
    }
  }
}

}  // namespace

int PackedWeights::quant_bytes(GgmlType type) { return type == GgmlType::Q8_0 ? 512 : 256; }
int PackedWeights::scale_bytes(GgmlType type) { return type == GgmlType::Q4_1 ? 64 : 32; }

bool PackedWeights::supported(GgmlType type) {
  const int f = detail::fmt_index(type);
  return f >= 0 && detail::dot_packed_fn(f) != nullptr;
}

PackedWeights::PackedWeights(GgmlType type, const void* W, int64_t N, int64_t K)
    : type_(type), rows_(N), cols_(K) {
  FATHOM_CHECK(type == GgmlType::Q8_0 || type == GgmlType::Q4_0 || type == GgmlType::Q4_1,
               "PackedWeights: only Q8_0, Q4_0 and Q4_1 are packed");
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
