#pragma once
// Shared pieces of the CUDA decode-attention kernels (paged_decode_attention, sparq_attention,
// hip_attention, bifurcated_attention):
//   - KvDev: the paged KV view as kernel arguments; row loads of f32 / f16 / INT8 (per-row
//     scale·x + min, exactly ref's formula) into registers, lane c, c + 32, ... (coalesced rows).
//   - WarpSoftmax: one warp's online softmax of up to kRows query rows that share a kv head, so
//     each K/V row fetched serves every row (a GQA group reads KV once per CTA, not per head).
//   - attend_partial_kernel: split-K attention over a "position source" (a key range, a gathered
//     list, HiP blocks), and merge_kernel: the exact log-sum-exp merge with optional SparQ
//     reallocation epilogue.
//   - Byte instrumentation: under the emulator every global load/store is counted (per lane for
//     lane-distributed data, once per warp for warp-uniform loads) so tests compare a launcher's
//     byte formula with what the grid really touched. Under nvcc the counters compile to nothing.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cuda/emu/cuda_emu.h"
#include "kernels/paged_kv.h"

#ifdef FATHOM_CUDA_EMULATION
#include <atomic>
#endif

namespace fathom::cuda {

// Bytes one launch moves to or from global memory, as implemented (every request counted, no
// cache model): KV data (K, V, k_t, INT8 row parameters, v_sum, k_moments), other reads (queries, block
// tables, workspaces, selections), and writes.
struct AttnBytes {
  int64_t kv_read = 0, other_read = 0, written = 0;
  int64_t total() const { return kv_read + other_read + written; }
  AttnBytes& operator+=(const AttnBytes& o) {
    kv_read += o.kv_read;
    other_read += o.other_read;
    written += o.written;
    return *this;
  }
};

namespace attn_common {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kMaxHeadDim = 256;

#ifdef FATHOM_CUDA_EMULATION
struct ByteCounters {
  std::atomic<int64_t> kv_read{0}, other_read{0}, written{0};
};
inline ByteCounters& byte_counters() {
  static ByteCounters c;
  return c;
}
inline void reset_byte_counters() {
  byte_counters().kv_read = 0;
  byte_counters().other_read = 0;
  byte_counters().written = 0;
}
inline AttnBytes counted_bytes() {
  return {byte_counters().kv_read.load(), byte_counters().other_read.load(), byte_counters().written.load()};
}
#endif

__device__ __forceinline__ void count_kv(int64_t n) {
#ifdef FATHOM_CUDA_EMULATION
  byte_counters().kv_read.fetch_add(n, std::memory_order_relaxed);
#else
  (void)n;
#endif
}
__device__ __forceinline__ void count_other(int64_t n) {
#ifdef FATHOM_CUDA_EMULATION
  byte_counters().other_read.fetch_add(n, std::memory_order_relaxed);
#else
  (void)n;
#endif
}
__device__ __forceinline__ void count_write(int64_t n) {
#ifdef FATHOM_CUDA_EMULATION
  byte_counters().written.fetch_add(n, std::memory_order_relaxed);
#else
  (void)n;
#endif
}

// A load every lane of a warp issues at the same address (one transaction): counted by lane 0.
template <typename T>
__device__ __forceinline__ T load_uniform(const T* p, int lane) {
  if (lane == 0) count_other(sizeof(T));
  return *p;
}

// The paged KV view as kernel arguments. Two tiers: a block table entry e >= 0 is block e of
// the device planes (k, v, ...), e < 0 is block -(e + 1) of `host` (KvTierPlanes: mapped pinned
// memory, read in place over the bus: a backend with a host tier never stages a block for these
// kernels).
struct KvDev {
  const void* k;                // [num_blocks][n_kv_heads][block_size][head_dim]
  const void* v;                // same layout
  const void* k_t;              // [num_blocks][n_kv_heads][head_dim][block_size] or null
  const KvInt8Row* k_rows;      // INT8: [num_blocks][n_kv_heads][block_size]
  const KvInt8Row* v_rows;
  const float* v_sum;           // [num_blocks][n_kv_heads][head_dim] or null
  const float* k_moments;       // [num_blocks][n_kv_heads][2][head_dim] or null
  const int32_t* block_table;   // logical -> physical block (< 0: the host tier)
  int32_t block_size, n_kv_heads, head_dim;
  KvTierPlanes host;            // the host tier, same layout; null planes without one
  unsigned long long* host_read;  // bytes read from the host tier are added here (null: not counted)
  // Optional hot-row cache of the host tier: [(host slot · block_size + offset) · n_kv_heads + g] ->
  // a device row holding that host row's K and V, or -1 (read in place). Null: no cache.
  const int32_t* host_rows;
};

inline KvDev make_kv_dev(const PagedKvView& kv) {
  return {kv.k,          kv.v,        kv.k_t,         kv.k_rows,           kv.v_rows, kv.v_sum, kv.k_moments,
          kv.block_table, kv.block_size, kv.n_kv_heads, kv.head_dim, kv.host_tier, kv.host_read_bytes, kv.host_rows};
}

// The slot a block table entry names in its tier (the entry itself, or -(e + 1) for the host tier).
__device__ __forceinline__ int64_t slot_of_entry(int32_t e) { return e >= 0 ? e : -static_cast<int64_t>(e) - 1; }

// Bytes of one K or V row (with its INT8 parameters) of element type T.
template <typename T>
__device__ __forceinline__ int64_t kv_row_bytes_of(const KvDev& kv) {
  return static_cast<int64_t>(kv.head_dim) * sizeof(T) + (std::is_same_v<T, uint8_t> ? sizeof(KvInt8Row) : 0);
}

// Adds a warp's host-tier bytes to the counter: `n` the same on every lane (warp-uniform reads).
__device__ __forceinline__ void add_host_bytes_uniform(const KvDev& kv, int64_t n, int lane) {
  if (lane == 0 && n > 0 && kv.host_read != nullptr)
    atomicAdd(kv.host_read, static_cast<unsigned long long>(n));
}
// The same for per-lane counts; every lane of the warp must call it.
__device__ __forceinline__ void add_host_bytes_lanes(const KvDev& kv, int64_t n, int lane) {
  unsigned long long total = static_cast<unsigned long long>(n);
  for (int offset = 16; offset > 0; offset >>= 1) total += __shfl_xor_sync(0xffffffffu, total, offset);
  if (lane == 0 && total > 0 && kv.host_read != nullptr) atomicAdd(kv.host_read, total);
}

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(uint8_t v) { return static_cast<float>(v); }

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

// Row reference of position t, kv head g: >= 0 a row index of the device tier (into k_rows /
// v_rows; times head_dim: element offset), < 0 row -(ref + 1) of the host tier.
// A host position the hot-row cache holds (KvDev::host_rows) is read from its device row.
__device__ __forceinline__ int64_t kv_row(const KvDev& kv, const int32_t* table, int t, int g, int lane) {
  const int32_t blk = load_uniform(table + t / kv.block_size, lane);
  const int64_t row = (slot_of_entry(blk) * kv.n_kv_heads + g) * kv.block_size + t % kv.block_size;
  if (blk >= 0) return row;
  if (kv.host_rows != nullptr) {
    const int32_t cached =
        load_uniform(kv.host_rows + (slot_of_entry(blk) * kv.block_size + t % kv.block_size) * kv.n_kv_heads + g, lane);
    if (cached >= 0) return cached;
  }
  return -row - 1;
}
__device__ __forceinline__ int64_t row_of_ref(int64_t ref) { return ref >= 0 ? ref : -ref - 1; }

// Row `row` of `base` (K or V) into x[j] = element lane + 32·j (0 past head_dim), as f32.
template <typename T, int kDpl>
__device__ __forceinline__ void load_row(const KvDev& kv, const void* base, const KvInt8Row* params, int64_t row,
                                         int lane, float (&x)[kDpl]) {
  const T* p = static_cast<const T*>(base) + row * kv.head_dim;
  float scale = 1.0f, offset = 0.0f;
  if constexpr (std::is_same_v<T, uint8_t>) {
    const KvInt8Row r = params[row];
    if (lane == 0) count_kv(sizeof(KvInt8Row));
    scale = r.scale;
    offset = r.min;
  }
FATHOM_UNROLL
  for (int j = 0; j < kDpl; ++j) {
    const int c = lane + 32 * j;
    if (c < kv.head_dim) {
      count_kv(sizeof(T));
      if constexpr (std::is_same_v<T, uint8_t>) {
        x[j] = scale * to_f32(p[c]) + offset;
      } else {
        x[j] = to_f32(p[c]);
      }
    } else {
      x[j] = 0.0f;
    }
  }
}

// The K (or V) row a kv_row reference names, from its tier (a select of the base pointers, one
// load path: branching into two inlined loads costs registers the split-K kernel does not have).
template <typename T, int kDpl>
__device__ __forceinline__ void load_k(const KvDev& kv, int64_t ref, int lane, float (&x)[kDpl]) {
  const bool dev = ref >= 0;
  load_row<T, kDpl>(kv, dev ? kv.k : kv.host.k, dev ? kv.k_rows : kv.host.k_rows, row_of_ref(ref), lane, x);
}
template <typename T, int kDpl>
__device__ __forceinline__ void load_v(const KvDev& kv, int64_t ref, int lane, float (&x)[kDpl]) {
  const bool dev = ref >= 0;
  load_row<T, kDpl>(kv, dev ? kv.v : kv.host.v, dev ? kv.v_rows : kv.host.v_rows, row_of_ref(ref), lane, x);
}

// One warp's online softmax over keys for kRows query rows sharing a kv head.
// q_s: [kRows][32·kDpl] f32 in shared memory, zero past head_dim and past the active rows.
template <int kDpl, int kRows>
struct WarpSoftmax {
  float acc[kRows][kDpl];  // unnormalised Σ e^(logit − m) · v, lane's dims
  float m[kRows];          // running max logit (−inf: no key yet)
  float l[kRows];          // Σ e^(logit − m)

