#include "engine/backend/cpu/staged_chunks.h"

#include <algorithm>

#include "base/error.h"

namespace fathom {

bool reads_host_tier(const std::vector<int32_t>& table, int32_t first, int32_t end) {
  end = std::min(end, static_cast<int32_t>(table.size()));
  return std::any_of(table.begin() + std::max(first, 0), table.begin() + std::max(end, 0), [](int32_t e) { return e < 0; });
}

StagedChunks::StagedChunks(CpuKvStorage& device, const CpuKvStorage& host, int32_t layer, const std::vector<int32_t>& table,
                           int32_t n_blocks, int32_t chunk_blocks, int32_t staging_first, int32_t staging_slots)
    : device_(device),
      host_(host),
      layer_(layer),
      n_blocks_(n_blocks),
      chunk_blocks_(chunk_blocks),
      staging_first_(staging_first),
      staging_slots_(staging_slots),
      table_(table) {
  FATHOM_CHECK(chunk_blocks > 0 && staging_slots >= chunk_blocks && n_blocks <= static_cast<int32_t>(table.size()));
}

int32_t StagedChunks::prepare(int32_t first, int32_t end) {
  pass_table_.assign(table_.begin(), table_.begin() + n_blocks_);
  int32_t used = 0, c = first;
  for (; c < end; ++c) {
    const int32_t b0 = c * chunk_blocks_, b1 = std::min(n_blocks_, b0 + chunk_blocks_);
    const auto host_blocks = static_cast<int32_t>(std::count_if(pass_table_.begin() + b0, pass_table_.begin() + b1,
                                                                [](int32_t e) { return e < 0; }));
    if (used + host_blocks > staging_slots_) break;  // the first chunk always fits (constructor)
    for (int32_t b = b0; b < b1; ++b) {
      if (pass_table_[b] >= 0) continue;
      const int32_t slot = staging_first_ + used++;
      bytes_ += static_cast<int64_t>(host_.copy_layer_block_to(layer_, -pass_table_[b] - 1, device_, slot));
      pass_table_[b] = slot;
    }
  }
  view_ = device_.view(layer_, pass_table_.data());
  return c;
}

}  // namespace fathom
