// Gated activation (SwiGLU / GeGLU-tanh): purely bandwidth bound (12 bytes per element), so a
// grid-stride loop of float4 loads (4 elements per thread per step) and a scalar tail. Launch:
// grid min(ceil(n / (4·256)), 4096), block 256.
#include "kernels/cuda/activation.h"

namespace fathom::cuda {
namespace activation_detail {  // named: the kernels' names stay unique across the .cu files

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;

__device__ __forceinline__ float silu(float g) { return g / (1.0f + expf(-g)); }
__device__ __forceinline__ float gelu_tanh(float g) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  return 0.5f * g * (1.0f + tanhf(kSqrt2OverPi * (g + 0.044715f * g * g * g)));
}

// act(gate) · up, or gpt-oss's clamped form.
template <GluKind kKind>
__device__ __forceinline__ float gated(float g, float u) {
  if (kKind == GluKind::kSwiGluOai) {
    constexpr float kAlpha = 1.702f, kLimit = 7.0f;
    g = fminf(g, kLimit);
    u = fminf(fmaxf(u, -kLimit), kLimit);
    return (u + 1.0f) * (g / (1.0f + expf(-kAlpha * g)));
  }
  return (kKind == GluKind::kSwiGlu ? silu(g) : gelu_tanh(g)) * u;
}

// grid (blocks), block (kThreads). `vec4`: all three pointers 16-byte aligned.
template <GluKind kKind>
__global__ void __launch_bounds__(kThreads) glu_kernel(const float* gate, const float* up, float* out, int64_t n,
                                                       bool vec4) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  int64_t done = 0;
  if (vec4) {
    const int64_t n4 = n / 4;
    for (int64_t i = tid; i < n4; i += stride) {
      const float4 g = reinterpret_cast<const float4*>(gate)[i];
      const float4 u = reinterpret_cast<const float4*>(up)[i];
      reinterpret_cast<float4*>(out)[i] =
          make_float4(gated<kKind>(g.x, u.x), gated<kKind>(g.y, u.y), gated<kKind>(g.z, u.z), gated<kKind>(g.w, u.w));
    }
    done = n4 * 4;
  }
  for (int64_t i = done + tid; i < n; i += stride) out[i] = gated<kKind>(gate[i], up[i]);
}

}  // namespace activation_detail

cudaError_t glu(GluKind kind, const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream) {
  using namespace activation_detail;
  if (n <= 0) return n == 0 ? cudaSuccess : cudaErrorInvalidValue;
  const auto aligned = [](const float* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool vec4 = aligned(gate) && aligned(up) && aligned(out);
  int64_t blocks = (n / 4 + kThreads - 1) / kThreads;
  blocks = blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks);
  const dim3 grid(static_cast<unsigned>(blocks));
  switch (kind) {
    case GluKind::kSwiGlu:
      FATHOM_LAUNCH(glu_kernel<GluKind::kSwiGlu>, grid, dim3(kThreads), 0, stream, gate, up, out, n, vec4);
      break;
    case GluKind::kGeGluTanh:
      FATHOM_LAUNCH(glu_kernel<GluKind::kGeGluTanh>, grid, dim3(kThreads), 0, stream, gate, up, out, n, vec4);
      break;
    case GluKind::kSwiGluOai:
      FATHOM_LAUNCH(glu_kernel<GluKind::kSwiGluOai>, grid, dim3(kThreads), 0, stream, gate, up, out, n, vec4);
      break;
  }
  return cudaGetLastError();
}

}  // namespace fathom::cuda
