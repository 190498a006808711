#pragma once
// Gated activations of the FFN on the device. Spec: cpu::silu_mul / cpu::gelu_tanh_mul
// (kernels/cpu/ops.h), same formulas.
#include <cstdint>

#include "kernels/cuda/emu/cuda_emu.h"

namespace fathom::cuda {

enum class GluKind { kSwiGlu, kGeGluTanh, kSwiGluOai };

// out[i] = act(gate[i]) * up[i] for n floats (device pointers; out may alias gate or up).
//   SwiGLU: act(g) = g / (1 + e^-g);  GeGLU: act(g) = g/2 · (1 + tanh(√(2/π)(g + 0.044715 g³)));
//   gpt-oss: out = (clamp(u, ±7) + 1) · g / (1 + e^(-1.702 g)) with g = min(gate, 7) (cpu::swiglu_oai_mul).
cudaError_t glu(GluKind kind, const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream);

}  // namespace fathom::cuda
