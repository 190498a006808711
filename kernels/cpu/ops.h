#pragma once
// Element-wise and row-wise ops of the forward pass (cheap next to the matmuls and attention:
// plain loops the compiler vectorises). The formulas are the specification; ref == cpu here.
#include <cstdint>

#include "base/kv_dtype.h"

namespace fathom::cpu {

// y[r][:] = x[r][:] / sqrt(mean(x[r]^2) + eps) * w, for `rows` rows of n. In-place allowed.
void rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps);

// RoPE angle table for one rotation config: cos/sin [n_tokens][rope_dim / 2],
// cos_out[t][i] = mscale * cos(pos[t] * inv_freq[i]) (sin alike); inv_freq: (rope_dim / 2) radians
// per position, scaling already applied (engine/model/rope_scaling.h); the angle in double.
void rope_table(const int32_t* pos, int64_t n_tokens, int32_t rope_dim, const double* inv_freq, float mscale,
                float* cos_out, float* sin_out);
// Unscaled RoPE with linear position scaling: inv_freq[i] = base^(-2i / rope_dim) / scale, mscale 1.
void rope_table(const int32_t* pos, int64_t n_tokens, int32_t rope_dim, float base, float scale, float* cos_out,
                float* sin_out);
// Rotates the first rope_dim dims of each head of x: [n_tokens][n_heads][head_dim].
// neox: pairs (i, i + rope_dim/2); otherwise adjacent pairs (2i, 2i+1).
void rope_apply(float* x, int64_t n_tokens, int32_t n_heads, int32_t head_dim, int32_t rope_dim, bool neox,
                const float* cos_t, const float* sin_t);

// gate[i] = act(gate[i]) * up[i] for n elements: SwiGLU (silu) or GeGLU (tanh-approximated gelu).
void silu_mul(float* gate, const float* up, int64_t n);
void gelu_tanh_mul(float* gate, const float* up, int64_t n);
// gpt-oss's clamped SwiGLU: g = min(gate, 7), u = clamp(up, -7, 7), gate[i] = (u + 1) · g·σ(1.702·g).
// Scalar (an MoE's expert rows are a small part of a step).
void swiglu_oai_mul(float* gate, const float* up, int64_t n);

// Softmax pieces over a vocabulary (the sampler): x[i] = exp((x[i] - shift) * scale), returning
// the sum in double; and the sum of exp(x[i] - shift) without writing. Arguments must be <= 0
// (shift = the max); -inf gives 0. AVX-512: a polynomial exp (~2 ulp), 0 below e^-87.5.
double exp_scaled_inplace(float* x, int64_t n, float shift, float scale);
double sum_exp(const float* x, int64_t n, float shift);

void add_inplace(float* y, const float* x, int64_t n);  // y += x
void scale_inplace(float* y, float alpha, int64_t n);   // y *= alpha

// dst[t] = max(src[max(0, t − r) .. min(n − 1, t + r)]): a sliding max with the window clipped to
// the array (SWA's pooled mass, engine/attention). Exact at every level for non-NaN input (only
// comparisons).
void max_pool(const float* src, int32_t n, int32_t r, float* dst);

// Stores n f32 values into KV storage of type `dtype` (f16: round to nearest even).
// f32 / f16 only (INT8 needs its row parameters: kv_store_int8_row).
void kv_store(const float* src, void* dst, KvDtype dtype, int64_t n);

// One INT8 KV row (ALISA, asymmetric): scale = (max − min)/255, min = min(src),
// dst[i] = round((src[i] − min)/scale) ∈ [0, 255]; a constant row stores scale 0 and zeros.
void kv_store_int8_row(const float* src, int64_t n, uint8_t* dst, KvInt8Row* row);

}  // namespace fathom::cpu
