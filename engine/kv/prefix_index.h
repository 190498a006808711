#pragma once
// Prefix cache: full KV blocks keyed by a hash chained over (parent hash, block tokens), so a
// block's key identifies the whole prefix up to and including it. A new request reuses the
// longest run of cached blocks matching its prompt. The index holds one reference to every
// cached block; blocks that nobody else references are evicted least-recently-used when the
// pool runs short. A match also compares the block's own tokens and its parent's hash, so two
// prefixes alias only if the 64-bit chain of their parents collides.
#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/kv/block_allocator.h"

namespace fathom {

class PrefixIndex {
 public:
  explicit PrefixIndex(BlockAllocator& pool) : pool_(pool) {}
  ~PrefixIndex();

  static uint64_t chain_hash(uint64_t parent, std::span<const int32_t> block_tokens);

  // Cached blocks for the leading full blocks of `tokens` (at most `max_blocks`), each retained
  // for the caller, in order. Stops at the first miss.
  std::vector<int32_t> match(std::span<const int32_t> tokens, int32_t max_blocks);
  // Caches `block`, holding `block_tokens` (block_size of them) after the prefix whose chain
  // hash is `parent` (0 for a first block). No-op when that prefix is already cached.
  // Returns the block's chain hash: the parent of the next block.
  uint64_t insert(uint64_t parent, std::span<const int32_t> block_tokens, int32_t block);
  // Evicts up to `n` blocks that only the index references, least recently used first.
  int32_t evict(int32_t n);
  int32_t evictable() const;  // blocks evict() could free now
  bool holds(int32_t block) const { return block < static_cast<int32_t>(held_.size()) && held_[block]; }
  int32_t size() const { return static_cast<int32_t>(entries_.size()); }
  void clear();               // drops every entry (releases the index's references)

 private:
  struct Entry {
    uint64_t hash;
    uint64_t parent;
    int32_t block;
    std::vector<int32_t> tokens;  // this block's tokens
  };

  BlockAllocator& pool_;
  std::list<Entry> lru_;  // front = most recently used
  std::unordered_map<uint64_t, std::list<Entry>::iterator> entries_;
  std::vector<char> held_;  // per block id: an entry holds it
};

}  // namespace fathom
