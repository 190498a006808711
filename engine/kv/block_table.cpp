#include "engine/kv/block_table.h"

#include <algorithm>

namespace fathom {

int32_t BlockTable::blocks_needed(int32_t tokens) const {
  const int32_t bs = pool_->block_size();
  return std::max<int32_t>(0, (tokens + bs - 1) / bs - static_cast<int32_t>(blocks_.size()));
}

bool BlockTable::reserve(int32_t tokens) {
  const int32_t need = blocks_needed(tokens);
  if (need > pool_->free_blocks()) return false;
  for (int32_t i = 0; i < need; ++i) blocks_.push_back(pool_->allocate());
  return true;
}

void BlockTable::release() {
  for (int32_t b : blocks_) pool_->release(b);
  blocks_.clear();
}

}  // namespace fathom
