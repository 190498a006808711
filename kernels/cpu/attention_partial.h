#pragma once
// The per-ISA inner kernel of kernels/cpu/attention.cpp.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/paged_kv.h"
#include "kernels/ref/bifurcated.h"

namespace fathom::cpu {

// Where the calling thread goes next: kv head `head` of `kv` from key `lo` (keys up to `hi`,
// inclusive, are written). A kernel may prefetch those first keys during its own last ones, so
// that its next call does not start on a cold burst; only a hint (no arithmetic depends on it).
struct NextPartial {
  const PagedKvView* kv = nullptr;
  int32_t head = 0, lo = 0, hi = -1;
};

// R query rows that share one kv head; row r attends keys [lo[r], hi[r]] (inclusive),
// intersected with the work item's key range [t0, t1).
struct PartialRows {
  int32_t count = 0;
  const float* const* q = nullptr;  // [R] -> [head_dim]
  const int32_t* lo = nullptr;      // [R]
  const int32_t* hi = nullptr;      // [R]
  NextPartial next;                 // the caller's next call (kv null: none known)
};

// The start of every partial kernel: each row's state empty (m = -inf, l = 0, acc[R][d] = 0),
// and the union of the rows' key ranges clipped to [t0, t1) — [lo, hi], empty when hi < lo.
struct KeyRange {
  int32_t lo, hi;
};
inline KeyRange start_partial(const PartialRows& rows, int32_t t0, int32_t t1, int32_t d, float* acc, float* m,
                              float* l) {
  KeyRange u{t1, t0 - 1};
  for (int32_t r = 0; r < rows.count; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
    std::fill(acc + static_cast<int64_t>(r) * d, acc + static_cast<int64_t>(r + 1) * d, 0.0f);
    u.lo = std::min(u.lo, std::max(t0, rows.lo[r]));
    u.hi = std::max(u.hi, std::min(t1 - 1, rows.hi[r]));
  }
  return u;
}

// Online softmax over keys [t0, t1) of kv head `head`. Outputs per row: acc[r][head_dim]
// (unnormalised Σ p·v), m[r] (max logit, -inf if the row saw no key), l[r] (Σ exp(logit - m)).
// scratch: at least 2·block_size·head_dim + block_size floats.
using PartialAttentionFn = void (*)(const PagedKvView& kv, int32_t head, const PartialRows& rows, int32_t t0,
                                    int32_t t1, LogitScale scale, float* acc, float* m, float* l, float* scratch);

PartialAttentionFn partial_attention_portable();
// nullptr when this CPU lacks the ISA.
PartialAttentionFn partial_attention_avx2();
PartialAttentionFn partial_attention_avx512();
// For many rows that all attend the same key range (bifurcated attention's shared segments):
// rows in the SIMD lanes, a small GEMM per 16-key sub-tile. Same contract as PartialAttentionFn
// plus that precondition; scratch is unused. nullptr when this CPU lacks AVX-512.
PartialAttentionFn partial_attention_rows_avx512();
// The same on AMX tiles (bf16x3 products, f32 accumulation; attention_rows_amx.cpp) for f16 and
// INT8 KV with the transposed-K plane, head_dim a multiple of 64; other KV goes to the AVX-512 Kᵀ
// kernel (plane present) or rows GEMM.
// nullptr when the CPU or the OS does not offer AMX.
PartialAttentionFn partial_attention_rows_amx();

// The widest variant this CPU (and simd_level()) allows: what cpu::paged_attention uses.
PartialAttentionFn best_partial_attention();

// AVX-512 kernel reading logits from the transposed K plane (attention_kt_avx512.cpp); the
// AVX-512 partial_attention uses it whenever it applies (k_t present, head_dim and block_size
// multiples of 16).
bool partial_attention_kt_applies(const PagedKvView& kv);
void partial_attention_kt_avx512(const PagedKvView& kv, int32_t head, const PartialRows& rows, int32_t t0, int32_t t1,
                                 LogitScale scale, float* acc, float* m, float* l, float* scratch);
// The same, also writing each row's scaled logits of the keys it attends: row r, key j to
// logits[r·ld + j − t0] (other entries untouched). What a sparse policy that gathers a contiguous
// run of keys uses to stream it (sparse::AttendTask's run) and still learn its attention weights.
void partial_attention_kt_logits_avx512(const PagedKvView& kv, int32_t head, const PartialRows& rows, int32_t t0,
                                        int32_t t1, LogitScale scale, float* acc, float* m, float* l, float* logits,
                                        int64_t ld);

// The same two on AVX2 + FMA + F16C (attention_kt_avx2.cpp: 8-key vectors, 32-key super-tiles).
void partial_attention_kt_avx2(const PagedKvView& kv, int32_t head, const PartialRows& rows, int32_t t0, int32_t t1,
                               LogitScale scale, float* acc, float* m, float* l, float* scratch);
void partial_attention_kt_logits_avx2(const PagedKvView& kv, int32_t head, const PartialRows& rows, int32_t t0,
                                      int32_t t1, LogitScale scale, float* acc, float* m, float* l, float* logits,
                                      int64_t ld);

// Keys per split-K chunk (rounded up to whole blocks). Chunks start at absolute multiples of it, so
// where a row's keys are cut never depends on the batch or the thread count.
constexpr int32_t kKeyChunk = 256;

// Running softmax state of one row: the kernel's (acc, m, l) form of ALGORITHMS.md's partial
// state (o = acc / l, s = m + ln l).
struct RowState {
  float* acc;  // [head_dim], unnormalised
  float m;     // max logit, -inf before any key
  float l;     // Σ exp(logit - m)
};

// Exact merge of one chunk's partial (acc_c, m_c, l_c) into s. Partials must be folded in a fixed
// order (chunk order) for results to be bitwise reproducible. A chunk that held no key of the row
// (m_c = -inf) is the identity: the guard keeps -inf - -inf from making NaN.
inline void fold_partial(RowState& s, const float* acc_c, float m_c, float l_c, int32_t d) {
  if (m_c == -INFINITY) return;
  if (s.m == -INFINITY) {
    std::copy(acc_c, acc_c + d, s.acc);
    s.m = m_c;
    s.l = l_c;
    return;
  }
  const float m = std::max(s.m, m_c);
  const float a = std::exp(s.m - m), b = std::exp(m_c - m);
  for (int32_t x = 0; x < d; ++x) s.acc[x] = s.acc[x] * a + acc_c[x] * b;
  s.l = s.l * a + l_c * b;
  s.m = m;
}

// cpu::paged_attention with an explicit inner kernel (tests run every ISA variant).
void paged_attention_with(PartialAttentionFn kernel, ThreadPool& pool, const PagedKvView& kv, const AttentionArgs& args);

// cpu::bifurcated_decode (kernels/cpu/sparse_attention.h) with explicit inner kernels: `kernel`
// for passes of up to kManyRows rows, `many_rows` (same-range rows; nullptr: `kernel`) above.
constexpr int32_t kManyRows = 8;
int64_t bifurcated_decode_with(PartialAttentionFn kernel, PartialAttentionFn many_rows, ThreadPool& pool,
                               const std::vector<ref::SharedSegment>& segments, const PagedKvView* seq_kv,
                               const DecodeArgs* seq_args, int32_t n_seqs, const ChunkSourceFor& source_for = {});

}  // namespace fathom::cpu