  __device__ __forceinline__ void init() {
FATHOM_UNROLL
    for (int r = 0; r < kRows; ++r) {
      m[r] = -INFINITY;
      l[r] = 0.0f;
FATHOM_UNROLL
      for (int j = 0; j < kDpl; ++j) acc[r][j] = 0.0f;
    }
  }

  __device__ __forceinline__ void add(const float (&kx)[kDpl], const float (&vx)[kDpl], const float* q_s,
                                      const LogitScale& scale, int lane) {
FATHOM_UNROLL
    for (int r = 0; r < kRows; ++r) {
      float dot = 0.0f;
FATHOM_UNROLL
      for (int j = 0; j < kDpl; ++j) dot += q_s[r * 32 * kDpl + lane + 32 * j] * kx[j];
      const float logit = apply_logit_scale(warp_sum(dot), scale);
      const float m_new = fmaxf(m[r], logit);
      const float correction = expf(m[r] - m_new);  // 0 on the first key (m = −inf)
      const float weight = expf(logit - m_new);
      l[r] = l[r] * correction + weight;
FATHOM_UNROLL
      for (int j = 0; j < kDpl; ++j) acc[r][j] = acc[r][j] * correction + weight * vx[j];
      m[r] = m_new;
    }
  }
};

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;

struct AttendParams {
  KvDev kv;
  const float* q;     // [n_q][n_heads][head_dim]
  float* out;         // [n_q][n_heads][head_dim] (n_splits == 1)
  float* part_acc;    // [n_q · n_heads][n_splits][head_dim] (n_splits > 1)
  float* part_ml;     // [n_q · n_heads][n_splits][2]: max logit, Σ e^(logit − max)
  int32_t n_heads, group, head_tiles;
  int32_t keys_per_split, n_splits;
  LogitScale scale;
  const float* sinks;  // [n_heads] attention sinks, or null (AttentionArgs::sinks); one-split outputs only
  bool partial_only;  // write (acc, m, l) even with one split (a merge epilogue follows)
};

// Position sources: count(qi, g, h0) virtual indices; at(...) -> absolute position, or −1 to skip.
//
// grid (n_splits, n_kv_heads · head_tiles, n_q), kThreads threads. Block (split, g·tiles + tile,
// qi) serves query rows h0 .. h0 + kRows − 1 (h0 = g·group + tile·kRows, clipped to the group)
// over virtual indices [split·keys_per_split, +keys_per_split) of its position source; its warps
// take every kWarps-th index, reading each K/V row once for all its rows.
// __launch_bounds__(.., 1): ptxas otherwise caps the INT8 d = 256 variants at 80 registers and
// spills once a row may come from either tier.
template <typename T, int kDpl, int kRows, typename Positions>
__global__ void __launch_bounds__(kThreads, 1) attend_partial_kernel(AttendParams p, Positions positions) {
  __shared__ float q_s[kRows * 32 * kDpl];
  __shared__ float acc_s[kWarps * kRows * 32 * kDpl];
  __shared__ float ml_s[kWarps * kRows * 2];
  const int split = static_cast<int>(blockIdx.x), qi = static_cast<int>(blockIdx.z);
  const int g = static_cast<int>(blockIdx.y) / p.head_tiles, tile = static_cast<int>(blockIdx.y) % p.head_tiles;
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  const int d = p.kv.head_dim;
  const int h0 = g * p.group + tile * kRows;
  const int n_rows = min(kRows, p.group - tile * kRows);
  for (int i = static_cast<int>(threadIdx.x); i < kRows * 32 * kDpl; i += kThreads) {
    const int r = i / (32 * kDpl), c = i % (32 * kDpl);
    float x = 0.0f;
    if (r < n_rows && c < d) {
      x = p.q[(static_cast<int64_t>(qi) * p.n_heads + h0 + r) * d + c];
      count_other(sizeof(float));
    }
    q_s[i] = x;
  }
  __syncthreads();

  const int n = positions.count(qi, g, h0);
  const int begin = split * p.keys_per_split;
  const int end = min(n, begin + p.keys_per_split);
  WarpSoftmax<kDpl, kRows> ws;
  ws.init();
  float kx[kDpl], vx[kDpl];
  int host_rows = 0;  // K/V row pairs this warp read from the host tier (warp-uniform)
  for (int i = begin + warp; i < end; i += kWarps) {
    const int t = positions.at(qi, g, h0, i, lane);
    if (t < 0) continue;  // warp-uniform
    const int64_t ref = kv_row(p.kv, p.kv.block_table, t, g, lane);
    load_k<T, kDpl>(p.kv, ref, lane, kx);
    load_v<T, kDpl>(p.kv, ref, lane, vx);
    host_rows += ref < 0 ? 1 : 0;
    ws.add(kx, vx, q_s, p.scale, lane);
  }
  add_host_bytes_uniform(p.kv, 2 * host_rows * kv_row_bytes_of<T>(p.kv), lane);
FATHOM_UNROLL
  for (int r = 0; r < kRows; ++r) {
FATHOM_UNROLL
    for (int j = 0; j < kDpl; ++j) acc_s[(warp * kRows + r) * 32 * kDpl + lane + 32 * j] = ws.acc[r][j];
    if (lane == 0) {
      ml_s[(warp * kRows + r) * 2 + 0] = ws.m[r];
      ml_s[(warp * kRows + r) * 2 + 1] = ws.l[r];
    }
  }
  __syncthreads();

  for (int i = static_cast<int>(threadIdx.x); i < n_rows * d; i += kThreads) {
    const int r = i / d, c = i % d;
    float m_all = -INFINITY;
FATHOM_UNROLL
    for (int w = 0; w < kWarps; ++w) m_all = fmaxf(m_all, ml_s[(w * kRows + r) * 2]);
    float o = 0.0f, l_all = 0.0f;
FATHOM_UNROLL
    for (int w = 0; w < kWarps; ++w) {
      const float mw = ml_s[(w * kRows + r) * 2];
      const float scale_w = mw == -INFINITY ? 0.0f : expf(mw - m_all);  // a warp without keys weighs 0
      l_all += ml_s[(w * kRows + r) * 2 + 1] * scale_w;
      o += acc_s[(w * kRows + r) * 32 * kDpl + c] * scale_w;
    }
    const int64_t head_row = static_cast<int64_t>(qi) * p.n_heads + h0 + r;
    if (p.n_splits == 1 && !p.partial_only) {
      if (p.sinks != nullptr && c == 0) count_other(sizeof(float));
      p.out[head_row * d + c] = o / with_sink(l_all, m_all, p.sinks, h0 + r);
    } else {
      p.part_acc[(head_row * p.n_splits + split) * d + c] = o;
      if (c == 0) {
        p.part_ml[(head_row * p.n_splits + split) * 2 + 0] = m_all;  // −inf: no key in this split
        p.part_ml[(head_row * p.n_splits + split) * 2 + 1] = l_all;
        count_write(2 * sizeof(float));
      }
    }
    count_write(sizeof(float));
  }
}

// Bytes of attend_partial_kernel besides the KV rows and the position source's own reads:
// queries (every block loads its rows) and the outputs / partials.
inline AttnBytes attend_partial_fixed_bytes(int64_t n_q, int32_t n_heads, int32_t head_dim, int32_t n_splits,
                                            bool partial_only = false) {
  AttnBytes b;
  b.other_read = n_q * n_splits * n_heads * head_dim * 4;
  b.written = n_splits == 1 && !partial_only ? n_q * n_heads * head_dim * 4 : n_q * n_heads * n_splits * (head_dim + 2) * 4;
  return b;
}

struct MergeParams {
  const float* part_acc;      // [slots][head_dim]
  const float* part_ml;       // [slots][2]
  float* out;                 // [n_rows][head_dim]
  const int32_t* slot_begin;  // CSR [n_rows + 1] into slot_ids; null: row r owns slots r·n_splits ..
  const int32_t* slot_ids;
  int32_t n_splits, head_dim;
  // SparQ step 6 (alpha non-null): out = α·y + (1 − α)·v̄, v̄ = v_sum[tile of pos] / (pos + 1).
  const float* alpha;         // [n_rows]
  KvDev kv;
  int32_t pos, group;
  const float* sinks;  // [n_heads] attention sinks, or null: row r's is sinks[r % n_heads]
  int32_t n_heads;
};

// grid (n_rows), kThreads: out_r = Σ_s acc_s e^(m_s − M) / Σ_s l_s e^(m_s − M). A split without
// keys (m = −inf, acc = 0) weighs 0. Block-uniform reads (slot lists, m and l, α) are counted
// once per block (thread 0); each thread's own acc / v_sum elements are counted per element.
// __launch_bounds__(.., 1): without the min-blocks hint ptxas (sm_90) targets 32 registers here
// and spills 12 bytes; it needs ~47.
template <int kUnused = 0>
__global__ void __launch_bounds__(kThreads, 1) merge_kernel(MergeParams p) {
  const int r = static_cast<int>(blockIdx.x), d = p.head_dim;
  const bool counter = threadIdx.x == 0;
  int s_begin = r * p.n_splits, s_end = (r + 1) * p.n_splits;
  if (p.slot_begin != nullptr) {
    s_begin = p.slot_begin[r];
    s_end = p.slot_begin[r + 1];
    if (counter) count_other(2 * sizeof(int32_t));
  }
  float m_all = -INFINITY;
  for (int s = s_begin; s < s_end; ++s) {
    const int id = p.slot_ids != nullptr ? p.slot_ids[s] : s;
    if (counter) count_other(p.slot_ids != nullptr ? 2 * sizeof(float) + sizeof(int32_t) : 2 * sizeof(float));
    m_all = fmaxf(m_all, p.part_ml[2 * id]);
  }
  float l_all = 0.0f;
  for (int s = s_begin; s < s_end; ++s) {  // the same slots again: L1 hits, not counted
    const int id = p.slot_ids != nullptr ? p.slot_ids[s] : s;
    const float m = p.part_ml[2 * id];
    if (m != -INFINITY) l_all += p.part_ml[2 * id + 1] * expf(m - m_all);
  }
  if (p.sinks != nullptr && counter) count_other(sizeof(float));
  const float inv_l = 1.0f / with_sink(l_all, m_all, p.sinks, p.sinks != nullptr ? r % p.n_heads : 0);
  float alpha = 1.0f, inv_s = 0.0f;
  int64_t vbar_off = 0;
  const float* v_sum = p.kv.v_sum;
  if (p.alpha != nullptr) {
    alpha = p.alpha[r];
    const int32_t blk = p.kv.block_table[p.pos / p.kv.block_size];
    if (counter) count_other(sizeof(float) + sizeof(int32_t));
    vbar_off = (slot_of_entry(blk) * p.kv.n_kv_heads + r / p.group) * d;
    if (blk < 0) {
      v_sum = p.kv.host.v_sum;
      if (counter && p.kv.host_read != nullptr) atomicAdd(p.kv.host_read, static_cast<unsigned long long>(d) * 4);
    }
    inv_s = 1.0f / static_cast<float>(p.pos + 1);
  }
  for (int c = static_cast<int>(threadIdx.x); c < d; c += kThreads) {
    float o = 0.0f;
    for (int s = s_begin; s < s_end; ++s) {
      const int id = p.slot_ids != nullptr ? p.slot_ids[s] : s;
      const float m = p.part_ml[2 * id];
      count_other(sizeof(float));
      const float acc = p.part_acc[static_cast<int64_t>(id) * d + c];
      if (m != -INFINITY) o += acc * expf(m - m_all);
    }
    float y = o * inv_l;
    if (p.alpha != nullptr) {
      count_kv(sizeof(float));
      y = alpha * y + (1.0f - alpha) * (v_sum[vbar_off + c] * inv_s);
    }
    p.out[static_cast<int64_t>(r) * d + c] = y;
    count_write(sizeof(float));
  }
}

// Bytes of merge_kernel for n_rows rows of n_splits contiguous slots each (no CSR).
inline AttnBytes merge_bytes(int64_t n_rows, int32_t n_splits, int32_t head_dim, bool realloc) {
  AttnBytes b;
  b.other_read = n_rows * n_splits * (2 + head_dim) * 4 + (realloc ? n_rows * 8 : 0);
  b.kv_read = realloc ? n_rows * head_dim * 4 : 0;
  b.written = n_rows * head_dim * 4;
  return b;
}

// KV rows per CTA (kRows): a power of two covering the group, with kRows·kDpl <= 32 accumulators
// per lane (the register budget: no spills at 128 threads on sm_80 / sm_90).
inline int rows_per_cta(int group, int dims_per_lane) {
  const int cap = dims_per_lane >= 8 ? 4 : 8;
  if (group <= 1) return 1;
  return group <= 4 ? std::min(4, cap) : cap;
}
inline int dims_per_lane(int head_dim) { return head_dim <= 32 ? 1 : head_dim <= 64 ? 2 : head_dim <= 128 ? 4 : 8; }

template <typename T, int kDpl, typename Positions>
cudaError_t launch_attend_rows(int rows, const AttendParams& p, const Positions& pos, dim3 grid, cudaStream_t stream) {
  if constexpr (kDpl < 8) {
    if (rows == 8) {
      FATHOM_LAUNCH((attend_partial_kernel<T, kDpl, 8, Positions>), grid, dim3(kThreads), 0, stream, p, pos);
      return cudaGetLastError();
    }
  }
  if (rows == 4) {
    FATHOM_LAUNCH((attend_partial_kernel<T, kDpl, 4, Positions>), grid, dim3(kThreads), 0, stream, p, pos);
  } else {
    FATHOM_LAUNCH((attend_partial_kernel<T, kDpl, 1, Positions>), grid, dim3(kThreads), 0, stream, p, pos);
  }
  return cudaGetLastError();
}

template <typename T, typename Positions>
cudaError_t launch_attend_dims(int rows, const AttendParams& p, const Positions& pos, dim3 grid, cudaStream_t stream) {
  switch (dims_per_lane(p.kv.head_dim)) {
    case 1: return launch_attend_rows<T, 1>(rows, p, pos, grid, stream);
    case 2: return launch_attend_rows<T, 2>(rows, p, pos, grid, stream);
    case 4: return launch_attend_rows<T, 4>(rows, p, pos, grid, stream);
    default: return launch_attend_rows<T, 8>(rows, p, pos, grid, stream);
  }
}

// Launches attend_partial_kernel for p (head_tiles set from `rows`), grid (n_splits, n_kv·tiles, n_q).
template <typename Positions>
cudaError_t launch_attend(KvDtype dtype, int rows, AttendParams p, const Positions& pos, int n_q,
                          cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.n_splits), static_cast<unsigned>(p.kv.n_kv_heads * p.head_tiles),
                  static_cast<unsigned>(n_q));
  switch (dtype) {
    case KvDtype::kF32: return launch_attend_dims<float>(rows, p, pos, grid, stream);
    case KvDtype::kF16: return launch_attend_dims<__half>(rows, p, pos, grid, stream);
    case KvDtype::kI8: return launch_attend_dims<uint8_t>(rows, p, pos, grid, stream);
  }
  return cudaErrorInvalidValue;
}

