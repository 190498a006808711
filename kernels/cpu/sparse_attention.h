#pragma once
// Decode attention policies on the CPU (ALGORITHMS.md), one decode query of one sequence per
// call, reading f32 / f16 / INT8 K/V in place from the paged blocks. Each follows its scalar
// reference in kernels/ref (the spec: same selection rules, same parameters) and returns the KV
// bytes it actually read, counted from its own access pattern (kv_row_bytes per row read; the
// transposed-K reads of SparQ step 1 as r·S elements per kv head; INT8 row parameters included).
// Multi-threaded over kv heads and over key ranges of long sequences.
#include <cstdint>
#include <functional>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/paged_kv.h"
#include "kernels/ref/bifurcated.h"
#include "kernels/ref/hip.h"
#include "kernels/ref/sparq.h"
#include "kernels/ref/swa.h"

namespace fathom::cpu {

struct SparqResult {
  int64_t kv_bytes = 0;
  int32_t r = 0, k = 0, l = 0;  // the values used after defaults and clamping to S
};

// What SparQ chose, for tests and diagnostics: the CPU ranks by f32 scores summed in its own
// order, so on near-ties its I2 can differ from the double-precision reference's.
struct SparqTrace {
  std::vector<std::vector<int32_t>> selected;  // [n_kv_heads] I2, ascending positions
  std::vector<std::vector<int32_t>> dims;      // [n_kv_heads] I1, the r dimensions step 1 read
  std::vector<float> alpha;                    // [n_heads] α_h (1 exactly when I2 is every position)
};

// SparQ, all six steps as ref::sparq_attention. Step 1 reads kv.k_t (the r selected dimension
// rows of each tile) when present, else the K rows. Step 6 takes v̄ from kv.v_sum when present,
// else computes it from V (reading all of V). Bytes per kv head:
//   S·(r·elem + p) + 2·|I2|·kv_row_bytes + (v_sum ? 4·d : S·kv_row_bytes if reallocation)
// with p = sizeof(KvInt8Row) for INT8 (each position's scale and min), else 0.
// Over a tiered view (kv.prefetcher set) step 1 reads the r selected dimension rows of each
// host-tier block's transposed-K tile through the prefetcher; that needs what
// sparq_reads_host_tier checks (else sparq_decode throws std::invalid_argument).
// key_spread (nullable, [n_kv_heads][head_dim]): step 1 weighted by √ of the keys' spread per
// component, as ref::sparq_attention's key_spread.
SparqResult sparq_decode(ThreadPool& pool, const PagedKvView& kv, const DecodeArgs& args, const ref::SparqParams& p,
                         SparqTrace* trace = nullptr, const float* key_spread = nullptr);
// f32 / f16 transposed-K tiles (INT8 ones are scaled by per-row parameters the host read does not
// carry) and running V sums unless reallocation is off.
inline bool sparq_reads_host_tier(const PagedKvView& kv, bool reallocation) {
  return kv.k_t != nullptr && kv.dtype != KvDtype::kI8 && (kv.v_sum != nullptr || !reallocation);
}

// HiP mask estimation (a refresh step) and block-sparse attention with a given (possibly cached)
// mask, as ref::hip_estimate_mask / ref::hip_sparse_attention. Bytes are added to `bytes`, as the
// ref counts them (distinct rows per kv head; per iteration for the estimation) but each row at
// kv_row_bytes (INT8 parameters included). The mask is the selection: scores are f32 here, so on
// near-ties a block can differ from the reference's.
void hip_estimate_mask(ThreadPool& pool, const PagedKvView& kv, const DecodeArgs& args, const ref::HipParams& p,
                       ref::HipMask* mask, ref::HipBytes* bytes);
void hip_sparse_decode(ThreadPool& pool, const PagedKvView& kv, const DecodeArgs& args, const ref::HipParams& p,
                       const ref::HipMask& mask, ref::HipBytes* bytes);

struct SwaResult {
  int64_t kv_bytes = 0;
  int32_t k_local = 0, k_global = 0;
};

// ALISA sparse window attention as ref::swa_attention (mass: [pos + 1], the caller's accumulated
// attention weight per position). If `kept_weights` is not null, it becomes [|kept|]: the softmax
// weight of each kept position (in `kept` order) summed over all query heads (the caller folds it
// into its mass for the next steps).
// Bytes: 2·|kept|·kv_row_bytes per kv head. `kept` (optional): the kept positions, ascending.
// The heavy hitters are gathered row by row; the local window, where the view has the transposed
// K plane and the window's blocks are in the device tier, is streamed as dense decode reads keys
// (sparse::run_streamable; ~1.5x cheaper per key than gathered, see sparse::AttendTask).
SwaResult swa_decode(ThreadPool& pool, const PagedKvView& kv, const DecodeArgs& args, const ref::SwaParams& p,
                     const float* mass, std::vector<float>* kept_weights, std::vector<int32_t>* kept = nullptr);
// The same with the mass the heavy hitters are chosen by produced on demand (`selection_mass`,
// called once, on whichever pool thread selects): where the window is streamed, the caller's
// mass preparation (e.g. pooling) and the selection run beside the window's reads.
SwaResult swa_decode(ThreadPool& pool, const PagedKvView& kv, const DecodeArgs& args, const ref::SwaParams& p,
                     const std::function<const float*()>& selection_mass, std::vector<float>* kept_weights,
                     std::vector<int32_t>* kept = nullptr);

// Bifurcated group attention as ref::bifurcated_attention: each shared segment's K/V is read
// once for all member query rows, every sequence's own suffix separately, merged exactly.
// Returns the KV bytes read. Over a tiered cache, `source_for` gives the KeyChunkSource a
// segment's or suffix's view is read through (chunk range by chunk range, as the source makes
// them readable; the same partials and merge, so bitwise the result over resident views).
int64_t bifurcated_decode(ThreadPool& pool, const std::vector<ref::SharedSegment>& segments, const PagedKvView* seq_kv,
                          const DecodeArgs* seq_args, int32_t n_seqs, const ChunkSourceFor& source_for = {});

}  // namespace fathom::cpu
