#pragma once
// The device side of a hot-row cache over a mapped host KV tier (engine/kv/hot_rows.h,
// docs/tiered_kv.md): copying host rows into device rows, and keeping the device copy of the
// host-row -> device-row map current. The attention kernels read a host position through the
// map (PagedKvView::host_rows) when it names a device row, in place from the host tier when not.
#include <cstdint>

#include "base/kv_dtype.h"
#include "kernels/cuda/emu/cuda_emu.h"
#include "kernels/cuda/kv_append.h"
#include "kernels/paged_kv.h"

namespace fathom::cuda {

// One row to copy: row `src` of the host planes to row `dst` of the device planes (row indices,
// [slot][n_kv_heads][block_size] order, as kv_row and KvInt8Row arrays count them); parts bit 0
// K, bit 1 V.
struct KvRowCopy {
  int64_t src = 0, dst = 0;
  int32_t parts = 0;
};

// Copies n rows of one layer from `from` (the host tier's planes, mapped) into `to` (device planes
// of the same layout): head_dim elements of `dtype` per K / V row and, for INT8, the row's
// KvInt8Row. One thread block per row. `copies`: device-readable (device or mapped pinned memory).
cudaError_t copy_kv_rows(const KvTierPlanes& from, const KvCacheLayer& to, KvDtype dtype, const KvRowCopy* copies,
                         int32_t n, cudaStream_t stream);

// map[index[i]] = value[i] for i < n (index, value: device-readable arrays; indices distinct, or
// later ones win in no particular order — callers pass each index once).
cudaError_t scatter_int32(int32_t* map, const int64_t* index, const int32_t* value, int32_t n, cudaStream_t stream);

}  // namespace fathom::cuda
