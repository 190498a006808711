#pragma once
// Paged causal attention on the CPU: SIMD (run-time dispatch), multi-threaded over
// (query block, kv head, key chunk) work items; key chunks of long sequences are merged
// exactly with their log-sum-exp statistics (split-K, flash-decoding style).
#include <functional>

#include "kernels/cpu/thread_pool.h"
#include "kernels/paged_kv.h"

namespace fathom::cpu {

// See AttentionArgs in kernels/paged_kv.h.
void paged_attention(ThreadPool& pool, const PagedKvView& kv, const AttentionArgs& args);

// Keys are cut into chunks at absolute multiples of this many positions (kKeyChunk rounded up to
// whole blocks); each chunk's partial result starts from a fresh softmax state and partials are
// folded in chunk order.
int32_t key_chunk_positions(int32_t block_size);

// Where paged_attention_chunked reads each key chunk: a tiered KV cache makes chunks readable
// pass by pass, staging host blocks into a bounded device area (engine/backend/cpu).
class KeyChunkSource {
 public:
  virtual ~KeyChunkSource() = default;
  // Makes chunks [first, k) readable for the largest k <= end it can (k > first) and returns k.
  // Views handed out by earlier calls may then be stale.
  virtual int32_t prepare(int32_t first, int32_t end) = 0;
  // The view chunk c (in the last prepared range) is read through.
  virtual const PagedKvView& view(int32_t c) const = 0;
};

// paged_attention with the keys of each chunk read through `source`, pass by pass (`kv` gives
// the shape: heads, head_dim, block size). Bitwise the result paged_attention computes over a
// view holding every key: same chunks, same fold order.
void paged_attention_chunked(ThreadPool& pool, const PagedKvView& kv, const AttentionArgs& args, KeyChunkSource& source);

// For kernels that read several sequences' views (bifurcated groups): the source a view's keys
// are read through, or null when that view holds every key it is asked for (no host blocks).
using ChunkSourceFor = std::function<KeyChunkSource*(const PagedKvView& view)>;

}  // namespace fathom::cpu
