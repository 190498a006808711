#include "engine/backend/cpu/hot_rows.h"

#include "base/error.h"

namespace fathom {

HotRows::HotRows(CpuKvStorage& device, const CpuKvStorage& host, int32_t first_slot, int32_t slots)
    : device_(device),
      host_(host),
      cache_(device.layout().n_layers, device.layout().n_kv_heads, device.layout().block_size, host.num_blocks(),
             first_slot, slots) {
  FATHOM_CHECK(first_slot + slots <= device.num_blocks());
}

void HotRows::prefetch(int32_t g, const int32_t* pos, int32_t n, bool need_v) {
  cache_.fetch(layer_, table_, g, pos, n, need_v,
               [&](int32_t host_slot, int32_t head, int32_t offset, int64_t device_row, bool k, bool v) {
                 return static_cast<int64_t>(host_.copy_row_to(layer_, host_slot, head, offset, device_, device_row, k, v));
               });
}

}  // namespace fathom
