// SWA's attention mass on the device (contract: kernels/cuda/swa_mass.h).
#include "kernels/cuda/swa_mass.h"

#include <algorithm>

#include "kernels/cuda/attention_common.h"

namespace fathom::cuda {
namespace swa_mass_detail {  // named: the kernels' names stay unique across the .cu files

using namespace attn_common;

constexpr int kSelectThreads = 256;
constexpr int kFoldThreads = 256;

struct SelectParams {
  const float* mass;  // [n]
  float* ahead;       // [n] workspace: max from the start of t's segment to t
  float* behind;      // [n] workspace: max from t to the end of its segment
  float* pooled;      // [n] workspace
  int32_t* kept;      // [k_global + k_local]
  int32_t n, radius, k_local, k_global;
};

// grid (1), kSelectThreads. Pooling by van Herk / Gil-Werman: segments of w = 2·radius + 1
// positions; a window of at most w positions lies in one segment or two neighbours, so its max is
// behind[lo] ∪ ahead[hi] (max is exact: any order gives the host's values).
__global__ void __launch_bounds__(kSelectThreads) swa_select_kernel(SelectParams p) {
  __shared__ int hist[256];
  __shared__ int scratch[40];
  __shared__ uint32_t prefix_s;
  __shared__ int need_s;
  const int tid = static_cast<int>(threadIdx.x), threads = static_cast<int>(blockDim.x);
  const int n = p.n, older = n - p.k_local, r = p.radius;
  const float* score = p.mass;
  if (r > 0 && p.k_global > 0 && p.k_global < older) {
    const int w = 2 * r + 1, n_seg = (n + w - 1) / w;
    for (int s = tid; s < n_seg; s += threads) {
      const int b = s * w, e = min(n, b + w);
      float run = p.mass[b];
      for (int i = b; i < e; ++i) p.ahead[i] = run = fmaxf(run, p.mass[i]);
      run = p.mass[e - 1];
      for (int i = e - 1; i >= b; --i) p.behind[i] = run = fmaxf(run, p.mass[i]);
    }
    __syncthreads();
    for (int t = tid; t < older; t += threads) {
      const int lo = max(0, t - r), hi = min(n - 1, t + r), seg_lo = lo / w, seg_hi = hi / w;
      // Within one segment a window starts at the segment's start (a full window, or one cut by
      // position 0) or ends at the segment's end (cut by n − 1, the last segment's end).
      p.pooled[t] = seg_lo != seg_hi    ? fmaxf(p.behind[lo], p.ahead[hi])
                    : lo == seg_lo * w ? p.ahead[hi]
                                       : p.behind[lo];
    }
    __syncthreads();
    score = p.pooled;
  }
  if (p.k_global == older) {  // every older position
    for (int t = tid; t < older; t += threads) p.kept[t] = t;
  } else if (p.k_global > 0) {
    int need = 0;
    auto key_of = [&](int t) { return ordered_key(score[t]); };
    const uint32_t kth = block_radix_select(key_of, older, p.k_global, hist, &prefix_s, &need_s, &need);
    block_select_ascending(key_of, older, kth, need, p.kept, scratch);
  }
  for (int i = tid; i < p.k_local; i += threads) p.kept[p.k_global + i] = older + i;
}

// grid (⌈n / kFoldThreads⌉), kFoldThreads: mass[t] *= keep.
__global__ void __launch_bounds__(kFoldThreads) swa_scale_kernel(float* mass, int32_t n, float keep) {
  const int t = static_cast<int>(blockIdx.x) * kFoldThreads + static_cast<int>(threadIdx.x);
  if (t < n) mass[t] = mass[t] * keep;
}

// grid (⌈n_kept / kFoldThreads⌉), kFoldThreads: mass[kept[i]] += weights[i] (kept distinct).
__global__ void __launch_bounds__(kFoldThreads) swa_add_kernel(float* mass, const int32_t* kept, const float* weights,
                                                               int32_t n_kept) {
  const int i = static_cast<int>(blockIdx.x) * kFoldThreads + static_cast<int>(threadIdx.x);
  if (i < n_kept) mass[kept[i]] = mass[kept[i]] + weights[i];
}

}  // namespace swa_mass_detail

size_t swa_select_workspace_floats(int32_t n) { return 3 * static_cast<size_t>(std::max(n, 1)); }

cudaError_t swa_select(const float* mass, int32_t n, int32_t radius, int32_t k_local, int32_t k_global,
                       float* workspace, int32_t* kept, cudaStream_t stream) {
  using namespace swa_mass_detail;
  if (mass == nullptr || workspace == nullptr || kept == nullptr || n < 1 || radius < 0 || k_local < 1 ||
      k_local > n || k_global < 0 || k_global > n - k_local)
    return cudaErrorInvalidValue;
  const size_t nn = static_cast<size_t>(n);
  const SelectParams p{mass, workspace, workspace + nn, workspace + 2 * nn, kept, n, std::min(radius, n), k_local, k_global};
  FATHOM_LAUNCH(swa_select_kernel, dim3(1), dim3(kSelectThreads), 0, stream, p);
  return cudaGetLastError();
}

cudaError_t swa_fold(float* mass, int32_t n, float keep, const int32_t* kept, const float* weights, int32_t n_kept,
                     cudaStream_t stream) {
  using namespace swa_mass_detail;
  if (mass == nullptr || n < 1 || n_kept < 0 || (n_kept > 0 && (kept == nullptr || weights == nullptr)))
    return cudaErrorInvalidValue;
  FATHOM_LAUNCH(swa_scale_kernel, dim3(static_cast<unsigned>((n + kFoldThreads - 1) / kFoldThreads)), dim3(kFoldThreads),
                0, stream, mass, n, keep);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || n_kept == 0) return err;
  FATHOM_LAUNCH(swa_add_kernel, dim3(static_cast<unsigned>((n_kept + kFoldThreads - 1) / kFoldThreads)),
                dim3(kFoldThreads), 0, stream, mass, kept, weights, n_kept);
  return cudaGetLastError();
}

}  // namespace fathom::cuda
