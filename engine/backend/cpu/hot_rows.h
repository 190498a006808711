#pragma once
// The device-resident row cache of a tiered KV cache (HiP's offloading "sparse K/V cache";
// docs/tiered_kv.md). Sparse policies read scattered rows — HiP's mask picks pairs of keys all
// over the context — so the unit is a row, not a block: per (layer, kv head) a pool of rows in
// `slots` reserved device slots, a flat map from host rows (host slot, offset) to pool rows, and
// replacement by CLOCK over reference bits (approximately least recently used); the rows one
// prefetch() asked for are never evicted by that same call. The CPU backend's gather kernels
// read host positions through the map (PagedKvView::host_rows).
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "engine/backend/cpu/kv_storage.h"
#include "kernels/paged_kv.h"

namespace fathom {

// One attention call needs more host rows of a (layer, kv head) at once than the cache holds.
struct HotRowsFull : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class HotRows final : public RowPrefetcher {
 public:
  // Rows live in device slots [first_slot, first_slot + slots) of `device`; `host` is the tier.
  HotRows(CpuKvStorage& device, const CpuKvStorage& host, int32_t first_slot, int32_t slots);

  // Sets what prefetch() serves: `layer` of the sequence with physical block table `table`.
  void bind(int32_t layer, const int32_t* table) {
    layer_ = layer;
    table_ = table;
  }
  void prefetch(int32_t g, const int32_t* pos, int32_t n, bool need_v) override;
  int32_t capacity() const override { return capacity_; }
  size_t read_kt_rows(int32_t slot, int32_t g, const int32_t* dims, int32_t r, void* dst) const override {
    return host_.copy_kt_rows(layer_, slot, g, dims, r, dst);
  }
  void count_read(int64_t bytes) override { counts_.bytes += bytes; }
  const int32_t* map(int32_t layer) const { return map_[layer].data(); }
  // Host slot `h` got other bytes (a block moved in or out): its cached rows are stale.
  void invalidate_host_slot(int32_t h);

  // Rows found (hits) and copied in (misses), and bytes copied, since the last call.
  struct Counts {
    int64_t hits = 0, misses = 0, bytes = 0;
  };
  Counts take_counts() {
    const Counts c = counts_;
    counts_ = {};
    return c;
  }

 private:
  struct Pool {  // one (layer, kv head)
    std::vector<int64_t> owner;  // pool row -> map key, or -1
    std::vector<uint32_t> stamp;  // prefetch call that last asked for the row
    std::vector<uint8_t> ref;     // CLOCK reference bit
    int32_t hand = 0;
  };
  int64_t device_row(int32_t g, int32_t r) const;  // pool row r of kv head g -> row index in the planes
  int32_t pool_row(int64_t row) const;             // its inverse: a row index in the planes -> pool row
  int32_t victim(Pool& pool);

  CpuKvStorage& device_;
  const CpuKvStorage& host_;
  int32_t first_slot_, capacity_, n_heads_, block_size_;
  std::vector<std::vector<int32_t>> map_;    // [layer][(host slot · bs + offset) · n_kv_heads + g] -> row or -1
  std::vector<std::vector<uint8_t>> have_;   // same index: bit 0 K copied, bit 1 V copied
  std::vector<Pool> pools_;                  // [layer · n_kv_heads + g]
  int32_t layer_ = 0;
  const int32_t* table_ = nullptr;
  uint32_t call_ = 0;
  Counts counts_;
};

}  // namespace fathom
