#pragma once
// The CUDA forward backend (engine/backend/cuda_backend.cu): the model's weights, activations
// and paged KV (f16) on the device, the whole forward pass of a BatchPlan as CUDA kernels.
//
// Weights: Q8_0 / Q4_K / Q6_K matrices are uploaded as stored and read by quant_gemv for
// decode-sized batches (<= 16 rows, in launches of up to 4); larger batches (prefill)
// dequantize row chunks to f16 on the device (embedding_lookup + convert) and run gemm_f16
// (cuBLAS under nvcc). Every other format (F32, F16, BF16, Q4_0, Q4_1, Q5_0, ...) has no CUDA
// GEMV: it is dequantized to f16 once at load and always goes through gemm_f16 (activations
// converted to f16 per matmul, f32 accumulation). Norm weights and biases stay f32.
// Attention: dense only — paged_decode_attention for decode tokens and prefill chunks alike
// (a causal key range per query). BatchPlan::groups (bifurcated attention) and per-request
// sparse policies (SparQ, HiP, SWA) are ignored: every step runs dense attention, exact up to
// rounding. The KV cache is f16 with neither the transposed K nor V sums (no sparse policy
// reads them yet).
//
// Built two ways from the same source: with nvcc into the fathom_cuda_backend library (CMake
// target, compile definition FATHOM_HAS_CUDA_BACKEND=1 on its users), and with the host compiler
// through kernels/cuda/emu in tests/kernel/test_cuda_forward.cpp.
#include <memory>

#include "engine/backend/backend.h"

namespace fathom {

class Model;

// Uploads `model`'s weights and allocates device KV for model.kv_pool().num_blocks() blocks of
// the pool's block size (block ids shared with the pool, which stays the allocator). The model
// must outlive the backend. Throws fathom::Error: "--backend cuda: no CUDA device is visible
// (cudaGetDeviceCount: ...)" without a GPU, or a one-line reason for an unsupported model or a
// failed allocation. Under the emulator (tests) the device is always there.
std::unique_ptr<ForwardBackend> make_cuda_backend(Model& model);

}  // namespace fathom
