#pragma once
// What an attention kernel needs to read one sequence's K/V for one layer from the paged pool.
#include <cmath>
#include <cstdint>

#include "base/kv_dtype.h"

// Small functions shared by host code and CUDA kernels (nvcc needs them marked for both).
#if defined(__CUDACC__)
#define FATHOM_HOST_DEVICE __host__ __device__
#else
#define FATHOM_HOST_DEVICE
#endif

namespace fathom {

// A KV cache split across tiers (docs/tiered_kv.md): a block table entry < 0 is a block in the
// host tier, slot -(entry + 1), which kernels do not read in place. The gather kernels (the sparse
// policies) ask the view's prefetcher for the positions they are about to read; it copies the
// rows into a device-resident hot-row cache and records where in PagedKvView::host_rows.
class RowPrefetcher {
 public:
  virtual ~RowPrefetcher() = default;
  // Makes positions pos[0..n) of kv head g readable (K, and V when need_v): afterwards
  // host_rows[(host slot · block_size + offset) · n_kv_heads + g] is the row index, in the view's
  // planes, of every such position in a host block. Rows of kv head g made readable by earlier
  // calls may be evicted; other kv heads' rows stay. Throws when the cache cannot hold them all.
  virtual void prefetch(int32_t g, const int32_t* pos, int32_t n, bool need_v) = 0;
  // The most rows of one kv head a prefetch() can hold at once.
  virtual int32_t capacity() const = 0;
  // SparQ's step 1 over a host-tier block: writes the dimension rows dims[0..r) of kv head g's
  // transposed-K tile in host slot `slot` to dst ([r][block_size], the view's dtype), read from
  // the host tier directly (on a GPU: mapped pinned memory, as HiP's offloading reads a miss)
  // instead of through the hot-row cache — r/d of the tile, once per step. Thread-safe; returns bytes.
  virtual size_t read_kt_rows(int32_t slot, int32_t g, const int32_t* dims, int32_t r, void* dst) const = 0;
  // HiP's mask estimation: writes the K rows of positions pos[0..n) of kv head g, in either tier, to
  // dst ([n][head_dim], the view's dtype; for INT8 their parameters to dst_params), reading the
  // host tier in place — as the HiP reference's estimation reads a miss from mapped host memory —
  // without inserting anything into the hot-row cache (whose rows stay the attention's). Thread-safe;
  // returns the bytes read from the host tier.
  virtual size_t read_k_rows(int32_t g, const int32_t* pos, int32_t n, void* dst, KvInt8Row* dst_params) const = 0;
  // Counts bytes that read_kt_rows and read_k_rows calls moved (host → device).
  virtual void count_read(int64_t bytes) = 0;
};

// One layer's planes in one tier, laid out as PagedKvView's own (device-tier) planes.
struct KvTierPlanes {
  const void* k = nullptr;
  const void* v = nullptr;
  const void* k_t = nullptr;
  const KvInt8Row* k_rows = nullptr;
  const KvInt8Row* v_rows = nullptr;
  const float* v_sum = nullptr;
  const float* k_moments = nullptr;
};

struct PagedKvView {
  const void* k = nullptr;  // layer base: [num_blocks][n_kv_heads][block_size][head_dim], `dtype`
  const void* v = nullptr;  // same layout as k
  KvDtype dtype = KvDtype::kF32;
  const int32_t* block_table = nullptr;  // logical block i of the sequence -> physical block
  int32_t block_size = 16;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;

  // kI8 only: per-row quantization of K and V, [num_blocks][n_kv_heads][block_size]
  // (index with row_index). nullptr for f32 / f16.
  const KvInt8Row* k_rows = nullptr;
  const KvInt8Row* v_rows = nullptr;
  // Optional, for SparQ step 1: K stored again per tile as [head_dim][block_size] (dimension-
  // major, same dtype; INT8 shares k_rows): [num_blocks][n_kv_heads][head_dim][block_size].
  // nullptr when the cache keeps K only once; kernels then read the rows of `k`.
  const void* k_t = nullptr;
  // Optional, for SparQ's mean-value reallocation: [num_blocks][n_kv_heads][head_dim] f32, the
  // sum of V over the sequence's positions [0, last row written in that block] (a running sum
  // carried from block to block at append time, so blocks shared by a prefix agree). The mean
  // over [0, pos] is v_sum[table[pos / block_size]] / (pos + 1). nullptr: not maintained.
  const float* v_sum = nullptr;
  // Optional, for SparQ's key spread: [num_blocks][n_kv_heads][2][head_dim] f32, the running mean
  // of K and the sum of squared deviations from it (Welford's M2) over the sequence's positions
  // [0, last row written in that block], carried from block to block at append time as v_sum.
  // The keys' variance along c over [0, pos] is M2[c] / (pos + 1); see key_moments_index.
  const float* k_moments = nullptr;
  // Tiered caches only (nullptr otherwise): see RowPrefetcher. The CUDA kernels, which have no
  // prefetcher, read a host position whose entry here is >= 0 from that device row (a hot-row cache
  // holding its K and V, kept current by the backend), and the others in place from host_tier.
  const int32_t* host_rows = nullptr;
  RowPrefetcher* prefetcher = nullptr;
  // Kernels that read the host tier in place (the CUDA kernels, through mapped pinned memory: the
  // HiP reference's offloading) read a block table entry e < 0 as slot -(e + 1) of these planes,
  // and add the bytes they read there to *host_read_bytes (a device counter; null: not counted).
  // Unset on the CPU backend, whose kernels read host rows through the hot-row cache instead.
  KvTierPlanes host_tier{};
  unsigned long long* host_read_bytes = nullptr;

