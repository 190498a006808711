#pragma once
// HiP's CUDA step (kernels/cuda/hip_attention.h: mask estimation every `refresh` steps,
// block-sparse attention) with the parameters and layer state of engine/attention/policies/hip.h.
// The mask lives on the device (HipDeviceMask) and travels with its sequence: forks copy it,
// recompute drops it.
#include <algorithm>
#include <memory>
#include <vector>

#include "engine/attention/policies/hip.h"
#include "engine/backend/cuda/policy_context.h"
#include "kernels/cuda/hip_attention.h"
#include "kernels/ref/hip.h"

namespace fathom::cuda_backend_detail::hip_cuda {

inline cuda::HipConfig config(const ref::HipParams& h) {
  return cuda::HipConfig{h.mask_k, h.block_size_k, h.sink, h.window, h.per_kv_head};
}

// HiP's mask for one layer of one sequence, on the device ([n_heads][n_keep] block starts): the
// estimation writes it and the cached steps read it in place, so neither copies it across.
class HipDeviceMask : public BackendLayerState {
 public:
  DeviceArray<int32_t> starts;
  size_t n = 0;  // entries written by the last estimation

  std::unique_ptr<BackendLayerState> clone() const override {
    auto copy = std::make_unique<HipDeviceMask>();
    FATHOM_CUDA_BACKEND_OK(cudaDeviceSynchronize());  // the estimate that wrote it may still be queued
    copy->starts.reserve_grow(n);
    copy->n = n;
    if (n > 0)
      FATHOM_CUDA_BACKEND_OK(cudaMemcpy(copy->starts.get(), starts.get(), n * sizeof(int32_t), cudaMemcpyDeviceToDevice));
    return copy;
  }
};

// The rows HiP's attention reads for kv head g, into the hot-row cache: the union over its
// heads' masks (per kv head: one list, the same for every head of the group).
inline void cache_rows(const hip::LayerState& st, const DecodeArgs& args, int32_t n_kv_heads, bool per_kv_head,
                       CudaPolicyContext& ctx) {
  const ref::HipMask& mask = st.mask;
  if (mask.dense || mask.block_starts.empty()) return;  // dense: every row, read in place
  const int32_t pos0 = args.pos, G = args.n_heads / n_kv_heads;
  ctx.cache_rows([&](int32_t g, std::vector<int32_t>& pos) {
    for (int32_t h = g * G; h < (per_kv_head ? g * G + 1 : (g + 1) * G); ++h) {
      const std::vector<int32_t> head = ref::hip_attended_positions(mask, st.params, pos0, h);
      pos.insert(pos.end(), head.begin(), head.end());
    }
    if (!per_kv_head) {
      std::sort(pos.begin(), pos.end());
      pos.erase(std::unique(pos.begin(), pos.end()), pos.end());
    }
  });
}

// With a hot-row cache (ctx.cache_rows), once the step's mask is known and before the attention
// is launched, the rows it selects are copied in, so the mask is then also copied to the host
// (LayerState::mask.block_starts, once per estimate). Otherwise the mask never leaves the device.
inline int64_t step(const PagedKvView& kv, const DecodeArgs& args, const AttentionPolicy& p, LayerPolicyState& layer,
                    CudaPolicyContext& ctx) {
  int64_t bytes = 0;
  hip::LayerState& st = layer_state<hip::LayerState>(layer);
  HipDeviceMask& mask = state_of<HipDeviceMask>(layer.backend);
  PolicyScratch& s = ctx.scratch;
  const cudaStream_t stream = ctx.stream;
  const bool refresh = hip::refresh_due(p, st);  // layers take turns (engine/attention/policies/hip.h)
  if (refresh) st.params = hip::resolve(p, args.pos + 1);
  cuda::HipConfig cfg = config(st.params);
  // The estimation kernel holds a mask's query rows in shared memory: groups wider than that
  // estimate one mask per query head instead.
  cfg.per_kv_head = cfg.per_kv_head && cuda::hip_group_fits_one_mask(args.n_heads / kv.n_kv_heads, kv.head_dim);
  DecodeArgs at_mask = args;
  at_mask.pos = refresh ? args.pos : st.mask.pos;
  const cuda::HipMaskInfo info = cuda::plan_hip_mask(kv, at_mask, cfg);
  const size_t keep = static_cast<size_t>(std::max(1, info.n_keep)), heads = static_cast<size_t>(args.n_heads);
  if (refresh) {
    st.mask = ref::HipMask{info.dense, info.pos, {}};
    mask.starts.reserve_grow(heads * keep);  // also when dense: the attention takes a mask pointer
    mask.n = info.dense ? 0 : heads * keep;  // a dense mask selects nothing: no entries to keep
    if (!info.dense) {
      FATHOM_CUDA_BACKEND_OK(cuda::hip_estimate_mask(kv, args, cfg, info, mask.starts.get(), stream));
      bytes += cuda::hip_estimate_mask_bytes_bound(kv, args, cfg, info).kv_read;
    }
  } else {
    FATHOM_CHECK(info.dense || mask.n == heads * keep, "cached HiP mask has the wrong shape");
  }
  hip::count_step(p, refresh, layer.rank, st);
  if (ctx.cache_rows && !info.dense) {
    if (st.mask.block_starts.empty()) {
      std::vector<int32_t> starts(heads * keep);
      FATHOM_CUDA_BACKEND_OK(cudaStreamSynchronize(stream));  // the estimate is queued on `stream`
      FATHOM_CUDA_BACKEND_OK(
          cudaMemcpy(starts.data(), mask.starts.get(), starts.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
      for (size_t h = 0; h < heads; ++h)
        st.mask.block_starts.emplace_back(starts.begin() + h * keep, starts.begin() + (h + 1) * keep);
    }
    cache_rows(st, args, kv.n_kv_heads, cfg.per_kv_head, ctx);
  }
  const cuda::HipAttentionPlan plan = cuda::plan_hip_sparse_attention(kv, args, cfg, info);
  s.workspace.reserve_grow(std::max<size_t>(plan.workspace_floats, 1) * sizeof(float));
  FATHOM_CUDA_BACKEND_OK(cuda::hip_sparse_attention(kv, args, cfg, info, mask.starts.get(), plan,
                                                    reinterpret_cast<float*>(s.workspace.get()), stream));
  return bytes + cuda::hip_sparse_attention_bytes(kv, args, cfg, info, plan).kv_read;
}

}  // namespace fathom::cuda_backend_detail::hip_cuda
