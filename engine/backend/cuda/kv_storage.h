#pragma once
// The CUDA backend's KV storage: the KvLayout's planes per layer (K, V, the transposed K when
// configured, INT8 row parameters, the running V sums and K moments), addressed by block ids (device slots), in
// device memory — or, for the host tier, in page-locked host memory mapped into the device's
// address space, which the kernels read in place (host slots). A block's host image (read_block /
// write_block) lists the planes in KvPlane order per layer, as CpuKvStorage does: the two
// backends' images are the same bytes.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/backend/cuda/device_array.h"
#include "engine/kv/kv_layout.h"
#include "kernels/cuda/kv_append.h"
#include "kernels/paged_kv.h"

namespace fathom {
namespace cuda_backend_detail {

class CudaKvStorage {
 public:
  // `shared_blocks` > 0: each plane is one allocation, the layers' blocks one after another and
  // then `shared_blocks` that every layer names by the same entry through layer_entry(): the
  // recompute scratch, whose memory is one layer's (engine/backend/backend.h).
  CudaKvStorage(const KvLayout& layout, int32_t num_blocks, Memory memory = Memory::kDevice, int32_t shared_blocks = 0)
      : layout_(layout), num_blocks_(num_blocks), shared_blocks_(shared_blocks) {
    for (int p = 0; p < kKvPlanes; ++p) {
      const size_t plane = layout.plane_bytes(static_cast<KvPlane>(p));
      if (plane == 0) continue;
      const size_t bytes = plane * static_cast<size_t>(num_blocks);
      if (shared_blocks > 0) {
        planes_[p].emplace_back(memory);
        planes_[p].back().reserve(bytes * layout.n_layers + plane * static_cast<size_t>(shared_blocks));
        continue;
      }
      for (int32_t l = 0; l < layout.n_layers; ++l) {
        planes_[p].emplace_back(memory);
        planes_[p].back().reserve(bytes);
      }
    }
  }

  int32_t num_blocks() const { return num_blocks_; }  // per layer; the shared ones are entries after them
  int32_t shared_blocks() const { return shared_blocks_; }
  // The block table entry `layer`'s kernels read for `entry`: shared block i is named
  // num_blocks() + i in the plan's tables and lives after every layer's blocks.
  int32_t layer_entry(int32_t layer, int32_t entry) const {
    return entry >= num_blocks_ ? entry + (layout_.n_layers - 1 - layer) * num_blocks_ : entry;
  }

  // `layer`'s planes as the kernels address them (device pointers, mapped ones for the host tier).
  KvTierPlanes planes(int32_t layer) const {
    return KvTierPlanes{base(KvPlane::kK, layer),
                        base(KvPlane::kV, layer),
                        base(KvPlane::kKt, layer),
                        reinterpret_cast<const KvInt8Row*>(base(KvPlane::kKRows, layer)),
                        reinterpret_cast<const KvInt8Row*>(base(KvPlane::kVRows, layer)),
                        reinterpret_cast<const float*>(base(KvPlane::kVSum, layer)),
                        reinterpret_cast<const float*>(base(KvPlane::kKMoments, layer))};
  }

  // The view a kernel reads for `layer` through `device_table` (device pointers throughout).
  PagedKvView view(int32_t layer, const int32_t* device_table) const {
    const KvTierPlanes p = planes(layer);
    PagedKvView v;
    v.k = p.k;
    v.v = p.v;
    v.dtype = layout_.dtype;
    v.block_table = device_table;
    v.block_size = layout_.block_size;
    v.n_kv_heads = layout_.n_kv_heads;
    v.head_dim = layout_.head_dim;
    v.k_rows = p.k_rows;
    v.v_rows = p.v_rows;
    v.k_t = p.k_t;
    v.v_sum = p.v_sum;
    v.k_moments = p.k_moments;
    return v;
  }

  // What kv_append writes for `layer`.
  cuda::KvCacheLayer append_target(int32_t layer) {
    cuda::KvCacheLayer c;
    c.k = base(KvPlane::kK, layer);
    c.v = base(KvPlane::kV, layer);
    c.k_t = base(KvPlane::kKt, layer);
    c.k_rows = reinterpret_cast<KvInt8Row*>(base(KvPlane::kKRows, layer));
    c.v_rows = reinterpret_cast<KvInt8Row*>(base(KvPlane::kVRows, layer));
    c.v_sum = reinterpret_cast<float*>(base(KvPlane::kVSum, layer));
    c.k_moments = reinterpret_cast<float*>(base(KvPlane::kKMoments, layer));
    c.dtype = cuda::kv_store_type(layout_.dtype);
    c.block_size = layout_.block_size;
    c.n_kv_heads = layout_.n_kv_heads;
    c.head_dim = layout_.head_dim;
    return c;
  }

  // Block `src` (every layer and plane) into block `dst` of `to` (same layout; either memory),
  // queued on `stream`.
  void copy_block_to(int32_t src, CudaKvStorage& to, int32_t dst, cudaStream_t stream) const {
    check(src);
    to.check(dst);
    for_each_plane([&](KvPlane p, int32_t l, size_t n) {
      FATHOM_CUDA_BACKEND_OK(cudaMemcpyAsync(to.at(p, l, dst), at(p, l, src), n, cudaMemcpyDefault, stream));
    });
  }

  void copy_block(int32_t src, int32_t dst) {
    check(src);
    check(dst);
    for_each_plane([&](KvPlane p, int32_t l, size_t n) {
      FATHOM_CUDA_BACKEND_OK(cudaMemcpy(at(p, l, dst), at(p, l, src), n, cudaMemcpyDeviceToDevice));
    });
  }
  void read_block(int32_t block, std::byte* dst) {
    check(block);
    for_each_plane([&](KvPlane p, int32_t l, size_t n) {
      FATHOM_CUDA_BACKEND_OK(cudaMemcpy(dst, at(p, l, block), n, cudaMemcpyDeviceToHost));
      dst += n;
    });
  }
  void write_block(int32_t block, const std::byte* src) {
    check(block);
    for_each_plane([&](KvPlane p, int32_t l, size_t n) {
      FATHOM_CUDA_BACKEND_OK(cudaMemcpy(at(p, l, block), src, n, cudaMemcpyHostToDevice));
      src += n;
    });
  }

 private:
  std::byte* base(KvPlane p, int32_t layer) const {
    const auto& layers = planes_[static_cast<int>(p)];
    if (layers.empty()) return nullptr;
    if (shared_blocks_ > 0) return layers[0].get() + layout_.plane_bytes(p) * static_cast<size_t>(num_blocks_) * layer;
    return layers[layer].get();
  }
  std::byte* at(KvPlane p, int32_t layer, int32_t block) const {
    return base(p, layer) + layout_.plane_bytes(p) * static_cast<size_t>(block);
  }
  void check(int32_t block) const { FATHOM_CHECK(block >= 0 && block < num_blocks_, "block id out of range"); }
  template <typename F>
  void for_each_plane(F&& f) const {
    for (int32_t l = 0; l < layout_.n_layers; ++l)
      for (int p = 0; p < kKvPlanes; ++p)
        if (const size_t n = layout_.plane_bytes(static_cast<KvPlane>(p)); n > 0) f(static_cast<KvPlane>(p), l, n);
  }

  KvLayout layout_;
  int32_t num_blocks_;
  int32_t shared_blocks_;
  // [plane][layer], empty when absent; with shared blocks [plane][0] holds every layer.
  std::vector<DeviceArray<std::byte>> planes_[kKvPlanes];
};

}  // namespace cuda_backend_detail
}  // namespace fathom
