#pragma once
// One sequence's block table over a BlockAllocator: logical block i -> physical block.
#include <cstdint>
#include <vector>

#include "engine/kv/block_allocator.h"

namespace fathom {

class BlockTable {
 public:
  explicit BlockTable(BlockAllocator& pool) : pool_(&pool) {}
  ~BlockTable() { release(); }
  BlockTable(const BlockTable&) = delete;
  BlockTable& operator=(const BlockTable&) = delete;
  BlockTable(BlockTable&& o) noexcept : pool_(o.pool_), blocks_(std::move(o.blocks_)) { o.blocks_.clear(); }

  // Makes room for `tokens` positions; false (and nothing allocated) when the pool is short.
  bool reserve(int32_t tokens);
  void release();  // gives every block back
  const std::vector<int32_t>& blocks() const { return blocks_; }
  int32_t capacity() const { return static_cast<int32_t>(blocks_.size()) * pool_->block_size(); }
  // Blocks needed for `tokens` positions beyond those already held.
  int32_t blocks_needed(int32_t tokens) const;

 private:
  BlockAllocator* pool_;
  std::vector<int32_t> blocks_;
};

}  // namespace fathom
