#include "engine/backend/cpu/kv_storage.h"

#include <cstring>
#include <numeric>

#include "base/error.h"
#include "kernels/cpu/cache_evict.h"
#include "kernels/cpu/ops.h"

namespace fathom {

int32_t CpuKvStorage::shared_alignment(const KvLayout& layout) {
  const size_t page = page_bytes();
  size_t step = 1;
  for (int p = 0; p < kKvPlanes; ++p) {
    const size_t b = layout.plane_bytes(static_cast<KvPlane>(p));
    if (b > 0) step = std::lcm(step, page / std::gcd(b, page));
  }
  return static_cast<int32_t>(step);
}

CpuKvStorage::CpuKvStorage(const KvLayout& layout, int32_t num_blocks, int32_t shared_blocks)
    : layout_(layout), shared_blocks_(shared_blocks) {
  FATHOM_CHECK(num_blocks > 0 && shared_blocks >= 0 && layout.block_size > 0);
  const int32_t step = shared_blocks > 0 ? shared_alignment(layout) : 1;
  const int32_t own = (num_blocks + step - 1) / step * step;
  num_blocks_ = own + shared_blocks;
  for (int p = 0; p < kKvPlanes; ++p) {
    const size_t plane = layout.plane_bytes(static_cast<KvPlane>(p));
    if (plane == 0) continue;
    if (shared_blocks == 0) {
      for (int32_t l = 0; l < layout.n_layers; ++l) planes_[p].emplace_back(plane * static_cast<size_t>(own));
      continue;
    }
    shared_.push_back(std::make_unique<SharedPages>(plane * static_cast<size_t>(shared_blocks)));
    for (int32_t l = 0; l < layout.n_layers; ++l) planes_[p].emplace_back(plane * static_cast<size_t>(own), *shared_.back());
  }
}

CpuKvStorage::~CpuKvStorage() = default;

void CpuKvStorage::check_block(int32_t block) const {
  FATHOM_CHECK(block >= 0 && block < num_blocks_, "block id out of range");
}

void CpuKvStorage::read_block(int32_t block, std::byte* dst) const {
  check_block(block);
  for (int32_t l = 0; l < layout_.n_layers; ++l)
    for (int p = 0; p < kKvPlanes; ++p) {
      const size_t n = layout_.plane_bytes(static_cast<KvPlane>(p));
      if (n == 0) continue;
      std::memcpy(dst, at(static_cast<KvPlane>(p), l, block), n);
      dst += n;
    }
}

void CpuKvStorage::write_block(int32_t block, const std::byte* src) {
  check_block(block);
  for (int32_t l = 0; l < layout_.n_layers; ++l)
    for (int p = 0; p < kKvPlanes; ++p) {
      const size_t n = layout_.plane_bytes(static_cast<KvPlane>(p));
      if (n == 0) continue;
      std::memcpy(at(static_cast<KvPlane>(p), l, block), src, n);
      src += n;
    }
}

size_t CpuKvStorage::copy_layer_block_to(int32_t layer, int32_t src, CpuKvStorage& to, int32_t dst) const {
  check_block(src);
  to.check_block(dst);
  FATHOM_CHECK(to.layout_.block_bytes() == layout_.block_bytes(), "copy between different KV layouts");
  size_t bytes = 0;
  for (int p = 0; p < kKvPlanes; ++p) {
    const size_t n = layout_.plane_bytes(static_cast<KvPlane>(p));
    if (n == 0) continue;
    std::memcpy(to.at(static_cast<KvPlane>(p), layer, dst), at(static_cast<KvPlane>(p), layer, src), n);
    bytes += n;
  }
  return bytes;
}

size_t CpuKvStorage::copy_block_to(int32_t src, CpuKvStorage& to, int32_t dst) const {
  size_t bytes = 0;
  for (int32_t l = 0; l < layout_.n_layers; ++l) bytes += copy_layer_block_to(l, src, to, dst);
  return bytes;
}

size_t CpuKvStorage::copy_row_to(int32_t layer, int32_t block, int32_t head, int32_t slot, CpuKvStorage& to,
                                 int64_t dst_row, bool k, bool v) const {
  check_block(block);
  const KvLayout& L = layout_;
  const size_t row = row_bytes();
  const int64_t src_row = row_index(block, head, slot);
  FATHOM_CHECK(dst_row >= 0 && dst_row < static_cast<int64_t>(to.num_blocks_) * L.n_kv_heads * L.block_size);
  size_t bytes = 0;
  for (const KvPlane p : {KvPlane::kK, KvPlane::kV}) {
    if (!(p == KvPlane::kK ? k : v)) continue;
    std::memcpy(to.at(p, layer, 0) + dst_row * row, at(p, layer, 0) + src_row * row, row);
    bytes += row;
    if (L.dtype == KvDtype::kI8) {
      const KvPlane rows = p == KvPlane::kK ? KvPlane::kKRows : KvPlane::kVRows;
      reinterpret_cast<KvInt8Row*>(to.at(rows, layer, 0))[dst_row] = reinterpret_cast<const KvInt8Row*>(at(rows, layer, 0))[src_row];
      bytes += sizeof(KvInt8Row);
    }
  }
  return bytes;
}

size_t CpuKvStorage::read_k_row(int32_t layer, int32_t block, int32_t head, int32_t slot, std::byte* dst,
                                KvInt8Row* params) const {
  check_block(block);
  const size_t row = row_bytes();
  const int64_t r = row_index(block, head, slot);
  std::memcpy(dst, at(KvPlane::kK, layer, 0) + r * row, row);
  if (layout_.dtype != KvDtype::kI8) return row;
  *params = reinterpret_cast<const KvInt8Row*>(at(KvPlane::kKRows, layer, 0))[r];
  return row + sizeof(KvInt8Row);
}

size_t CpuKvStorage::copy_kt_rows(int32_t layer, int32_t block, int32_t head, const int32_t* dims, int32_t r,
                                  void* dst) const {
  check_block(block);
  const KvLayout& L = layout_;
  FATHOM_CHECK(L.transposed_k && r >= 0 && r <= L.head_dim);
  const size_t row = static_cast<size_t>(L.block_size) * kv_dtype_bytes(L.dtype);  // one dimension, bs positions
  const std::byte* tile = at(KvPlane::kKt, layer, block) + static_cast<size_t>(head) * L.head_dim * row;
  for (int32_t i = 0; i < r; ++i) {
    FATHOM_CHECK(dims[i] >= 0 && dims[i] < L.head_dim);
    std::memcpy(static_cast<std::byte*>(dst) + i * row, tile + static_cast<size_t>(dims[i]) * row, row);
  }
  return static_cast<size_t>(r) * row;
}

void* CpuKvStorage::k_tile(int32_t layer, int32_t block, int32_t head) {
  return at(KvPlane::kK, layer, block) + head * layout_.tile_elems() * kv_dtype_bytes(layout_.dtype);
}

void* CpuKvStorage::v_tile(int32_t layer, int32_t block, int32_t head) {
  return at(KvPlane::kV, layer, block) + head * layout_.tile_elems() * kv_dtype_bytes(layout_.dtype);
}

void CpuKvStorage::append(int32_t layer, const int32_t* table, int32_t pos, const float* k, const float* v,
                          float* running) {
  const KvLayout& L = layout_;
  const int32_t bs = L.block_size, d = L.head_dim, slot = pos % bs, block = table[pos / bs];
  // The running sums carry over from the previous position: this block's tile, or at a block's
  // first slot the previous block's.
  const int32_t prev_block = slot > 0 ? block : pos > 0 ? table[pos / bs - 1] : -1;
  FATHOM_CHECK(block >= 0 && (pos == 0 || prev_block >= 0),
               "a step writes a block (or reads the running sums of the block before it) outside this storage "
               "(a host-tier table entry)");
  const size_t elem = kv_dtype_bytes(L.dtype);
  for (int32_t h = 0; h < L.n_kv_heads; ++h) {
    const float* kh = k + static_cast<size_t>(h) * d;
    const float* vh = v + static_cast<size_t>(h) * d;
    std::byte* k_row = static_cast<std::byte*>(k_tile(layer, block, h)) + static_cast<size_t>(slot) * d * elem;
    std::byte* v_row = static_cast<std::byte*>(v_tile(layer, block, h)) + static_cast<size_t>(slot) * d * elem;
    if (L.dtype == KvDtype::kI8) {
      auto* rows_k = reinterpret_cast<KvInt8Row*>(at(KvPlane::kKRows, layer, block)) + h * bs + slot;
      auto* rows_v = reinterpret_cast<KvInt8Row*>(at(KvPlane::kVRows, layer, block)) + h * bs + slot;
      cpu::kv_store_int8_row(kh, d, reinterpret_cast<uint8_t*>(k_row), rows_k);
      cpu::kv_store_int8_row(vh, d, reinterpret_cast<uint8_t*>(v_row), rows_v);
    } else {
      cpu::kv_store(kh, k_row, L.dtype, d);
      cpu::kv_store(vh, v_row, L.dtype, d);
    }
    if (L.transposed_k) {  // column c of the tile gets this token's element c
      std::byte* kt = at(KvPlane::kKt, layer, block) + static_cast<size_t>(h) * L.tile_elems() * elem;
      for (int32_t c = 0; c < d; ++c)
        std::memcpy(kt + (static_cast<size_t>(c) * bs + slot) * elem, k_row + static_cast<size_t>(c) * elem, elem);
    }
    float* sum = reinterpret_cast<float*>(at(KvPlane::kVSum, layer, block)) + static_cast<size_t>(h) * d;
    const float* prev = prev_block < 0 ? nullptr
                                       : reinterpret_cast<const float*>(at(KvPlane::kVSum, layer, prev_block)) + static_cast<size_t>(h) * d;
    for (int32_t c = 0; c < d; ++c) sum[c] = (prev ? prev[c] : 0.0f) + vh[c];
    float* moments = reinterpret_cast<float*>(at(KvPlane::kKMoments, layer, block)) + static_cast<size_t>(h) * 2 * d;
    if (prev_block >= 0 && prev_block != block)
      std::memcpy(moments, reinterpret_cast<const float*>(at(KvPlane::kKMoments, layer, prev_block)) + static_cast<size_t>(h) * 2 * d,
                  2 * d * sizeof(float));
    for (int32_t c = 0; c < d; ++c) key_moments_update(kh[c], pos, moments[c], moments[d + c]);
    if (running != nullptr) {
      std::memcpy(running + static_cast<size_t>(h) * 3 * d, sum, d * sizeof(float));
      std::memcpy(running + (static_cast<size_t>(h) * 3 + 1) * d, moments, 2 * d * sizeof(float));
    }
  }
}

void CpuKvStorage::set_running(int32_t layer, int32_t block, const float* running) {
  check_block(block);
  const int32_t d = layout_.head_dim;
  for (int32_t h = 0; h < layout_.n_kv_heads; ++h) {
    std::memcpy(reinterpret_cast<float*>(at(KvPlane::kVSum, layer, block)) + static_cast<size_t>(h) * d,
                running + static_cast<size_t>(h) * 3 * d, d * sizeof(float));
    std::memcpy(reinterpret_cast<float*>(at(KvPlane::kKMoments, layer, block)) + static_cast<size_t>(h) * 2 * d,
                running + (static_cast<size_t>(h) * 3 + 1) * d, 2 * d * sizeof(float));
  }
}

void CpuKvStorage::get_running(int32_t layer, int32_t block, float* running) const {
  check_block(block);
  const int32_t d = layout_.head_dim;
  for (int32_t h = 0; h < layout_.n_kv_heads; ++h) {
    std::memcpy(running + static_cast<size_t>(h) * 3 * d,
                reinterpret_cast<const float*>(at(KvPlane::kVSum, layer, block)) + static_cast<size_t>(h) * d, d * sizeof(float));
    std::memcpy(running + (static_cast<size_t>(h) * 3 + 1) * d,
                reinterpret_cast<const float*>(at(KvPlane::kKMoments, layer, block)) + static_cast<size_t>(h) * 2 * d,
                2 * d * sizeof(float));
  }
}

void CpuKvStorage::evict_layer_from_cache(int32_t layer, int32_t blocks, int part, int parts) const {
  FATHOM_CHECK(layer >= 0 && blocks >= 0 && blocks <= num_blocks_ && parts > 0 && part >= 0 && part < parts);
  for (int p = 0; p < kKvPlanes; ++p) {
    const std::vector<HugePageBuffer>& plane = planes_[p];
    if (static_cast<size_t>(layer) >= plane.size()) continue;
    const size_t bytes = layout_.plane_bytes(static_cast<KvPlane>(p)) * static_cast<size_t>(blocks);
    const size_t begin = bytes * part / parts, end = bytes * (part + 1) / parts;
    cpu::evict_from_cache(plane[layer].data() + begin, end - begin);
  }
}

PagedKvView CpuKvStorage::view(int32_t layer, const int32_t* table) const {
  PagedKvView kv{at(KvPlane::kK, layer, 0), at(KvPlane::kV, layer, 0), layout_.dtype, table, layout_.block_size, layout_.n_kv_heads,
                 layout_.head_dim};
  if (layout_.dtype == KvDtype::kI8) {
    kv.k_rows = reinterpret_cast<const KvInt8Row*>(at(KvPlane::kKRows, layer, 0));
    kv.v_rows = reinterpret_cast<const KvInt8Row*>(at(KvPlane::kVRows, layer, 0));
  }
  if (layout_.transposed_k) kv.k_t = at(KvPlane::kKt, layer, 0);
  kv.v_sum = reinterpret_cast<const float*>(at(KvPlane::kVSum, layer, 0));
  kv.k_moments = reinterpret_cast<const float*>(at(KvPlane::kKMoments, layer, 0));
  return kv;
}

}  // namespace fathom
