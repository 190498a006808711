#pragma once
// Paged KV storage: a pool of fixed-size blocks of `block_size` token slots. One block id
// addresses the same slots in every layer (a sequence has one block table for all layers).
// Blocks are reference counted so that prompts and forks can share them.
//
// Memory layout, per layer (each a "plane" indexed by block; PagedKvView documents them):
//   K:      [num_blocks][n_kv_heads][block_size][head_dim]  dtype
//   V:      [num_blocks][n_kv_heads][block_size][head_dim]  dtype
//   K^T:    [num_blocks][n_kv_heads][head_dim][block_size]  dtype  (transposed_k: SparQ step 1)
//   K rows, V rows: [num_blocks][n_kv_heads][block_size] KvInt8Row  (INT8 only)
//   V sums: [num_blocks][n_kv_heads][head_dim] f32  (running sum of V, SparQ's mean)
// so one (block, head) is a contiguous tile in every plane, and a block's bytes across all
// planes move together (swap to the host tier, copy-on-write).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/cpu/huge_buffer.h"
#include "kernels/kv_dtype.h"
#include "kernels/paged_kv.h"

namespace fathom {

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
  // Bytes one block holds across all layers and planes.
  size_t block_bytes() const {
    return (2 * kv_plane_bytes() + kt_plane_bytes() + 2 * rows_plane_bytes() + vsum_plane_bytes()) * n_layers;
  }
};

class BlockPool {
 public:
  BlockPool(const KvLayout& layout, int32_t num_blocks);

  const KvLayout& layout() const { return layout_; }
  int32_t num_blocks() const { return num_blocks_; }
  int32_t free_blocks() const { return static_cast<int32_t>(free_.size()); }
  int32_t used_blocks() const { return num_blocks_ - free_blocks(); }

  // A fresh block with refcount 1, or -1 when the pool is exhausted.
  int32_t allocate();
  void retain(int32_t block);
  void release(int32_t block);  // back to the free list when the count reaches 0
  int32_t ref_count(int32_t block) const { return refs_.at(block); }

  // Start of the [block_size][head_dim] tile of (layer, block, kv head).
  void* k_tile(int32_t layer, int32_t block, int32_t head);
  void* v_tile(int32_t layer, int32_t block, int32_t head);
  // Whole-block copies across every layer and plane: layout().block_bytes() bytes.
  // Used to swap a block to the host tier and back, and for copy-on-write of a shared block.
  void read_block(int32_t block, std::byte* dst) const;
  void write_block(int32_t block, const std::byte* src);
  void copy_block(int32_t src, int32_t dst);

  // Appends one token's K and V rows (f32, [n_kv_heads][head_dim] each) of `layer` at
  // position `pos` of the sequence with block table `table`: stores them as the pool's dtype,
  // fills the transposed-K slot and carries the running V sum (from the previous block's sum
  // when `pos` opens a block). Positions of a sequence must be appended in order.
  void append(int32_t layer, const int32_t* table, int32_t pos, const float* k, const float* v);

  // The view an attention kernel reads for `layer` of the sequence with block table `table`.
  PagedKvView view(int32_t layer, const int32_t* table) const;

 private:
  enum Plane { kK, kV, kKt, kKRows, kVRows, kVSum, kPlanes };
  size_t plane_bytes(Plane p) const;
  std::byte* at(Plane p, int32_t layer, int32_t block) {
    return planes_[p][layer].data() + plane_bytes(p) * static_cast<size_t>(block);
  }
  const std::byte* at(Plane p, int32_t layer, int32_t block) const {
    return planes_[p][layer].data() + plane_bytes(p) * static_cast<size_t>(block);
  }

  KvLayout layout_;
  int32_t num_blocks_;
  std::vector<HugePageBuffer> planes_[kPlanes];  // [plane][layer], empty when absent
  std::vector<int32_t> refs_;
  std::vector<int32_t> free_;  // LIFO: recently freed blocks are reused first (warm in cache)
};

}  // namespace fathom
