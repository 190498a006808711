#pragma once
// Paged KV storage: a pool of fixed-size blocks of `block_size` token slots. One block id
// addresses the same slots in every layer (a sequence has one block table for all layers).
// Blocks are reference counted so that prompts and forks can share them.
//
// Memory layout, per layer:  K: [num_blocks][n_kv_heads][block_size][head_dim]
//                            V: [num_blocks][n_kv_heads][block_size][head_dim]
// so one (block, head) is a contiguous [block_size][head_dim] tile.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/kv_dtype.h"

namespace fathom {

struct KvLayout {
  int32_t n_layers = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t block_size = 16;
  KvDtype dtype = KvDtype::kF32;

  size_t tile_elems() const { return static_cast<size_t>(block_size) * head_dim; }
  size_t block_elems() const { return tile_elems() * n_kv_heads; }  // one layer, K or V
  // Bytes one block holds across all layers, K and V.
  size_t block_bytes() const { return block_elems() * kv_dtype_bytes(dtype) * 2 * n_layers; }
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
  // Whole-block copies across every layer, K then V per layer: layout().block_bytes() bytes.
  // Used to swap a block to the host tier and back, and for copy-on-write of a shared block.
  void read_block(int32_t block, std::byte* dst) const;
  void write_block(int32_t block, const std::byte* src);
  void copy_block(int32_t src, int32_t dst);

  // Base of a layer's K / V storage (for kernels that take a block table).
  void* k_layer(int32_t layer) { return k_[layer].data(); }
  void* v_layer(int32_t layer) { return v_[layer].data(); }

 private:
  KvLayout layout_;
  int32_t num_blocks_;
  // Raw bytes, 64-byte aligned through the allocator of std::vector<max_align_t>-like storage.
  std::vector<std::vector<std::byte>> k_, v_;  // [layer]
  std::vector<int32_t> refs_;
  std::vector<int32_t> free_;  // LIFO: recently freed blocks are reused first (warm in cache)
};

}  // namespace fathom
