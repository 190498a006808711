#pragma once
// Rotary position embedding on the device. Spec: cpu::rope_apply (kernels/cpu/ops.h) with the
// cos/sin rows of cpu::rope_table, same pairing and formula.
#include <cstdint>

#include "kernels/cuda/emu/cuda_emu.h"

namespace fathom::cuda {

// Rotates, in place, the first rope_dim dims of every head of x for n_tokens tokens; token t is
// at position pos[t] and reads row pos[t] of the angle cache.
//   x:        token t, head h starts at x + t * token_stride + h * head_dim (f32); token_stride
//             >= n_heads * head_dim lets one call rotate Q or K inside a fused QKV buffer
//   pos:      [n_tokens] int32, each in [0, cache_rows)
//   cos_cache, sin_cache: [cache_rows][rope_dim / 2] f32, row p = cpu::rope_table at position p
//             (built once per rotation config on the host, in double, then uploaded); the table
//             carries the model's RoPE scaling (scaled frequencies, YaRN's factor on cos and sin),
//             so one kernel serves every scaling type
//   neox:     pairs (i, i + rope_dim/2); otherwise adjacent pairs (2i, 2i+1)
// rope_dim even, 2 <= rope_dim <= head_dim. Returns cudaErrorInvalidValue on bad shapes.
cudaError_t rope(float* x, const int32_t* pos, int64_t n_tokens, int64_t token_stride, int32_t n_heads,
                 int32_t head_dim, int32_t rope_dim, bool neox, const float* cos_cache, const float* sin_cache,
                 cudaStream_t stream);

}  // namespace fathom::cuda
