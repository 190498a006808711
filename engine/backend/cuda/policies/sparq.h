#pragma once
// SparQ's CUDA step (kernels/cuda/sparq_attention.h) with the parameters of
// engine/attention/policies/sparq.h.
#include "engine/attention/policies/sparq.h"
#include "engine/backend/cuda/policy_context.h"
#include "kernels/cuda/sparq_attention.h"

namespace fathom::cuda_backend_detail::sparq_cuda {

inline int64_t step(const PagedKvView& kv, const DecodeArgs& args, const AttentionPolicy& p, LayerPolicyState&,
                    CudaPolicyContext& ctx) {
  const ref::SparqParams rp = sparq::resolve(p, args.pos + 1, kv.head_dim);
  const cuda::SparqPlan plan = cuda::plan_sparq_decode_attention(
      kv, args, cuda::SparqConfig{rp.k, rp.l, rp.r, rp.reallocation, p.flag(sparq::kKeySpread) && kv.k_moments != nullptr});
  ctx.scratch.workspace.reserve_grow(plan.workspace_words * 4);
  FATHOM_CUDA_BACKEND_OK(cuda::sparq_decode_attention(kv, args, plan, ctx.scratch.workspace.get(), ctx.stream));
  return cuda::sparq_decode_attention_bytes(kv, args, plan).kv_read;
}

}  // namespace fathom::cuda_backend_detail::sparq_cuda