// Block-wide helpers (blockDim.x a multiple of 32, <= 1024). scratch: shared, >= 33 elements.
__device__ __forceinline__ int block_exclusive_scan(int v, int* scratch, int* total) {
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  const int n_warps = static_cast<int>(blockDim.x) / 32;
  int x = v;
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(kFullMask, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) scratch[warp] = x;
  __syncthreads();
  if (warp == 0) {
    int w = lane < n_warps ? scratch[lane] : 0;
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(kFullMask, w, o);
      if (lane >= o) w += y;
    }
    scratch[lane] = w;
  }
  __syncthreads();
  const int result = (warp > 0 ? scratch[warp - 1] : 0) + x - v;
  *total = scratch[n_warps - 1];
  __syncthreads();
  return result;
}

// Float -> uint32 with the same order (larger float, larger key; -0 below +0).
__device__ __forceinline__ uint32_t ordered_key(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The k-th largest of the keys key_of(0..n) (1 <= k <= n), by a 4-pass 8-bit radix select from the
// top bits in one CTA (every thread calls it): returns that key; *ties_taken is how many keys equal
// to it are among the k largest. hist: shared [256]; prefix_s, need_s: shared scalars.
template <typename KeyOf>
__device__ uint32_t block_radix_select(KeyOf key_of, int n, int k, int* hist, uint32_t* prefix_s, int* need_s,
                                       int* ties_taken) {
  const int tid = static_cast<int>(threadIdx.x), threads = static_cast<int>(blockDim.x);
  if (tid == 0) {
    *prefix_s = 0;
    *need_s = k;
  }
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 24 - 8 * pass;
    const uint32_t hi_mask = pass == 0 ? 0u : (0xffffffffu << (shift + 8));
    for (int i = tid; i < 256; i += threads) hist[i] = 0;
    __syncthreads();
    const uint32_t prefix = *prefix_s;
    for (int t = tid; t < n; t += threads) {
      const uint32_t key = key_of(t);
      if ((key & hi_mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1);
    }
    __syncthreads();
    if (tid == 0) {
      int above = 0;
      for (int digit = 255; digit >= 0; --digit) {
        if (above + hist[digit] >= *need_s) {
          *prefix_s |= static_cast<uint32_t>(digit) << shift;
          *need_s -= above;
          break;
        }
        above += hist[digit];
      }
    }
    __syncthreads();
  }
  const uint32_t kth = *prefix_s;
  *ties_taken = *need_s;
  __syncthreads();  // the next use of the shared scalars comes after every thread read them
  return kth;
}

// After block_radix_select: writes to out[0..k), ascending, the indices i < n whose key is above
// kth, then — in index order — the first `ties` of those equal to it. Each thread takes a contiguous
// range of about n / blockDim indices, counts them, and after two block scans writes its range's
// picks from its own offset: two reads of each key and a fixed number of barriers whatever n
// (a scan per blockDim keys would be ~6 barriers each). scratch: shared, >= 33 ints.
template <typename KeyOf>
__device__ void block_select_ascending(KeyOf key_of, int n, uint32_t kth, int ties, int32_t* out, int* scratch) {
  const int tid = static_cast<int>(threadIdx.x), threads = static_cast<int>(blockDim.x);
  const int per = (n + threads - 1) / threads, b = min(n, tid * per), e = min(n, b + per);
  int above = 0, equal = 0;
  for (int i = b; i < e; ++i) {
    const uint32_t key = key_of(i);
    above += key > kth;
    equal += key == kth;
  }
  int total = 0;
  const int above_before = block_exclusive_scan(above, scratch, &total);
  int equal_seen = block_exclusive_scan(equal, scratch, &total);
  int slot = above_before + min(equal_seen, ties);
  for (int i = b; i < e; ++i) {
    const uint32_t key = key_of(i);
    if (key > kth || (key == kth && equal_seen++ < ties)) out[slot++] = i;
  }
}

__device__ __forceinline__ float block_reduce(float v, bool is_max, float* scratch) {
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  const int n_warps = static_cast<int>(blockDim.x) / 32;
  v = is_max ? warp_max(v) : warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float r = is_max ? -INFINITY : 0.0f;
  for (int w = 0; w < n_warps; ++w) r = is_max ? fmaxf(r, scratch[w]) : r + scratch[w];
  __syncthreads();
  return r;
}

}  // namespace attn_common
}  // namespace fathom::cuda