  // Element offset of the [block_size][head_dim] tile for logical block `i`, kv head `h`
  // (also the offset of the [head_dim][block_size] tile in k_t).
  int64_t tile_offset(int32_t i, int32_t h) const {
    return (static_cast<int64_t>(block_table[i]) * n_kv_heads + h) * block_size * head_dim;
  }
  // Index into k_rows / v_rows of absolute position t, kv head h.
  int64_t row_index(int32_t t, int32_t h) const {
    return (static_cast<int64_t>(block_table[t / block_size]) * n_kv_heads + h) * block_size + t % block_size;
  }
  // Index into v_sum of the tile holding position t, kv head h.
  int64_t sum_index(int32_t t, int32_t h) const {
    return (static_cast<int64_t>(block_table[t / block_size]) * n_kv_heads + h) * head_dim;
  }
  // Index into k_moments of the tile holding position t, kv head h: the means, then head_dim M2s.
  int64_t key_moments_index(int32_t t, int32_t h) const { return 2 * sum_index(t, h); }
};

// One appended key's Welford update of one component: `mean`, `m2` over positions [0, pos)
// (anything at pos = 0) become those over [0, pos]. Welford's update: stable in f32, where
// Σk² − n·mean² would cancel (Gemma 3's keys barely vary along some components). The CPU and CUDA
// appends both call this, so their moments agree (bitwise under emulation; nvcc may fuse m2's
// multiply-add on a GPU).
FATHOM_HOST_DEVICE inline void key_moments_update(float x, int32_t pos, float& mean, float& m2) {
  if (pos == 0) {
    mean = x;
    m2 = 0.0f;
    return;
  }
  const float delta = x - mean;
  mean += delta / static_cast<float>(pos + 1);
  m2 += delta * (x - mean);
}
// The keys' spread (population standard deviation) along one component over n positions, from M2.
FATHOM_HOST_DEVICE inline float key_spread_of_m2(float m2, int32_t n) {
  return sqrtf(fmaxf(m2, 0.0f) / static_cast<float>(n));
}

// How a query·key dot product becomes a logit: (q·k)·scale, then, when cap > 0, soft-capped to
// cap·tanh(logit / cap) (Gemma 2's attn_logit_softcapping: every logit inside (−cap, cap)).
// Converts from a bare scale (cap 0), which is what every model without soft-capping passes.
struct LogitScale {
  float scale = 1.0f;
  float cap = 0.0f;  // 0: none
  FATHOM_HOST_DEVICE LogitScale(float s = 1.0f, float c = 0.0f) : scale(s), cap(c) {}  // NOLINT: implicit
};
// cap·tanh(x / cap) for cap > 0, with tanh(|y|) = (1 − e^(−2|y|)) / (1 + e^(−2|y|)): one exp of a
// non-positive argument, the form every kernel (scalar, SIMD, CUDA) computes, so they agree to a few
// ulps of cap (absolute), which is what a softmax is sensitive to.
FATHOM_HOST_DEVICE inline float soft_cap(float x, float cap) {
  const float t = expf(fabsf(x) * (-2.0f / cap));
  return copysignf(cap * ((1.0f - t) / (1.0f + t)), x);
}
FATHOM_HOST_DEVICE inline float apply_logit_scale(float dot, const LogitScale& s) {
  const float x = dot * s.scale;
  return s.cap > 0.0f ? soft_cap(x, s.cap) : x;
}

// Causal attention for `n_q` consecutive query tokens of one sequence.
//   q:   [n_q][n_heads][head_dim] f32, query i is at absolute position pos0 + i
//   out: [n_q][n_heads][head_dim] f32
// Query at position p attends keys [lo, p] with lo = max(0, p - window + 1) (window 0: lo = 0).
// GQA: query head h reads kv head h / (n_heads / n_kv_heads). The cache must already hold
// positions up to pos0 + n_q - 1. logits are (q·k) * scale, soft-capped when softcap > 0 (LogitScale).
struct AttentionArgs {
  const float* q = nullptr;
  float* out = nullptr;
  int32_t n_q = 0;
  int32_t n_heads = 0;
  int32_t pos0 = 0;
  int32_t window = 0;
  float scale = 1.0f;
  float softcap = 0.0f;
  // gpt-oss's attention sinks: per query head a logit that joins the softmax's denominator and
  // adds no value (out = Σ e^(l_j) v_j / (Σ e^(l_j) + e^(sink_h))); null: none. [n_heads] f32.
  const float* sinks = nullptr;
  LogitScale logit_scale() const { return {scale, softcap}; }
};

// Σ e^(l_j − m) over a row's keys (its running sum `l` at max `m`) with head sink `sink` added:
// the sink weighs e^(sink − m) (0 when the exponent underflows, +inf when it overflows: out = 0).
FATHOM_HOST_DEVICE inline float with_sink(float l, float m, const float* sinks, int32_t head) {
  return sinks == nullptr ? l : l + expf(sinks[head] - m);
}

// One decode query of one sequence: what every sparse decode policy (ref, cpu, cuda) takes.
struct DecodeArgs {
  const float* q = nullptr;  // [n_heads][head_dim] f32
  float* out = nullptr;      // [n_heads][head_dim] f32
  int32_t n_heads = 0;       // GQA: query head h reads kv head h / (n_heads / n_kv_heads)
  int32_t pos = 0;           // query position; attends keys [0, pos] (the cache holds them)
  float scale = 1.0f;        // logit = (q·k)·scale, usually 1/√head_dim
  float softcap = 0.0f;      // > 0: logits soft-capped (LogitScale); the sparse policies refuse it
  const float* sinks = nullptr;  // [n_heads] attention sinks (AttentionArgs); the sparse policies refuse them
  LogitScale logit_scale() const { return {scale, softcap}; }
};

}  // namespace fathom
