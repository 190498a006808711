#pragma once
// A PagedKvFixture's pool on the emulated device (DeviceKv), and the same pool split over a
// device tier and a host tier (TieredDeviceKv) the way the CUDA backend's kernels read it: a block
// table entry e < 0 is slot -(e + 1) of the host tier's planes.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "tests/kernel/cuda_device_buffer.h"
#include "tests/kernel/paged_kv_fixture.h"

namespace fathom::testing {

struct DeviceKv {
  DeviceBuffer<uint8_t> k, v, k_t;
  DeviceBuffer<KvInt8Row> k_rows, v_rows;
  DeviceBuffer<float> v_sum, k_moments;
  DeviceBuffer<int32_t> table;
  explicit DeviceKv(const PagedKvFixture& f)
      : k(f.k), v(f.v), k_t(f.k_t), k_rows(f.k_rows), v_rows(f.v_rows), v_sum(f.v_sum), k_moments(f.k_moments),
        table(f.table) {}
  PagedKvView view(const PagedKvFixture& f, bool with_k_t = true) const {
    PagedKvView kv = f.view(with_k_t, true);
    kv.k = k.ptr;
    kv.v = v.ptr;
    kv.k_t = with_k_t ? k_t.ptr : nullptr;
    kv.v_sum = v_sum.ptr;
    kv.k_moments = k_moments.ptr;
    kv.block_table = table.ptr;
    if (f.dtype == KvDtype::kI8) {
      kv.k_rows = k_rows.ptr;
      kv.v_rows = v_rows.ptr;
    }
    return kv;
  }
};

// `f` with every physical block whose `keep` entry is false overwritten by 0xff bytes (NaN in
// f32 / f16 rows, INT8 parameters, V sums and K moments): a kernel that reads such a block shows it.
inline PagedKvFixture poisoned_except(const PagedKvFixture& f, const std::vector<bool>& keep) {
  PagedKvFixture p = f;
  const size_t elem = kv_dtype_bytes(f.dtype), rows = static_cast<size_t>(f.n_kv_heads) * f.block_size;
  const size_t tile_bytes = rows * f.d * elem;
  for (size_t b = 0; b < keep.size(); ++b) {
    if (keep[b]) continue;
    std::memset(&p.k[b * tile_bytes], 0xff, tile_bytes);
    std::memset(&p.v[b * tile_bytes], 0xff, tile_bytes);
    std::memset(&p.k_t[b * tile_bytes], 0xff, tile_bytes);
    if (!p.k_rows.empty()) {
      const KvInt8Row nan_row{std::nanf(""), std::nanf("")};
      std::fill_n(&p.k_rows[b * rows], rows, nan_row);
      std::fill_n(&p.v_rows[b * rows], rows, nan_row);
    }
    std::memset(&p.v_sum[b * f.n_kv_heads * f.d], 0xff, static_cast<size_t>(f.n_kv_heads) * f.d * sizeof(float));
    std::memset(&p.k_moments[b * f.n_kv_heads * 2 * f.d], 0xff, static_cast<size_t>(f.n_kv_heads) * 2 * f.d * sizeof(float));
  }
  return p;
}

// The fixture's sequence with logical blocks on_host[i] in the host tier (the same physical slot
// there; the device copy of that slot poisoned) and the rest in the device tier (their host copy
// poisoned). host_bytes(): what the kernels counted as read from the host tier.
struct TieredDeviceKv {
  PagedKvFixture dev_f, host_f;
  DeviceKv device, host;
  std::vector<int32_t> table;  // the physical table: device slots >= 0, host slots -(slot + 1)
  DeviceBuffer<int32_t> dtable;
  DeviceBuffer<unsigned long long> counter{1};

  TieredDeviceKv(const PagedKvFixture& f, const std::vector<bool>& on_host)
      : dev_f(poisoned_except(f, in_tier(f, on_host, false))),
        host_f(poisoned_except(f, in_tier(f, on_host, true))),
        device(dev_f),
        host(host_f),
        table(physical(f, on_host)),
        dtable(table) {
    cudaMemset(counter.ptr, 0, sizeof(unsigned long long));
  }
  PagedKvView view(const PagedKvFixture& f, bool with_k_t = true) const {
    PagedKvView kv = device.view(f, with_k_t);
    kv.block_table = dtable.ptr;
    const PagedKvView h = host.view(f, with_k_t);
    kv.host_tier = KvTierPlanes{h.k, h.v, h.k_t, h.k_rows, h.v_rows, h.v_sum, h.k_moments};
    kv.host_read_bytes = counter.ptr;
    return kv;
  }
  unsigned long long host_bytes() const { return counter.download()[0]; }

 private:
  static std::vector<bool> in_tier(const PagedKvFixture& f, const std::vector<bool>& on_host, bool host_tier) {
    // The device tier keeps every block but the table's host ones (spare blocks included); the
    // host tier keeps only those.
    std::vector<bool> keep(f.k.size() / (kv_dtype_bytes(f.dtype) * f.n_kv_heads * f.block_size * f.d), !host_tier);
    for (size_t i = 0; i < f.table.size(); ++i)
      if (on_host[i]) keep[f.table[i]] = host_tier;
    return keep;
  }
  static std::vector<int32_t> physical(const PagedKvFixture& f, const std::vector<bool>& on_host) {
    std::vector<int32_t> t = f.table;
    for (size_t i = 0; i < t.size(); ++i)
      if (on_host[i]) t[i] = -t[i] - 1;
    return t;
  }
};

}  // namespace fathom::testing
