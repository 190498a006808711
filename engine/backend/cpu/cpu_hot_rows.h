#pragma once
// The CPU backend's device-resident hot-row cache of a tiered KV cache (docs/tiered_kv.md): the
// shared bookkeeping (engine/kv/hot_rows.h) with rows copied by memcpy between the tiers'
// planes, served to the sparse kernels as their RowPrefetcher; the gather kernels read host
// positions through map() (PagedKvView::host_rows).
#include <cstdint>

#include "engine/backend/cpu/kv_storage.h"
#include "engine/kv/hot_rows.h"
#include "kernels/paged_kv.h"

namespace fathom {

class CpuHotRows final : public RowPrefetcher {
 public:
  // Rows live in device slots [first_slot, first_slot + slots) of `device`; `host` is the tier.
  CpuHotRows(CpuKvStorage& device, const CpuKvStorage& host, int32_t first_slot, int32_t slots);

  // Sets what prefetch() serves: `layer` of the sequence with physical block table `table`.
  void bind(int32_t layer, const int32_t* table) {
    layer_ = layer;
    table_ = table;
  }
  void prefetch(int32_t g, const int32_t* pos, int32_t n, bool need_v) override;
  int32_t capacity() const override { return cache_.capacity(); }
  size_t read_kt_rows(int32_t slot, int32_t g, const int32_t* dims, int32_t r, void* dst) const override {
    return host_.copy_kt_rows(layer_, slot, g, dims, r, dst);
  }
  size_t read_k_rows(int32_t g, const int32_t* pos, int32_t n, void* dst, KvInt8Row* dst_params) const override;
  void count_read(int64_t bytes) override { cache_.count_bytes(bytes); }
  const int32_t* map(int32_t layer) const { return cache_.map(layer); }
  void invalidate_host_slot(int32_t h) { cache_.invalidate_host_slot(h); }
  HotRows::Counts take_counts() { return cache_.take_counts(); }

 private:
  CpuKvStorage& device_;
  const CpuKvStorage& host_;
  HotRows cache_;
  int32_t layer_ = 0;
  const int32_t* table_ = nullptr;
};

}  // namespace fathom
