#pragma once
// The KV page table's allocator: block ids, reference counts and the free list, independent of
// where a block's bytes live (the backend's KV storage holds num_blocks blocks addressed by these
// ids). One block id addresses the same slots in every layer (a sequence has one block table for
// all layers). Blocks are reference counted so that prompts and forks share them.
#include <cstdint>
#include <vector>

namespace fathom {

class BlockAllocator {
 public:
  // num_blocks > 0 blocks of block_size > 0 token slots each.
  BlockAllocator(int32_t num_blocks, int32_t block_size);

  int32_t num_blocks() const { return num_blocks_; }
  int32_t block_size() const { return block_size_; }
  int32_t free_blocks() const { return static_cast<int32_t>(free_.size()); }
  int32_t used_blocks() const { return num_blocks_ - free_blocks(); }
  // Blocks needed to hold `tokens` positions.
  int32_t blocks_for(int64_t tokens) const { return static_cast<int32_t>((tokens + block_size_ - 1) / block_size_); }

  // A fresh block with refcount 1, or -1 when every block is in use. Failpoint "kv_alloc".
  int32_t allocate();
  void retain(int32_t block);
  void release(int32_t block);  // back to the free list when the count reaches 0
  int32_t ref_count(int32_t block) const { return refs_.at(block); }

 private:
  int32_t num_blocks_, block_size_;
  std::vector<int32_t> refs_;
  std::vector<int32_t> free_;  // LIFO: recently freed blocks are reused first (warm in cache)
};

}  // namespace fathom
