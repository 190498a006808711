#pragma once
// The bookkeeping of a device-resident cache of host-tier KV rows (HiP's offloading "sparse K/V
// cache"; docs/tiered_kv.md), shared by the backends: the CPU backend's CpuHotRows copies rows with
// memcpy and its gather kernels read through map(); the CUDA backend batches the copies into one
// kernel launch and mirrors the map on the device for its attention kernels.
//
// Sparse policies read scattered rows — HiP's mask picks pairs of keys all over the context — so
// the unit is a row, not a block: per (layer, kv head) a pool of rows in `slots` reserved device
// slots, a flat map from host rows (host slot, offset) to device rows, and replacement by CLOCK
// over reference bits (approximately least recently used); the rows one fetch() asked for are
// never evicted by that same call.
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <utility>
#include <vector>

#include "engine/kv/kv_layout.h"

namespace fathom {

// One fetch needs more host rows of a (layer, kv head) at once than the cache holds.
struct HotRowsFull : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The device slots a backend gives a hot-row cache: `percent` of what a `budget`-block device tier has
// beyond the `keep` blocks its page table needs (at least a quarter of the budget counts as beyond).
inline int32_t hot_rows_slots(int32_t budget, int32_t keep, int32_t percent) {
  const int64_t spare = budget - keep > budget / 4 ? budget - keep : budget / 4;
  return static_cast<int32_t>(spare * percent / 100);
}

// Device blocks' worth of memory a device mirror of the map takes (4 bytes per layer, host row and
// kv head; the CUDA backend pays for it from the device budget).
inline int32_t hot_rows_map_blocks(const KvLayout& layout, int32_t host_blocks) {
  const int64_t bytes = static_cast<int64_t>(layout.n_layers) * host_blocks * layout.block_size * layout.n_kv_heads * 4;
  return static_cast<int32_t>((bytes + static_cast<int64_t>(layout.block_bytes()) - 1) / static_cast<int64_t>(layout.block_bytes()));
}

class HotRows {
 public:
  // Pool rows live in device slots [first_slot, first_slot + slots), every kv head's rows of a
  // slot as the KV planes lay them out ([slot][n_kv_heads][block_size]); the host tier has
  // `host_blocks` slots. `track_changes`: record every map write for take_changes().
  HotRows(int32_t n_layers, int32_t n_kv_heads, int32_t block_size, int32_t host_blocks, int32_t first_slot,
           int32_t slots, bool track_changes = false);

  // A row to copy in: kv head g's row `offset` of host slot `host_slot` to device row `device_row`
  // (a row index of the planes, [slot][n_kv_heads][block_size] order), K and/or V. Returns the
  // bytes it moved.
  using Copy = std::function<int64_t(int32_t host_slot, int32_t g, int32_t offset, int64_t device_row, bool k, bool v)>;

  // Makes positions pos[0..n) of kv head g of `layer` readable (K, and V when need_v) for a
  // sequence with physical block table `table` (entries < 0: host slot -(e + 1)): device-resident
  // positions are skipped, cached rows are hits, the rest take a pool row and are copied in
  // through `copy`. Throws HotRowsFull when the pool cannot hold them all (rows fetched before
  // the throw stay valid).
  void fetch(int32_t layer, const int32_t* table, int32_t g, const int32_t* pos, int32_t n, bool need_v,
             const Copy& copy);

  // map(layer)[(host slot · block_size + offset) · n_kv_heads + g]: the device row holding that
  // host row, or -1.
  const int32_t* map(int32_t layer) const { return map_[layer].data(); }
  int64_t map_size() const { return static_cast<int64_t>(map_.front().size()); }  // entries per layer
  int32_t capacity() const { return capacity_; }  // rows per (layer, kv head)

  // Host slot `h` got other bytes (a block moved in or out): its cached rows are stale.
  void invalidate_host_slot(int32_t h);
  // Forgets every row (and the change log): for a mirror that could not be kept in step.
  void clear();

  // Map writes since the last call (track_changes): layer · map_size() + index, and the value.
  struct Change {
    int64_t index;
    int32_t value;
  };
  std::vector<Change> take_changes() { return std::exchange(changes_, {}); }

  // Rows found (hits) and copied in (misses), and bytes copied, since the last call.
  struct Counts {
    int64_t hits = 0, misses = 0, bytes = 0;
  };
  Counts take_counts() { return std::exchange(counts_, {}); }
  void count_bytes(int64_t bytes) { counts_.bytes += bytes; }

 private:
  struct Pool {  // one (layer, kv head)
    std::vector<int64_t> owner;  // pool row -> map key, or -1
    std::vector<uint32_t> stamp;  // fetch call that last asked for the row
    std::vector<uint8_t> ref;     // CLOCK reference bit
    int32_t hand = 0;
  };
  int64_t device_row(int32_t g, int32_t r) const;  // pool row r of kv head g -> row index in the planes
  int32_t pool_row(int64_t row) const;             // its inverse
  int32_t victim(Pool& pool);
  void set(int32_t layer, int64_t key, int32_t value);

  int32_t first_slot_, capacity_, n_heads_, block_size_;
  bool track_changes_;
  std::vector<std::vector<int32_t>> map_;   // [layer][(host slot · bs + offset) · n_kv_heads + g] -> row or -1
  std::vector<std::vector<uint8_t>> have_;  // same index: bit 0 K copied, bit 1 V copied
  std::vector<Pool> pools_;                 // [layer · n_kv_heads + g]
  uint32_t call_ = 0;
  Counts counts_;
  std::vector<Change> changes_;
};

}  // namespace fathom
