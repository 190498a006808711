#pragma once
// Dense attention over a KV cache split between the device tier and the host tier (docs/
// tiered_kv.md). A physical block table's negative entries are host slots (BlockAllocator::
// physical); kernels read device storage only, so each key chunk's host blocks are copied — one
// layer's planes — into the device storage's staging slots before the chunk is read, as many
// chunks per pass as the staging slots hold. On a GPU this is the copy stream filling a bounded
// device buffer from pinned memory; here both are host memory and the copy is a memcpy, so the
// bytes moved and the code path are the real ones.
#include <cstdint>
#include <vector>

#include "engine/backend/cpu/kv_storage.h"
#include "kernels/cpu/attention.h"

namespace fathom {

// True when blocks [first, end) of `table` include one in the host tier.
bool reads_host_tier(const std::vector<int32_t>& table, int32_t first, int32_t end);

class StagedChunks final : public cpu::KeyChunkSource {
 public:
  // `table`: the sequence's physical table, read for blocks [0, n_blocks); chunk c covers blocks
  // [c·chunk_blocks, (c+1)·chunk_blocks). Staging slots: [staging_first, staging_first +
  // staging_slots) of `device`, at least chunk_blocks of them.
  StagedChunks(CpuKvStorage& device, const CpuKvStorage& host, int32_t layer, const std::vector<int32_t>& table,
               int32_t n_blocks, int32_t chunk_blocks, int32_t staging_first, int32_t staging_slots);

  int32_t prepare(int32_t first, int32_t end) override;
  const PagedKvView& view(int32_t) const override { return view_; }
  int64_t staged_bytes() const { return bytes_; }  // host -> device, over every pass

 private:
  CpuKvStorage& device_;
  const CpuKvStorage& host_;
  int32_t layer_, n_blocks_, chunk_blocks_, staging_first_, staging_slots_;
  const std::vector<int32_t>& table_;
  std::vector<int32_t> pass_table_;  // table_ with this pass's host entries pointing at staging slots
  PagedKvView view_;
  int64_t bytes_ = 0;
};

}  // namespace fathom
