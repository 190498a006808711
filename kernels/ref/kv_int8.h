#pragma once
// Scalar reference of ALISA's INT8 KV quantization (ALGORITHMS.md), asymmetric per token group:
// λ = (max − min)/255, zero point z = −min/λ, x_q = round(x/λ + z) ∈ [0, 255], x ≈ λ·(x_q − z).
// Groups are `group_size` consecutive elements (e.g. one token's head_dim row, or a part of it).
#include <cstdint>

namespace fathom::ref {

// Per-group parameters. The zero point is kept as the offset `min` = −λ·z: dequantizing as
// λ·x_q + min is the same value without the cancellation of λ·(x_q − z) when |z| is large.
struct Int8Group {
  float scale = 0.0f;  // λ; 0 for a constant group (every x_q = 0, x = min exactly)
  float min = 0.0f;    // −λ·z
};

// x: [n] f32 → q: [n] uint8, groups: [⌈n / group_size⌉]. The last group may be shorter.
// Round trip error |x − dequant(q)| ≤ λ/2 per element (plus f32 rounding of λ·x_q + min).
void kv_int8_quantize(const float* x, int64_t n, int32_t group_size, uint8_t* q, Int8Group* groups);

// q: [n] uint8, groups as above → x: [n] f32.
void kv_int8_dequantize(const uint8_t* q, const Int8Group* groups, int64_t n, int32_t group_size, float* x);

// Storage bytes of n elements: n + ⌈n / group_size⌉ · sizeof(Int8Group) — what a kernel reads.
int64_t kv_int8_bytes(int64_t n, int32_t group_size);

}  // namespace fathom::ref
