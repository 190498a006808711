#include "engine/kv/prefix_index.h"

#include <algorithm>

namespace fathom {

PrefixIndex::~PrefixIndex() { clear(); }

uint64_t PrefixIndex::chain_hash(uint64_t parent, std::span<const int32_t> block_tokens) {
  // FNV-1a over the parent hash and the token ids, then a final avalanche (splitmix64).
  uint64_t h = 1469598103934665603ull ^ parent;
  auto mix = [&h](uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  for (int32_t t : block_tokens) mix(static_cast<uint32_t>(t));
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

std::vector<int32_t> PrefixIndex::match(std::span<const int32_t> tokens, int32_t max_blocks) {
  const int32_t bs = pool_.block_size();
  const int32_t full = std::min<int32_t>(max_blocks, static_cast<int32_t>(tokens.size()) / bs);
  std::vector<int32_t> out;
  uint64_t h = 0;
  for (int32_t b = 0; b < full; ++b) {
    const std::span<const int32_t> block_tokens = tokens.subspan(static_cast<size_t>(b) * bs, bs);
    const uint64_t parent = h;
    h = chain_hash(parent, block_tokens);
    auto it = entries_.find(h);
    if (it == entries_.end()) break;
    const Entry& e = *it->second;
    if (e.parent != parent || !std::equal(e.tokens.begin(), e.tokens.end(), block_tokens.begin())) break;
    lru_.splice(lru_.begin(), lru_, it->second);  // most recently used
    pool_.retain(e.block);
    out.push_back(e.block);
  }
  return out;
}

uint64_t PrefixIndex::insert(uint64_t parent, std::span<const int32_t> block_tokens, int32_t block) {
  const uint64_t h = chain_hash(parent, block_tokens);
  if (entries_.count(h)) return h;
  pool_.retain(block);
  if (held_.size() <= static_cast<size_t>(block)) held_.resize(static_cast<size_t>(pool_.num_blocks()), 0);
  held_[block] = 1;
  lru_.push_front(Entry{h, parent, block, std::vector<int32_t>(block_tokens.begin(), block_tokens.end())});
  entries_[h] = lru_.begin();
  return h;
}

int32_t PrefixIndex::evict(int32_t n) {
  int32_t freed = 0;
  for (auto it = lru_.end(); it != lru_.begin() && freed < n;) {
    --it;
    if (pool_.ref_count(it->block) != 1) continue;  // still used by a sequence
    pool_.release(it->block);
    held_[it->block] = 0;
    entries_.erase(it->hash);
    it = lru_.erase(it);
    ++freed;
  }
  return freed;
}

int32_t PrefixIndex::evictable() const {
  int32_t n = 0;
  for (const Entry& e : lru_) n += pool_.ref_count(e.block) == 1;
  return n;
}

void PrefixIndex::clear() {
  for (const Entry& e : lru_) pool_.release(e.block);
  held_.assign(held_.size(), 0);
  lru_.clear();
  entries_.clear();
}

}  // namespace fathom
