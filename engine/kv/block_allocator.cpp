#include "engine/kv/block_allocator.h"

#include "base/error.h"
#include "base/failpoints.h"

namespace fathom {

BlockAllocator::BlockAllocator(int32_t num_blocks, int32_t block_size) : num_blocks_(num_blocks), block_size_(block_size) {
  FATHOM_CHECK(num_blocks > 0 && block_size > 0);
  refs_.assign(num_blocks, 0);
  free_.reserve(num_blocks);
  for (int32_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

int32_t BlockAllocator::allocate() {
  failpoints::hit("kv_alloc");
  if (free_.empty()) return -1;
  const int32_t b = free_.back();
  free_.pop_back();
  refs_[b] = 1;
  return b;
}

void BlockAllocator::retain(int32_t block) {
  FATHOM_CHECK(refs_.at(block) > 0, "retain of a free block");
  ++refs_[block];
}

void BlockAllocator::release(int32_t block) {
  FATHOM_CHECK(refs_.at(block) > 0, "release of a free block");
  if (--refs_[block] == 0) free_.push_back(block);
}

}  // namespace fathom
