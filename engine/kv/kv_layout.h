#pragma once
// What one KV block holds, independent of where its bytes live: the page table (BlockAllocator)
// and every backend's storage agree on it. Planes per layer (PagedKvView documents them):
//   K:      [num_blocks][n_kv_heads][block_size][head_dim]  dtype
//   V:      [num_blocks][n_kv_heads][block_size][head_dim]  dtype
//   K^T:    [num_blocks][n_kv_heads][head_dim][block_size]  dtype  (transposed_k: SparQ step 1)
//   K rows, V rows: [num_blocks][n_kv_heads][block_size] KvInt8Row  (INT8 only)
//   V sums: [num_blocks][n_kv_heads][head_dim] f32  (running sum of V, SparQ's mean)
//   K moments: [num_blocks][n_kv_heads][2][head_dim] f32  (running mean of K and Σ of squared
//           deviations, Welford: SparQ's key spread)
// so one (block, head) is a contiguous tile in every plane, and a block's bytes across all
// planes move together (swap to the host tier, copy-on-write).
#include <cstddef>
#include <cstdint>

#include "base/kv_dtype.h"

namespace fathom {

// The planes of a block, in the order a block's host image (swap, copy) lists them per layer.
enum class KvPlane { kK, kV, kKt, kKRows, kVRows, kVSum, kKMoments };
inline constexpr int kKvPlanes = 7;

struct KvLayout {
  int32_t n_layers = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t block_size = 16;
  KvDtype dtype = KvDtype::kF32;
  bool transposed_k = false;  // keep K a second time, dimension-major per tile

  size_t tile_elems() const { return static_cast<size_t>(block_size) * head_dim; }
  size_t block_elems() const { return tile_elems() * n_kv_heads; }  // one layer, K or V
  // Bytes of one block in one layer for each plane (0 when the plane is absent).
  size_t kv_plane_bytes() const { return block_elems() * kv_dtype_bytes(dtype); }
  size_t kt_plane_bytes() const { return transposed_k ? kv_plane_bytes() : 0; }
  size_t rows_plane_bytes() const {
    return dtype == KvDtype::kI8 ? static_cast<size_t>(block_size) * n_kv_heads * sizeof(KvInt8Row) : 0;
  }
  size_t vsum_plane_bytes() const { return static_cast<size_t>(n_kv_heads) * head_dim * sizeof(float); }
  size_t kmoments_plane_bytes() const { return 2 * vsum_plane_bytes(); }
  size_t plane_bytes(KvPlane p) const {
    switch (p) {
      case KvPlane::kK:
      case KvPlane::kV: return kv_plane_bytes();
      case KvPlane::kKt: return kt_plane_bytes();
      case KvPlane::kKRows:
      case KvPlane::kVRows: return rows_plane_bytes();
      case KvPlane::kVSum: return vsum_plane_bytes();
      case KvPlane::kKMoments: return kmoments_plane_bytes();
    }
    return 0;
  }
  // Bytes one block holds across all layers and planes.
  size_t block_bytes() const {
    return (2 * kv_plane_bytes() + kt_plane_bytes() + 2 * rows_plane_bytes() + vsum_plane_bytes() +
            kmoments_plane_bytes()) *
           n_layers;
  }
};

}  // namespace fathom
