#pragma once
// The CUDA backend and every kernel it launches, compiled by the host compiler through
// kernels/cuda/emu: include once in a test's translation unit (the .cu files define functions).
#include "kernels/cuda/activation.cu"
#include "kernels/cuda/bifurcated_attention.cu"
#include "kernels/cuda/elementwise.cu"
#include "kernels/cuda/embedding.cu"
#include "kernels/cuda/gemm.cu"
#include "kernels/cuda/hip_attention.cu"
#include "kernels/cuda/kv_append.cu"
#include "kernels/cuda/paged_decode_attention.cu"
#include "kernels/cuda/quant_gemv.cu"
#include "kernels/cuda/rms_norm.cu"
#include "kernels/cuda/rope.cu"
#include "kernels/cuda/row_cache.cu"
#include "kernels/cuda/sparq_attention.cu"
#include "kernels/cuda/swa_attention.cu"
#include "kernels/cuda/swa_mass.cu"
#include "engine/backend/cuda/cuda_backend.cu"
