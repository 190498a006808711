#pragma once
// Scalar reference of the partial attention state of a key subset and its exact merge: the
// building block of split-K, bifurcated and every sparse decode policy (ALGORITHMS.md,
// "Partial-state merge"). Also the shared decode argument struct of the sparse policies.
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/paged_kv.h"

namespace fathom::ref {

// One decode query per sequence (kernels/paged_kv.h). Every sparse policy in kernels/ref takes this.
using fathom::DecodeArgs;

// Attention of one query row over a key subset P: o = Σ_{t∈P} softmax(logit)_t · V[t]
// (normalised over P), m = max logit, s = m + ln Σ exp(logit − m) (log-sum-exp).
// The empty subset is o = 0, m = s = −inf.
struct AttentionState {
  std::vector<float> o;  // [head_dim]
  float m = -INFINITY;
  float s = -INFINITY;
};

AttentionState empty_state(int32_t head_dim);

// Exact merge (ALGORITHMS.md): w_x = exp(s_x − max(s_a, s_b)), o = (w_a·o_a + w_b·o_b) /
// (w_a + w_b), s = s_max + ln(w_a + w_b). An empty operand returns the other one unchanged
// (the guard: −inf − −inf would be NaN).
AttentionState merge_states(const AttentionState& a, const AttentionState& b);

// Row `t` (absolute position) of kv head `kv_head` of `base` (kv.k or kv.v) as f32: dst [head_dim].
void load_kv_row(const PagedKvView& kv, const void* base, int32_t t, int32_t kv_head, float* dst);

// Partial attention of `n_rows` query rows that share kv head `kv_head` over the positions
// `positions[0..n)` (any order, no duplicates). Each K and V row is read once for all query
// rows (the small [n_rows, d] × [d, n] GEMM of bifurcated attention). Softmax in double; a soft
// cap (scale.cap > 0) as cap·tanh(logit / cap) in double.
//   q:      [n_rows][head_dim] f32
//   states: [n_rows] outputs
// Returns the KV bytes read: 2 · n · head_dim · element size.
int64_t partial_attention(const PagedKvView& kv, int32_t kv_head, const float* q, int32_t n_rows,
                          LogitScale scale, const int32_t* positions, int64_t n, AttentionState* states);

// (q·k)·scale, soft-capped when scale.cap > 0, in double: the reference kernels' logit.
inline double reference_logit(double dot, const LogitScale& scale) {
  const double x = dot * scale.scale;
  return scale.cap > 0.0f ? scale.cap * std::tanh(x / scale.cap) : x;
}

// [begin, end) as a position list.
std::vector<int32_t> position_range(int32_t begin, int32_t end);

}  // namespace fathom::ref
