#include "engine/kv/block_pool.h"

#include <cstring>

#include "engine/error.h"

namespace fathom {

KvDtype parse_kv_dtype(const std::string& name) {
  if (name == "f32") return KvDtype::kF32;
  if (name == "f16") return KvDtype::kF16;
  if (name == "int8") return KvDtype::kI8;
  throw Error("unknown KV cache dtype '" + name + "' (expected f32, f16 or int8)");
}

BlockPool::BlockPool(const KvLayout& layout, int32_t num_blocks) : layout_(layout), num_blocks_(num_blocks) {
  FATHOM_CHECK(num_blocks > 0 && layout.block_size > 0);
  const size_t layer_bytes = layout.block_elems() * kv_dtype_bytes(layout.dtype) * static_cast<size_t>(num_blocks);
  k_.resize(layout.n_layers);
  v_.resize(layout.n_layers);
  for (int32_t l = 0; l < layout.n_layers; ++l) {
    k_[l].resize(layer_bytes);
    v_[l].resize(layer_bytes);
  }
  refs_.assign(num_blocks, 0);
  free_.reserve(num_blocks);
  for (int32_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

int32_t BlockPool::allocate() {
  if (free_.empty()) return -1;
  const int32_t b = free_.back();
  free_.pop_back();
  refs_[b] = 1;
  return b;
}

void BlockPool::retain(int32_t block) {
  FATHOM_CHECK(refs_.at(block) > 0, "retain of a free block");
  ++refs_[block];
}

void BlockPool::release(int32_t block) {
  FATHOM_CHECK(refs_.at(block) > 0, "release of a free block");
  if (--refs_[block] == 0) free_.push_back(block);
}

void BlockPool::read_block(int32_t block, std::byte* dst) const {
  const size_t n = layout_.block_elems() * kv_dtype_bytes(layout_.dtype), off = n * static_cast<size_t>(block);
  for (int32_t l = 0; l < layout_.n_layers; ++l) {
    std::memcpy(dst, k_[l].data() + off, n);
    std::memcpy(dst + n, v_[l].data() + off, n);
    dst += 2 * n;
  }
}

void BlockPool::write_block(int32_t block, const std::byte* src) {
  const size_t n = layout_.block_elems() * kv_dtype_bytes(layout_.dtype), off = n * static_cast<size_t>(block);
  for (int32_t l = 0; l < layout_.n_layers; ++l) {
    std::memcpy(k_[l].data() + off, src, n);
    std::memcpy(v_[l].data() + off, src + n, n);
    src += 2 * n;
  }
}

void BlockPool::copy_block(int32_t src, int32_t dst) {
  const size_t n = layout_.block_elems() * kv_dtype_bytes(layout_.dtype);
  for (int32_t l = 0; l < layout_.n_layers; ++l) {
    std::memcpy(k_[l].data() + n * dst, k_[l].data() + n * src, n);
    std::memcpy(v_[l].data() + n * dst, v_[l].data() + n * src, n);
  }
}

void* BlockPool::k_tile(int32_t layer, int32_t block, int32_t head) {
  const size_t elem = (static_cast<size_t>(block) * layout_.n_kv_heads + head) * layout_.tile_elems();
  return k_[layer].data() + elem * kv_dtype_bytes(layout_.dtype);
}

void* BlockPool::v_tile(int32_t layer, int32_t block, int32_t head) {
  const size_t elem = (static_cast<size_t>(block) * layout_.n_kv_heads + head) * layout_.tile_elems();
  return v_[layer].data() + elem * kv_dtype_bytes(layout_.dtype);
}

}  // namespace fathom
