#pragma once
// The KV page table: block ids, reference counts, the free list, and where each live block's
// bytes are — a slot in the backend's device storage or in its host tier. One block id addresses
// the same slots in every layer (a sequence has one block table for all layers). Blocks are
// reference counted so that prompts and forks share them; a block keeps its id when it moves
// between tiers, so sharers, the prefix index and block tables never see a move.
//
// Ids: [0, device_blocks + host_blocks). Without a host tier a block's device slot is its id, so
// a block table is also the physical table kernels read (tests and bench tools rely on that).
// With one, physical() gives the slot: >= 0 a device slot, < 0 the host slot -(physical + 1).
#include <cstdint>
#include <vector>

namespace fathom {

enum class KvTier : uint8_t { kDevice, kHost };

class BlockAllocator {
 public:
  // device_blocks > 0 and host_blocks >= 0 blocks of block_size > 0 token slots each.
  BlockAllocator(int32_t device_blocks, int32_t block_size, int32_t host_blocks = 0);

  int32_t num_blocks() const { return device_blocks_ + host_blocks_; }  // ids, both tiers
  int32_t device_blocks() const { return device_blocks_; }
  int32_t host_blocks() const { return host_blocks_; }
  int32_t block_size() const { return block_size_; }
  int32_t free_blocks() const { return static_cast<int32_t>(free_.size()); }
  int32_t used_blocks() const { return num_blocks() - free_blocks(); }
  int32_t free_slots(KvTier t) const {
    if (host_blocks_ == 0) return t == KvTier::kDevice ? free_blocks() : 0;
    return static_cast<int32_t>(free_slots_[index(t)].size());
  }
  int32_t used_slots(KvTier t) const { return (t == KvTier::kDevice ? device_blocks_ : host_blocks_) - free_slots(t); }
  // Blocks needed to hold `tokens` positions.
  int32_t blocks_for(int64_t tokens) const { return static_cast<int32_t>((tokens + block_size_ - 1) / block_size_); }

  // A fresh block with refcount 1 — in a device slot when one is free, else in a host slot — or
  // -1 when every block is in use. Failpoint "kv_alloc".
  int32_t allocate();
  void retain(int32_t block);
  void release(int32_t block);  // back to the free list (and its slot freed) when the count reaches 0
  int32_t ref_count(int32_t block) const { return refs_.at(block); }

  // Where a live block is.
  KvTier tier(int32_t block) const { return tier_.at(block); }
  int32_t slot(int32_t block) const { return slot_.at(block); }
  int32_t physical(int32_t block) const { return tier(block) == KvTier::kDevice ? slot(block) : -slot(block) - 1; }
  // The live block in device slot `s`, or -1 when the slot is free.
  int32_t block_at_device_slot(int32_t s) const { return device_owner_.at(s); }

  // Moves (the caller copies the bytes; these only update the table):
  // `block` (in the host tier) takes a free device slot; false when none is free.
  bool move_to_device(int32_t block);
  // `block` (in a device slot) takes a free host slot; false when none is free.
  bool move_to_host(int32_t block);
  // A device-resident and a host-resident block trade slots.
  void exchange(int32_t device_block, int32_t host_block);

 private:
  static int index(KvTier t) { return t == KvTier::kDevice ? 0 : 1; }
  void place(int32_t block, KvTier t, int32_t s);

  int32_t device_blocks_, host_blocks_, block_size_;
  std::vector<int32_t> refs_;
  std::vector<int32_t> free_;  // LIFO: recently freed ids are reused first (warm in cache)
  std::vector<KvTier> tier_;
  std::vector<int32_t> slot_;
  std::vector<int32_t> free_slots_[2];  // per tier, LIFO
  std::vector<int32_t> device_owner_;   // device slot -> block id or -1
};

}  // namespace fathom
