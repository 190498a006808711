#pragma once
// The CPU backend's KV storage: num_blocks blocks of the KvLayout's planes in host memory (2 MiB
// pages where the kernel gives them), addressed by the BlockAllocator's block ids. It knows
// nothing of reference counts: the page table decides which ids are live.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/kv/kv_layout.h"
#include "kernels/cpu/huge_buffer.h"
#include "kernels/paged_kv.h"

namespace fathom {

class CpuKvStorage {
 public:
  // `num_blocks` blocks of every layer, then `shared_blocks` whose memory is one per plane for
  // all layers (SharedPages): a step that recomputes dropped blocks writes layer l's K/V there,
  // reads them in layer l's attention, and layer l + 1 overwrites them (docs/tiered_kv.md).
  // The layer blocks are rounded up so the shared ones start on a page: first_shared() >=
  // num_blocks; the slots between are ordinary blocks the caller may use.
  CpuKvStorage(const KvLayout& layout, int32_t num_blocks, int32_t shared_blocks = 0);
  ~CpuKvStorage();

  // Shared blocks start at a multiple of this many blocks (where every plane's bytes are whole pages).
  static int32_t shared_alignment(const KvLayout& layout);

  const KvLayout& layout() const { return layout_; }
  int32_t num_blocks() const { return num_blocks_; }  // every addressable slot, shared ones included
  int32_t first_shared() const { return num_blocks_ - shared_blocks_; }
  int32_t shared_blocks() const { return shared_blocks_; }

  // Start of the [block_size][head_dim] tile of (layer, block, kv head).
  void* k_tile(int32_t layer, int32_t block, int32_t head);
  void* v_tile(int32_t layer, int32_t block, int32_t head);
  // Whole-block copies across every layer and plane: layout().block_bytes() bytes.
  // Used to swap a block to the host tier and back, and for copy-on-write of a shared block.
  void read_block(int32_t block, std::byte* dst) const;
  void write_block(int32_t block, const std::byte* src);
  void copy_block(int32_t src, int32_t dst) { copy_block_to(src, *this, dst); }
  // Copies block `src` (every layer and plane) into block `dst` of `to` (same layout): a move
  // between tiers. Returns the bytes copied.
  size_t copy_block_to(int32_t src, CpuKvStorage& to, int32_t dst) const;
  // The same for one layer's planes only: staging a host block for one layer's attention.
  size_t copy_layer_block_to(int32_t layer, int32_t src, CpuKvStorage& to, int32_t dst) const;

  // Appends one token's K and V rows (f32, [n_kv_heads][head_dim] each) of `layer` at
  // position `pos` of the sequence with block table `table`: stores them as the layout's dtype,
  // fills the transposed-K slot and carries the running V sum and K moments (from the previous
  // block's when `pos` opens a block, which must then be in this storage: a non-negative table
  // entry). Positions of a sequence must be appended in order. `running` (optional,
  // running_floats()): receives the block's running planes after this append, for set_running.
  void append(int32_t layer, const int32_t* table, int32_t pos, const float* k, const float* v,
              float* running = nullptr);
  // Floats of one block's running planes of one layer: per kv head, V sum then K mean and M2
  // (head_dim each).
  size_t running_floats() const { return static_cast<size_t>(layout_.n_kv_heads) * 3 * layout_.head_dim; }
  // Puts back a block's running planes of `layer` as append() reported them (speculative
  // decoding's rollback: Backend::rollback_kv).
  void set_running(int32_t layer, int32_t block, const float* running);
  // Copies them out in the same form (running_floats() floats).
  void get_running(int32_t layer, int32_t block, float* running) const;

  // Copies the K row (and its INT8 parameters) and/or the V row of (layer, block, head, slot) to
  // row `dst_row` of `to`'s planes (a row index as PagedKvView::row_index gives). Returns bytes.
  size_t copy_row_to(int32_t layer, int32_t block, int32_t head, int32_t slot, CpuKvStorage& to, int64_t dst_row, bool k,
                     bool v) const;

  // Copies the K row of (layer, block, head, slot) to dst (head_dim elements of the layout's dtype)
  // and, for INT8, its parameters to *params. Returns bytes.
  size_t read_k_row(int32_t layer, int32_t block, int32_t head, int32_t slot, std::byte* dst, KvInt8Row* params) const;

  // Copies the dimension rows dims[0..r) of the transposed-K tile of (layer, block, head) to dst
  // ([r][block_size] elements of the layout's dtype): the part of a block SparQ's step 1 reads.
  // Returns bytes. Needs transposed K.
  size_t copy_kt_rows(int32_t layer, int32_t block, int32_t head, const int32_t* dims, int32_t r, void* dst) const;

  // Drops blocks [0, blocks) of every plane of `layer` from the CPU caches (cpu::evict_from_cache):
  // a measurement's next read of them comes from memory, as in a decode step
  // (engine/backend/cpu/break_even.cpp). Share `part` of `parts` of those bytes, so that a pool's
  // threads can split it: a flush of several ms on one thread lets the others fall asleep, and
  // the next timed call would pay their wake-up.
  void evict_layer_from_cache(int32_t layer, int32_t blocks, int part = 0, int parts = 1) const;

  // The view an attention kernel reads for `layer` of the sequence with block table `table`.
  PagedKvView view(int32_t layer, const int32_t* table) const;

 private:
  std::byte* at(KvPlane p, int32_t layer, int32_t block) {
    return planes_[static_cast<int>(p)][layer].data() + layout_.plane_bytes(p) * static_cast<size_t>(block);
  }
  const std::byte* at(KvPlane p, int32_t layer, int32_t block) const {
    return planes_[static_cast<int>(p)][layer].data() + layout_.plane_bytes(p) * static_cast<size_t>(block);
  }
  void check_block(int32_t block) const;
  // Row index of (block, head, slot) in a layer's K / V plane ([blocks][heads][block_size] rows),
  // and the elements' bytes of one row (INT8's parameters sit in their own planes, same index).
  int64_t row_index(int32_t block, int32_t head, int32_t slot) const {
    return (static_cast<int64_t>(block) * layout_.n_kv_heads + head) * layout_.block_size + slot;
  }
  size_t row_bytes() const { return static_cast<size_t>(layout_.head_dim) * kv_dtype_bytes(layout_.dtype); }

  KvLayout layout_;
  int32_t num_blocks_;
  int32_t shared_blocks_;
  std::vector<std::unique_ptr<SharedPages>> shared_;  // per plane, when shared_blocks_ > 0
  std::vector<HugePageBuffer> planes_[kKvPlanes];  // [plane][layer], empty when absent
};

}  // namespace fathom
