#include "engine/kv/block_allocator.h"

#include <utility>

#include "base/error.h"
#include "base/failpoints.h"

namespace fathom {

BlockAllocator::BlockAllocator(int32_t device_blocks, int32_t block_size, int32_t host_blocks)
    : device_blocks_(device_blocks), host_blocks_(host_blocks), block_size_(block_size) {
  FATHOM_CHECK(device_blocks > 0 && host_blocks >= 0 && block_size > 0);
  const int32_t n = num_blocks();
  refs_.assign(n, 0);
  tier_.assign(n, KvTier::kDevice);
  slot_.assign(n, -1);
  device_owner_.assign(device_blocks, -1);
  free_.reserve(n);
  for (int32_t b = n - 1; b >= 0; --b) free_.push_back(b);
  for (int32_t s = device_blocks - 1; s >= 0; --s) free_slots_[0].push_back(s);
  for (int32_t s = host_blocks - 1; s >= 0; --s) free_slots_[1].push_back(s);
}

void BlockAllocator::place(int32_t block, KvTier t, int32_t s) {
  tier_[block] = t;
  slot_[block] = s;
  if (t == KvTier::kDevice) device_owner_[s] = block;
}

int32_t BlockAllocator::allocate() {
  failpoints::hit("kv_alloc");
  if (free_.empty()) return -1;
  const int32_t b = free_.back();
  free_.pop_back();
  refs_[b] = 1;
  if (host_blocks_ == 0) {  // one tier: the slot is the id (see the header)
    place(b, KvTier::kDevice, b);
    return b;
  }
  const KvTier t = free_slots_[0].empty() ? KvTier::kHost : KvTier::kDevice;
  std::vector<int32_t>& slots = free_slots_[index(t)];
  FATHOM_CHECK(!slots.empty(), "a free block id without a free slot");
  place(b, t, slots.back());
  slots.pop_back();
  return b;
}

void BlockAllocator::retain(int32_t block) {
  FATHOM_CHECK(refs_.at(block) > 0, "retain of a free block");
  ++refs_[block];
}

void BlockAllocator::release(int32_t block) {
  FATHOM_CHECK(refs_.at(block) > 0, "release of a free block");
  if (--refs_[block] > 0) return;
  free_.push_back(block);
  if (host_blocks_ == 0) {
    device_owner_[block] = -1;
    return;
  }
  if (tier_[block] == KvTier::kDevice) device_owner_[slot_[block]] = -1;
  free_slots_[index(tier_[block])].push_back(slot_[block]);
  slot_[block] = -1;
}

bool BlockAllocator::move_to_device(int32_t block) {
  FATHOM_CHECK(refs_.at(block) > 0 && tier_[block] == KvTier::kHost);
  if (free_slots_[0].empty()) return false;
  free_slots_[1].push_back(slot_[block]);
  place(block, KvTier::kDevice, free_slots_[0].back());
  free_slots_[0].pop_back();
  return true;
}

bool BlockAllocator::move_to_host(int32_t block) {
  FATHOM_CHECK(refs_.at(block) > 0 && tier_[block] == KvTier::kDevice);
  if (free_slots_[1].empty()) return false;
  device_owner_[slot_[block]] = -1;
  free_slots_[0].push_back(slot_[block]);
  place(block, KvTier::kHost, free_slots_[1].back());
  free_slots_[1].pop_back();
  return true;
}

void BlockAllocator::exchange(int32_t device_block, int32_t host_block) {
  FATHOM_CHECK(refs_.at(device_block) > 0 && tier_[device_block] == KvTier::kDevice);
  FATHOM_CHECK(refs_.at(host_block) > 0 && tier_[host_block] == KvTier::kHost);
  const int32_t d = slot_[device_block], h = slot_[host_block];
  place(host_block, KvTier::kDevice, d);
  place(device_block, KvTier::kHost, h);
}

}  // namespace fathom
