#pragma once
// How a model runs: which backend, its threads, KV cache and matmul precision, and the chat
// template family (the one option the Model itself reads). Filled from configs/*.json and flags.
#include <cstdint>
#include <string>

#include "base/kv_dtype.h"
#include "kernels/cpu/matmul.h"

namespace fathom {

struct ModelOptions {
  int threads = 0;                 // 0: hardware concurrency
  KvDtype kv_dtype = KvDtype::kF16;
  bool kv_transposed_k = true;     // keep K a second time per block, dimension-major (SparQ step 1)
  int32_t block_size = 16;         // tokens per KV block
  int64_t kv_cache_bytes = 0;      // 0: room for context_length tokens of one sequence, plus slack
  // With a host tier: the share (%) of the device tier, beyond one step's writes and a sliding
  // window of blocks, that holds the hot-row cache (HiP / SWA over host rows); the rest holds
  // blocks, which dense attention then reads in place instead of staging (docs/tiered_kv.md).
  int32_t hot_rows_percent = 25;
  cpu::Precision precision = cpu::Precision::kQ8;
  bool pack_weights = true;        // kQ8 on the CPU: repack quantized matrices into 16-row panels at load (PackedWeights)
  std::string chat_template;       // family name; empty: detect from the GGUF
  std::string backend = "cpu";     // "cpu", or "cuda" (needs a build with the CUDA backend and a GPU)
};

}  // namespace fathom
