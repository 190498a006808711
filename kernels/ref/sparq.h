#pragma once
// Scalar reference of SparQ decode attention (ALGORITHMS.md, all six steps), one query per
// sequence over the paged KV cache. Prefill stays dense.
#include <cstdint>
#include <vector>

#include "kernels/ref/attention_state.h"

namespace fathom::ref {

struct SparqParams {
  int32_t k = 128;             // positions gathered per kv head (step 3)
  int32_t l = -1;              // forced local window (last l positions); −1: k/4
  int32_t r = -1;              // query components per kv head group (step 1); −1: head_dim/8
  bool reallocation = true;    // step 6: out = α·y + (1−α)·v̄; off: out = y
};

// The `compression` convenience: (r, k, l) for a target KV-read ratio c ≈ M_sparq / M_dense
// (transfer model: M_sparq = S·r + 2·k·d + 4·d, M_dense = 2·S·d + 2·d) at S keys, half the budget
// to each step: r/(2d) = c/2 (r = d·c: the reference default r = d/8 at c = 1/8) and k/S = c/2,
// but k never below the reference default kSparqMinK = 128 (or S); l = k/4.
// Why not the paper's llama.cpp split (r ≈ d/12, k ≈ S/12): on Gemma 3 (d = 256, one kv head)
// its passkey retrieval at 1/8 was 0/20, 3/20, 0/15 at 1k, 2k, 4k where dense succeeds; this
// split gives 12/20 and 13/20 at 1k and 2k, still only 4/20 at 4k (eval/results/passkey.md).
// Below S = 2048 at c = 1/8 the floor makes a step read more than c.
inline constexpr int32_t kSparqMinK = 128;
SparqParams sparq_params_for_ratio(double c, int32_t S, int32_t head_dim, bool reallocation = true);

struct SparqStats {
  int64_t kv_bytes = 0;                        // KV bytes read, see sparq_attention
  int32_t r = 0, k = 0, l = 0;                 // the values used (after defaults and clamping to S)
  std::vector<std::vector<int32_t>> selected;  // [n_kv_heads] I2, ascending positions
  std::vector<float> alpha;                    // [n_heads] α_h (step 4)
};

// SparQ for one decode query (S = pos + 1 keys):
//  1. a = Σ_{h∈group} |q_h|; I1 = top-r components of a (ties: lower index).
//  2. ŝ_h[t] = q_h[I1]·K[t, I1] · scale · √(‖q_h‖₁ / ‖q_h[I1]‖₁) — with scale = 1/√d this is
//     division by τ_h = √(d·‖q_h[I1]‖₁/‖q_h‖₁).
//  3. the last max(l, 1) positions (which include the current token) carry an explicit forced
//     flag; the rest are ranked by Σ_{h∈group} ŝ_h (ties: lower position); I2 = forced ∪ the best
//     k − |forced|. With k ≥ S, I2 is every position.
//  4. α_h = Σ_{t∈I2} softmax(ŝ_h)[t] (softmax over all S positions).
//  5. y_h = exact softmax(q_h·K[I2]ᵀ·scale)·V[I2].
//  6. out_h = α_h·y_h + (1 − α_h)·v̄, v̄ = mean of V over [0, pos]; reallocation off: y_h.
// v_mean: [n_kv_heads][head_dim] f32 running mean kept by the cache, or nullptr to compute it
// here from V. Bytes read per kv head, as implemented: S·r (step 2) + 2·|I2|·d (step 5), plus
// for reallocation d·4 (v_mean given, f32) or S·d (v̄ computed here), each · element size.
// key_spread (nullable, [n_kv_heads][head_dim], see sparq_key_spread): step 1 weighs each
// component by the square root of the keys' spread along it, a[c] = Σ_h |q_h[c]|·√σ[c], and step
// 2's correction uses the same weights, √(Σ_c |q_h[c]|·√σ[c] / Σ_{c∈I1} |q_h[c]|·√σ[c]); the
// scores themselves are unchanged. This is SparQ on keys scaled to k[c]/√σ[c] with the query
// scaled inversely (q[c]·√σ[c]), which leaves every q·k as it is. The paper's rule assumes
// components of similar spread; a large query component along which the keys barely vary moves
// no key's rank. Full whitening (weights σ) helped Gemma 3 as much but lost needle mass on
// SmolLM2, whose rare keys stand out along low-spread components; √σ kept Gemma 3's gain and
// did not lose on SmolLM2 (eval/results/sparq_key_spread.md).
SparqStats sparq_attention(const PagedKvView& kv, const DecodeArgs& args, const SparqParams& params,
                           const float* v_mean = nullptr, const float* key_spread = nullptr);

// σ[g][c]: the standard deviation of component c of kv head g's keys over positions [0, S)
// (population, about their mean), f64 sums; [n_kv_heads][head_dim].
std::vector<float> sparq_key_spread(const PagedKvView& kv, int32_t S);
// The same from the cache's running moments (kv.k_moments, required) at position S − 1: what the
// engine serves, f32 Welford sums of the keys as appended (before the cache's rounding to its
// dtype); equal to sparq_key_spread up to that rounding and f32 summation.
std::vector<float> sparq_key_spread_of_moments(const PagedKvView& kv, int32_t S);

}  // namespace fathom::ref
