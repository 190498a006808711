#include "engine/backend/cpu/cpu_hot_rows.h"

#include "base/error.h"

namespace fathom {

CpuHotRows::CpuHotRows(CpuKvStorage& device, const CpuKvStorage& host, int32_t first_slot, int32_t slots)
    : device_(device),
      host_(host),
      cache_(device.layout().n_layers, device.layout().n_kv_heads, device.layout().block_size, host.num_blocks(),
             first_slot, slots) {
  FATHOM_CHECK(first_slot + slots <= device.num_blocks());
}

void CpuHotRows::prefetch(int32_t g, const int32_t* pos, int32_t n, bool need_v) {
  cache_.fetch(layer_, table_, g, pos, n, need_v,
               [&](int32_t host_slot, int32_t head, int32_t offset, int64_t device_row, bool k, bool v) {
                 return static_cast<int64_t>(host_.copy_row_to(layer_, host_slot, head, offset, device_, device_row, k, v));
               });
}

size_t CpuHotRows::read_k_rows(int32_t g, const int32_t* pos, int32_t n, void* dst, KvInt8Row* dst_params) const {
  const int32_t bs = device_.layout().block_size;
  const size_t row = static_cast<size_t>(device_.layout().head_dim) * kv_dtype_bytes(device_.layout().dtype);
  size_t host_bytes = 0;
  for (int32_t i = 0; i < n; ++i) {
    const int32_t e = table_[pos[i] / bs];
    const CpuKvStorage& from = e >= 0 ? static_cast<const CpuKvStorage&>(device_) : host_;
    const size_t bytes = from.read_k_row(layer_, e >= 0 ? e : -e - 1, g, pos[i] % bs, static_cast<std::byte*>(dst) + i * row,
                                         dst_params != nullptr ? dst_params + i : nullptr);
    if (e < 0) host_bytes += bytes;
  }
  return host_bytes;
}

}  // namespace fathom
