#pragma once
// The CUDA backend (engine/backend/cuda/cuda_backend.cu): the model's weights, activations and
// paged KV on the device, and the forward ops (engine/forward_ops.h) as CUDA kernels; the layer
// schedule is the shared one (engine/forward.cpp).
//
// Weights: Q8_0 / IQ4_NL / MXFP4 / Q2_K / Q3_K / Q4_K / Q6_K / IQ4_XS matrices are uploaded as stored and
// read by quant_gemv for decode-sized batches (<= 64 rows, one launch reading W once); larger batches
// (prefill) dequantize row chunks to f16 on the device (embedding_lookup_f16) and run gemm_f16
// (cuBLAS under nvcc). Every other format (F32, F16, BF16, Q4_0, Q4_1, Q5_0, ...) has no CUDA
// GEMV: it is dequantized to f16 once at load and always goes through gemm_f16 (activations
// converted to f16 per matmul, f32 accumulation). Norm weights and biases stay f32.
// Experts (qwen3moe, Mixtral): the stacked expert tensors uploaded like any matrix (as stored or
// f16), read by kernels/cuda/moe.h's grouped_gemv at every batch size (one launch per projection,
// runs of <= 4 pairs of an expert); the router f32, its logits copied to the host for the top-k
// (engine/expert_routing.h: a device-to-host copy and sync per MoE layer).
// Attention: dense (paged_decode_attention for decode tokens and prefill chunks alike, a causal
// key range per query), every registered policy with a CUDA step (cuda_policies.h), bifurcated groups
// (bifurcated_attention): every policy the CPU backend has. KV (kv_storage.h): every plane of the KvLayout — K, V, the transposed
// K when configured, INT8 row parameters, V sums, K moments — in device memory; a block's host image is the
// same bytes as the CPU backend's. With kv_cache.host_mib, a host tier of the same planes in
// page-locked host memory mapped into the device's address space: the kernels read host blocks in
// place (negative block table entries), block moves between the tiers are async copies on a
// non-blocking copy stream (docs/tiered_kv.md).
//
// Built two ways from the same source: with nvcc into the fathom_cuda_backend library (CMake
// target, compile definition FATHOM_HAS_CUDA_BACKEND=1 on its users), and with the host compiler
// through kernels/cuda/emu in tests/kernel/test_cuda_forward.cpp.
#include <memory>

#include "engine/backend/backend.h"

namespace fathom {

// Uploads `model`'s weights and allocates device KV for the budget in `options` (its own block
// size in bytes: see block_bytes()). The model must outlive the backend. Throws fathom::Error:
// "--backend cuda: no CUDA device is visible (cudaGetDeviceCount: ...)" without a GPU, or a
// one-line reason for an unsupported model or a failed allocation. Under the emulator (tests)
// the device is always there.
std::unique_ptr<Backend> make_cuda_backend(const Model& model, const ModelOptions& options);

}  // namespace fathom
