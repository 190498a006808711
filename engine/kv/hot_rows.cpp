#include "engine/kv/hot_rows.h"

#include <algorithm>
#include <string>

#include "base/error.h"

namespace fathom {

HotRows::HotRows(int32_t n_layers, int32_t n_kv_heads, int32_t block_size, int32_t host_blocks, int32_t first_slot,
                   int32_t slots, bool track_changes)
    : first_slot_(first_slot),
      capacity_(slots * block_size),
      n_heads_(n_kv_heads),
      block_size_(block_size),
      track_changes_(track_changes) {
  FATHOM_CHECK(slots > 0 && first_slot >= 0 && host_blocks > 0);
  const size_t keys = static_cast<size_t>(host_blocks) * block_size_ * n_heads_;
  map_.assign(n_layers, std::vector<int32_t>(keys, -1));
  have_.assign(n_layers, std::vector<uint8_t>(keys, 0));
  pools_.resize(static_cast<size_t>(n_layers) * n_heads_);
  for (Pool& p : pools_) {
    p.owner.assign(capacity_, -1);
    p.stamp.assign(capacity_, 0);
    p.ref.assign(capacity_, 0);
  }
}

int64_t HotRows::device_row(int32_t g, int32_t r) const {
  return (static_cast<int64_t>(first_slot_ + r / block_size_) * n_heads_ + g) * block_size_ + r % block_size_;
}

int32_t HotRows::pool_row(int64_t row) const {
  return static_cast<int32_t>((row / block_size_ / n_heads_ - first_slot_) * block_size_ + row % block_size_);
}

void HotRows::set(int32_t layer, int64_t key, int32_t value) {
  map_[layer][key] = value;
  if (track_changes_) changes_.push_back({static_cast<int64_t>(layer) * map_size() + key, value});
}

int32_t HotRows::victim(Pool& pool) {
  for (int32_t i = 0; i < 2 * capacity_; ++i) {
    const int32_t r = pool.hand;
    pool.hand = (pool.hand + 1) % capacity_;
    if (pool.owner[r] >= 0 && pool.stamp[r] == call_) continue;  // asked for by this call
    if (pool.owner[r] >= 0 && pool.ref[r]) {
      pool.ref[r] = 0;  // second chance
      continue;
    }
    return r;
  }
  throw HotRowsFull("the hot-row cache holds " + std::to_string(capacity_) +
                    " rows per layer and kv head: too few for one attention call");
}

void HotRows::fetch(int32_t layer, const int32_t* table, int32_t g, const int32_t* pos, int32_t n, bool need_v,
                     const Copy& copy) {
  FATHOM_CHECK(table != nullptr && g >= 0 && g < n_heads_);
  ++call_;
  Pool& pool = pools_[static_cast<size_t>(layer) * n_heads_ + g];
  std::vector<int32_t>& map = map_[layer];
  std::vector<uint8_t>& have = have_[layer];
  for (int32_t i = 0; i < n; ++i) {
    const int32_t entry = table[pos[i] / block_size_];
    if (entry >= 0) continue;  // device-resident: read in place
    const int32_t host_block = -entry - 1, offset = pos[i] % block_size_;
    const int64_t key = (static_cast<int64_t>(host_block) * block_size_ + offset) * n_heads_ + g;
    const uint8_t want = need_v ? 3 : 1;
    int32_t r = map[key] >= 0 ? pool_row(map[key]) : -1;
    if (r < 0) {
      r = victim(pool);
      if (pool.owner[r] >= 0) {  // evict
        set(layer, pool.owner[r], -1);
        have[pool.owner[r]] = 0;
      }
      pool.owner[r] = key;
      set(layer, key, static_cast<int32_t>(device_row(g, r)));
    }
    const uint8_t missing = want & ~have[key];
    if (missing != 0) {
      counts_.bytes += copy(host_block, g, offset, device_row(g, r), missing & 1, missing & 2);
      have[key] |= missing;
      ++counts_.misses;
    } else {
      ++counts_.hits;
    }
    pool.ref[r] = 1;
    pool.stamp[r] = call_;
  }
}

void HotRows::clear() {
  for (std::vector<int32_t>& m : map_) std::fill(m.begin(), m.end(), -1);
  for (std::vector<uint8_t>& h : have_) std::fill(h.begin(), h.end(), 0);
  for (Pool& p : pools_) {
    std::fill(p.owner.begin(), p.owner.end(), -1);
    std::fill(p.ref.begin(), p.ref.end(), 0);
    p.hand = 0;
  }
  changes_.clear();
}

void HotRows::invalidate_host_slot(int32_t h) {
  for (int32_t layer = 0; layer < static_cast<int32_t>(map_.size()); ++layer)
    for (int32_t offset = 0; offset < block_size_; ++offset)
      for (int32_t g = 0; g < n_heads_; ++g) {
        const int64_t key = (static_cast<int64_t>(h) * block_size_ + offset) * n_heads_ + g;
        if (map_[layer][key] < 0) continue;
        pools_[static_cast<size_t>(layer) * n_heads_ + g].owner[pool_row(map_[layer][key])] = -1;
        set(layer, key, -1);
        have_[layer][key] = 0;
      }
}

}  // namespace fathom
