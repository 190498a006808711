#pragma once
// Bifurcated groups on the CUDA backend (kernels/cuda/bifurcated_attention.h): members' queries
// gathered, every shared segment read once for all of them.
#include <cstdint>
#include <vector>

#include "engine/backend/cuda/policy_context.h"
#include "engine/batch_plan.h"
#include "kernels/cuda/bifurcated_attention.h"

namespace fathom::cuda_backend_detail {

// One group of the plan: members' query rows (q + first[m]·row, [n_heads][head_dim] each) are
// gathered, attended with each shared segment read once, and the outputs scattered back to out.
// tables: device block tables, member m's at tables + m·table_stride. pool: the layer's view
// (its block_table unused).
inline int64_t group_step(const PagedKvView& pool, const BatchPlan& plan, const AttentionGroup& g,
                          const int32_t* tables, int32_t table_stride, const float* q, float* out,
                          const std::vector<int64_t>& first, int32_t n_heads, LogitScale scale, const float* sinks,
                          PolicyScratch& s,
                          cudaStream_t stream) {
  const int32_t n = static_cast<int32_t>(g.members.size());
  const size_t row = static_cast<size_t>(n_heads) * pool.head_dim;
  std::vector<int32_t> local(plan.seqs.size(), -1);
  std::vector<cuda::BifSequence> seqs(n);
  s.q.reserve_grow(row * n);
  s.out.reserve_grow(row * n);
  for (int32_t j = 0; j < n; ++j) {
    const int32_t m = g.members[j];
    local[m] = j;
    seqs[j] = cuda::BifSequence{tables + static_cast<size_t>(m) * table_stride, plan.seqs[m].pos0};
    FATHOM_CUDA_BACKEND_OK(cudaMemcpy(s.q.get() + j * row, q + first[m] * static_cast<int64_t>(row),
                                      row * sizeof(float), cudaMemcpyDeviceToDevice));
  }
  std::vector<cuda::BifSegment> segments;
  for (const SharedSpan& span : g.segments) {
    cuda::BifSegment seg{seqs[local[span.members[0]]].block_table, span.begin, span.end, {}};
    for (int32_t m : span.members) seg.members.push_back(local[m]);
    segments.push_back(std::move(seg));
  }
  const cuda::BifurcatedPlan& bp =
      s.host_plans.emplace_back(cuda::plan_bifurcated_attention(segments, seqs, n_heads, pool));
  s.plan.reserve_grow(bp.device_bytes);
  s.workspace.reserve_grow(std::max<size_t>(bp.workspace_floats, 1) * sizeof(float));
  FATHOM_CUDA_BACKEND_OK(cuda::bifurcated_attention(bp, pool, s.q.get(), s.out.get(), s.plan.get(),
                                                    reinterpret_cast<float*>(s.workspace.get()), scale, sinks, stream));
  for (int32_t j = 0; j < n; ++j)
    FATHOM_CUDA_BACKEND_OK(cudaMemcpy(out + first[g.members[j]] * static_cast<int64_t>(row), s.out.get() + j * row,
                                      row * sizeof(float), cudaMemcpyDeviceToDevice));
  return cuda::bifurcated_attention_bytes(bp, pool).kv_read;
}

}  // namespace fathom::cuda_backend_detail
