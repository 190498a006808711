#pragma once
// Decode attention policies on the CPU (ALGORITHMS.md), one decode query of one sequence per
// call, reading f32 / f16 / INT8 K/V in place from the paged blocks. Each follows its scalar
// reference in kernels/ref (the spec: same selection rules, same parameters) and returns the KV
// bytes it actually read, counted from its own access pattern (kv_row_bytes per row read; the
// transposed-K reads of SparQ step 1 as r·S elements per kv head; INT8 row parameters included).
// Multi-threaded over kv heads and over key ranges of long sequences.
#include <cstdint>
#include <vector>

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

// SparQ, all six steps as ref::sparq_attention. Step 1 reads kv.k_t (the r selected dimension
// rows of each tile) when present, else the K rows. Step 6 takes v̄ from kv.v_sum when present,
// else computes it from V (reading all of V).
SparqResult sparq_decode(ThreadPool& pool, const PagedKvView& kv, const DecodeArgs& args, const ref::SparqParams& p);

// HiP mask estimation (a refresh step) and block-sparse attention with a given (possibly cached)
// mask, as ref::hip_estimate_mask / ref::hip_sparse_attention. Bytes are added to `bytes`.
void hip_estimate_mask(ThreadPool& pool, const PagedKvView& kv, const DecodeArgs& args, const ref::HipParams& p,
                       ref::HipMask* mask, ref::HipBytes* bytes);
void hip_sparse_decode(ThreadPool& pool, const PagedKvView& kv, const DecodeArgs& args, const ref::HipParams& p,
                       const ref::HipMask& mask, ref::HipBytes* bytes);

struct SwaResult {
  int64_t kv_bytes = 0;
  int32_t k_local = 0, k_global = 0;
};

// ALISA sparse window attention as ref::swa_attention (mass: [pos + 1], the caller's accumulated
// attention weight per position). If `weights` is not null, adds to weights[t] the softmax
// weight of position t summed over all query heads for every kept t (the caller folds it into
// its mass for the next steps).
SwaResult swa_decode(ThreadPool& pool, const PagedKvView& kv, const DecodeArgs& args, const ref::SwaParams& p,
                     const float* mass, float* weights);

// Bifurcated group attention as ref::bifurcated_attention: each shared segment's K/V is read
// once for all member query rows, every sequence's own suffix separately, merged exactly.
// Returns the KV bytes read.
int64_t bifurcated_decode(ThreadPool& pool, const std::vector<ref::SharedSegment>& segments, const PagedKvView* seq_kv,
                          const DecodeArgs* seq_args, int32_t n_seqs);

}  // namespace fathom::cpu
