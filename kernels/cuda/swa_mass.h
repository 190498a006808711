#pragma once
// SWA's attention mass kept on the device (ALGORITHMS.md "ALISA"). The host versions, which these
// equal bit for bit: swa_selection_mass + ref::swa_select (the choice), swa_fold_mass (the fold),
// engine/attention/decode_attention.h. With the mass on the device a decode step chooses each
// layer's kept positions, attends them (swa_attention.h) and folds the step's weights back without
// a copy to or from the host: the host never waits on the device inside a step.
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/emu/cuda_emu.h"

namespace fathom::cuda {

// Floats of workspace swa_select needs at n keys.
size_t swa_select_workspace_floats(int32_t n);

// mass: device [n], n >= 1. The pooled mass is pooled[t] = max(mass[max(0, t − radius) ..
// min(n − 1, t + radius)]) (cpu::max_pool; radius 0: the mass itself). Writes kept (device
// [k_global + k_local], ascending): the k_global positions of [0, n − k_local) with the largest
// pooled mass (ties: the lower position), then [n − k_local, n). 1 <= k_local <= n,
// 0 <= k_global <= n − k_local. One CTA; O(n) whatever the radius.
cudaError_t swa_select(const float* mass, int32_t n, int32_t radius, int32_t k_local, int32_t k_global,
                       float* workspace, int32_t* kept, cudaStream_t stream);

// mass[t] *= keep for t < n, then mass[kept[i]] += weights[i] for i < n_kept (kept distinct, < n).
cudaError_t swa_fold(float* mass, int32_t n, float keep, const int32_t* kept, const float* weights, int32_t n_kept,
                     cudaStream_t stream);

}  // namespace fathom::cuda
