#pragma once
// Two backends decoding from the same cache: the prompt is prefilled once on the CPU backend and
// its blocks are copied into the other backend's storage (block images are the same bytes).
// Used by the CUDA-vs-CPU tests and eval/cuda_passkey.cpp.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/kv/block_allocator.h"

namespace fathom::testing {

// Returns the prompt's block table (P / block_size full blocks and the partial one, freshly
// allocated from `blocks`); `logits` gets the last position's row.
inline std::vector<int32_t> prefill_and_copy(Backend& cpu, Backend& other, BlockAllocator& blocks,
                                             const std::vector<int32_t>& prompt, std::vector<float>& logits) {
  const int32_t full = static_cast<int32_t>(prompt.size()) / blocks.block_size();
  std::vector<int32_t> table;
  for (int32_t b = 0; b <= full; ++b) table.push_back(blocks.allocate());
  BatchPlan prefill;
  prefill.seqs.push_back(SeqStep{prompt, 0, &table, LogitsWanted::kLast});
  cpu.forward(prefill, logits);
  std::vector<std::byte> image(cpu.block_bytes());
  for (int32_t b : table) {
    cpu.read_block(b, image.data());
    other.write_block(b, image.data());
  }
  return table;
}

}  // namespace fathom::testing
