#pragma once
// RMSNorm on the device. Spec: cpu::rms_norm (kernels/cpu/ops.h), same formula and epsilon.
#include <cstdint>

#include "kernels/cuda/emu/cuda_emu.h"

namespace fathom::cuda {

// y[r][:] = x[r][:] * rsqrt(mean(x[r]^2) + eps) * w, for `rows` rows of n floats (device
// pointers; in-place allowed). One block per row. Returns the launch status.
//   x, y: [rows][n]   w: [n]
cudaError_t rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps,
                     cudaStream_t stream);

}  // namespace fathom::cuda
