#pragma once
// The decode policies the CUDA backend runs: one line per policy with a CUDA step
// (engine/backend/cuda/policies/); a registered policy without one is reported unimplemented
// here (Backend::check_policy names the ones that are).
#include "engine/attention/policy_registry.h"
#include "engine/backend/cuda/policies/alisa.h"
#include "engine/backend/cuda/policies/hip.h"
#include "engine/backend/cuda/policies/sparq.h"
#include "engine/backend/cuda/policy_context.h"

namespace fathom::cuda_backend_detail {

struct CudaPolicy {
  const char* name;  // the registered policy's canonical name
  CudaPolicyStep step;
};
inline constexpr CudaPolicy kCudaPolicies[] = {
    {"sparq", sparq_cuda::step},
    {"hip", hip_cuda::step},
    {"alisa", alisa_cuda::step},
};

// The CUDA step of policy k, or null.
inline CudaPolicyStep cuda_step_of(PolicyKind k) {
  static const auto by_kind = index_by_policy<CudaPolicyStep>(kCudaPolicies, [](const CudaPolicy& c) { return c.step; });
  return k >= 0 && k < kMaxPolicies ? by_kind[static_cast<size_t>(k)] : nullptr;
}

}  // namespace fathom::cuda_backend_detail
