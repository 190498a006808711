#pragma once
// The CUDA backend and every kernel it launches, as the emulated tests and benches see them: the
// declarations (the definitions are in fathom_cuda_emu, the .cu files compiled once by the host
// compiler through kernels/cuda/emu).
#include "kernels/cuda/activation.h"
#include "kernels/cuda/bifurcated_attention.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/hip_attention.h"
#include "kernels/cuda/kv_append.h"
#include "kernels/cuda/paged_decode_attention.h"
#include "kernels/cuda/quant_gemv.h"
#include "kernels/cuda/rms_norm.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/hot_rows.h"
#include "kernels/cuda/sparq_attention.h"
#include "kernels/cuda/swa_attention.h"
#include "kernels/cuda/swa_mass.h"
#include "engine/backend/cuda/bifurcated_groups.h"
#include "engine/backend/cuda/cuda_policies.h"
#include "engine/backend/cuda/cuda_backend.h"
