#pragma once
// Top-k / top-p (nucleus) sampling with temperature over rows of logits on the device, given
// one uniform number per row from the host. The CPU twin of the exact rule below is
// `sample_reference` in tests/kernel/test_backend_ops.cpp; the engine's Sampler (engine/sampler.h)
// picks tokens by the same filters but walks its candidates in another order, so for the same
// uniform number the two may pick different (equally distributed) tokens.
#include <cstdint>

#include "kernels/cuda/emu/cuda_emu.h"

namespace fathom::cuda {

struct SampleParams {
  float temperature = 1.0f;  // < 1e-5 (0 included): greedy
  int32_t top_k = 0;         // 0 or >= vocab: off; 1: greedy
  float top_p = 1.0f;        // in (0, 1]; >= 1: off
  int32_t pad = 0;
  double uniform = 0.0;      // in [0, 1), drawn by the host
};

// The rule, per row of `vocab` logits (NaN counts as -inf):
//   order tokens by (logit desc, id asc) — exactly: by the order-preserving 32-bit key of the
//   logit (so -0 ranks just below +0), then lowest id first;
//   greedy (see SampleParams) or a non-finite max logit M: the first token of that order;
//   weight w_i = trunc(expf((x_i − M) · (1/T)) · 2^32), an integer (32.32 fixed point, the
//   best token weighs 2^32), so every sum below is exact and order-independent;
//   C = the first top_k tokens of the order (all when top_k is off);
//   top_p < 1: F = the shortest prefix of C (same order) whose weight reaches
//   target = max(1, trunc(top_p · (1 − 1e-6) · Σ_C w)) (the slack keeps a nucleus whose exact
//   mass equals top_p from growing by a token through rounding, as engine/sampler.cpp); else F = C;
//   r = min(trunc(uniform · Σ_F w), Σ_F w − 1); the token is the first of F *in id order* whose
//   running weight sum exceeds r.
//   logits: [rows][row_stride] f32 (row_stride >= vocab); params: [rows]; out: [rows] token ids.
// Device pointers. vocab in [1, 2^31 − 1); rows < 2^31.
cudaError_t sample_top_k_top_p(const float* logits, int64_t row_stride, int32_t vocab, int32_t rows,
                               const SampleParams* params, int32_t* out, cudaStream_t stream);

}  // namespace fathom::cuda
