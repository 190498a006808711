#pragma once
// The CUDA backend's sparse decode policies and bifurcated groups over the launchers of
// kernels/cuda: SparQ (sparq_attention.h), HiP (hip_attention.h: mask estimation every
// `hip_refresh` steps, block-sparse attention), SWA (swa_attention.h: the kept positions chosen on
// the host from the sequence's mass, attended on the device, their weights folded back into the
// mass) and bifurcated attention (bifurcated_attention.h).
// Parameters come from the same resolve_* as the CPU backend's (engine/attention/policy.h), and
// the policy state is the same LayerPolicyState: a HiP mask is copied to the host when it is
// estimated (it travels with its sequence: forks copy it, recompute drops it) and uploaded on
// the steps that reuse it.
// TODO(tiered KV): keep HiP masks and SWA masses device-resident per (sequence, layer) to save
// the copies (today one host round trip per layer per step for SWA, per refresh for HiP).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "engine/attention/decode_attention.h"
#include "engine/backend/cuda/device_array.h"
#include "engine/batch_plan.h"
#include "kernels/cuda/bifurcated_attention.h"
#include "kernels/cuda/hip_attention.h"
#include "kernels/cuda/sparq_attention.h"
#include "kernels/cuda/swa_attention.h"
#include "kernels/cuda/swa_mass.h"
#include "kernels/ref/swa.h"
#include "kernels/paged_kv.h"

namespace fathom {
namespace cuda_backend_detail {

// Device scratch reused by every call of a pass (the stream orders its uses).
struct PolicyScratch {
  DeviceArray<std::byte> workspace;
  DeviceArray<std::byte> plan;       // a bifurcated plan's device copy
  DeviceArray<float> q, out;         // a group's query rows gathered, and its outputs
  DeviceArray<int32_t> swa_kept;     // [n_kept] SWA's kept positions
  DeviceArray<float> swa_weights;    // [n_kept] their softmax weights summed over heads
  DeviceArray<float> swa_select;     // swa_select's workspace
  std::deque<cuda::BifurcatedPlan> host_plans;  // alive until the pass ends (async plan copies read them)
};

inline int64_t sparq_step(const PagedKvView& kv, const DecodeArgs& args, const AttentionPolicy& p, PolicyScratch& s,
                          cudaStream_t stream) {
  const ref::SparqParams rp = resolve_sparq(p, args.pos + 1, kv.head_dim);
  const cuda::SparqPlan plan = cuda::plan_sparq_decode_attention(kv, args, cuda::SparqConfig{rp.k, rp.l, rp.r, rp.reallocation, p.sparq_key_spread && kv.k_moments != nullptr});
  s.workspace.reserve_grow(plan.workspace_words * 4);
  FATHOM_CUDA_BACKEND_OK(cuda::sparq_decode_attention(kv, args, plan, s.workspace.get(), stream));
  return cuda::sparq_decode_attention_bytes(kv, args, plan).kv_read;
}

inline cuda::HipConfig hip_config(const ref::HipParams& h) {
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

// The state of type T in st.backend, created there if absent (or if another policy's: a layer's
// state serves one policy at a time).
template <typename T>
T& backend_state(LayerPolicyState& st) {
  if (dynamic_cast<T*>(st.backend.get()) == nullptr) st.backend.reset(std::make_unique<T>());
  return static_cast<T&>(*st.backend.get());
}

// `before_attention(per_kv_head)`, if given, runs once the step's mask is known, before the
// attention is launched: the backend's row cache copies in the rows it selects, so the mask is
// then also copied to the host (st.hip_mask.block_starts, once per estimate). Otherwise the mask
// never leaves the device.
inline int64_t hip_step(const PagedKvView& kv, const DecodeArgs& args, const AttentionPolicy& p, LayerPolicyState& st,
                        PolicyScratch& s, cudaStream_t stream,
                        const std::function<void(bool per_kv_head)>& before_attention = {}) {
  int64_t bytes = 0;
  HipDeviceMask& mask = backend_state<HipDeviceMask>(st);
  const bool refresh = hip_refresh_due(p, st);  // layers take turns (decode_attention.h)
  if (refresh) st.hip_params = resolve_hip(p, args.pos + 1);
  cuda::HipConfig cfg = hip_config(st.hip_params);
  // The estimation kernel holds a mask's query rows in shared memory: groups wider than that
  // estimate one mask per query head instead.
  cfg.per_kv_head = cfg.per_kv_head && cuda::hip_group_fits_one_mask(args.n_heads / kv.n_kv_heads, kv.head_dim);
  DecodeArgs at_mask = args;
  at_mask.pos = refresh ? args.pos : st.hip_mask.pos;
  const cuda::HipMaskInfo info = cuda::plan_hip_mask(kv, at_mask, cfg);
  const size_t keep = static_cast<size_t>(std::max(1, info.n_keep)), heads = static_cast<size_t>(args.n_heads);
  if (refresh) {
    st.hip_mask = ref::HipMask{info.dense, info.pos, {}};
    mask.starts.reserve_grow(heads * keep);  // also when dense: the attention takes a mask pointer
    mask.n = info.dense ? 0 : heads * keep;  // a dense mask selects nothing: no entries to keep
    if (!info.dense) {
      FATHOM_CUDA_BACKEND_OK(cuda::hip_estimate_mask(kv, args, cfg, info, mask.starts.get(), stream));
      bytes += cuda::hip_estimate_mask_bytes_bound(kv, args, cfg, info).kv_read;
    }
  } else {
    FATHOM_CHECK(info.dense || mask.n == heads * keep, "cached HiP mask has the wrong shape");
  }
  hip_count_step(p, refresh, st);
  if (before_attention && !info.dense) {
    if (st.hip_mask.block_starts.empty()) {
      std::vector<int32_t> starts(heads * keep);
      FATHOM_CUDA_BACKEND_OK(cudaStreamSynchronize(stream));  // the estimate is queued on `stream`
      FATHOM_CUDA_BACKEND_OK(
          cudaMemcpy(starts.data(), mask.starts.get(), starts.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
      for (size_t h = 0; h < heads; ++h)
        st.hip_mask.block_starts.emplace_back(starts.begin() + h * keep, starts.begin() + (h + 1) * keep);
    }
    before_attention(cfg.per_kv_head);
  }
  const cuda::HipAttentionPlan plan = cuda::plan_hip_sparse_attention(kv, args, cfg, info);
  s.workspace.reserve_grow(std::max<size_t>(plan.workspace_floats, 1) * sizeof(float));
  FATHOM_CUDA_BACKEND_OK(cuda::hip_sparse_attention(kv, args, cfg, info, mask.starts.get(), plan,
                                                    reinterpret_cast<float*>(s.workspace.get()), stream));
  return bytes + cuda::hip_sparse_attention_bytes(kv, args, cfg, info, plan).kv_read;
}

// SWA's mass for one layer of one sequence, on the device ([n] floats in a buffer of `capacity`):
// chosen by, attended and folded into on the device (kernels/cuda/swa_mass.h), so an SWA step
// copies nothing to or from the host and the host never waits for the device inside a step.
class SwaDeviceMass : public BackendLayerState {
 public:
  int32_t n = 0;
  float* get() const { return mass_.get(); }

  // n = S: new positions at 0, growing the buffer geometrically (contents kept); a shorter S drops
  // the tail (zeroed again if it grows back).
  void grow_to(int32_t S, cudaStream_t stream) {
    if (S <= n) {
      n = S;
      return;
    }
    if (static_cast<size_t>(S) > capacity_) {
      DeviceArray<float> bigger;
      const size_t capacity = std::max<size_t>({static_cast<size_t>(S), 2 * capacity_, 1024});
      bigger.reserve(capacity);
      if (n > 0)
        FATHOM_CUDA_BACKEND_OK(cudaMemcpyAsync(bigger.get(), mass_.get(), static_cast<size_t>(n) * sizeof(float),
                                               cudaMemcpyDeviceToDevice, stream));
      mass_ = std::move(bigger);
      capacity_ = capacity;
    }
    FATHOM_CUDA_BACKEND_OK(cudaMemsetAsync(mass_.get() + n, 0, static_cast<size_t>(S - n) * sizeof(float), stream));
    n = S;
  }

  std::unique_ptr<BackendLayerState> clone() const override {
    auto copy = std::make_unique<SwaDeviceMass>();
    FATHOM_CUDA_BACKEND_OK(cudaDeviceSynchronize());  // the folds that wrote it may still be queued
    copy->grow_to(n, nullptr);
    if (n > 0)
      FATHOM_CUDA_BACKEND_OK(
          cudaMemcpy(copy->get(), mass_.get(), static_cast<size_t>(n) * sizeof(float), cudaMemcpyDeviceToDevice));
    return copy;
  }

 private:
  DeviceArray<float> mass_;
  size_t capacity_ = 0;
};

// `before_attention(kept)`, if given, runs before the attention is launched with the kept positions
// (ascending): they are then copied to the host (the row cache of a tiered cache needs them), the
// one wait on the device an SWA step may have.
inline int64_t swa_step(const PagedKvView& kv, const DecodeArgs& args, const AttentionPolicy& p, LayerPolicyState& st,
                        PolicyScratch& s, cudaStream_t stream,
                        const std::function<void(const std::vector<int32_t>& kept)>& before_attention = {}) {
  const int32_t S = args.pos + 1;
  SwaDeviceMass& mass = backend_state<SwaDeviceMass>(st);
  ref::SwaParams params = resolve_swa(p, S);
  if (mass.n == 0) params.ratio = 1.0f;  // the first step has no mass: it keeps every position and seeds it
  mass.grow_to(S, stream);
  const ref::SwaSizes sizes = ref::swa_sizes(S, params.ratio);
  const int32_t n = sizes.k_local + sizes.k_global;
  s.swa_kept.reserve_grow(static_cast<size_t>(n));
  s.swa_weights.reserve_grow(static_cast<size_t>(n));
  s.swa_select.reserve_grow(cuda::swa_select_workspace_floats(S));
  const cuda::SwaPlan plan = cuda::plan_swa_attention(kv, args, n);
  s.workspace.reserve_grow(plan.workspace_floats * sizeof(float));
  FATHOM_CUDA_BACKEND_OK(cuda::swa_select(mass.get(), S, swa_pool_radius(p), sizes.k_local, sizes.k_global,
                                          s.swa_select.get(), s.swa_kept.get(), stream));
  if (before_attention) {
    std::vector<int32_t> kept(static_cast<size_t>(n));
    FATHOM_CUDA_BACKEND_OK(cudaStreamSynchronize(stream));
    FATHOM_CUDA_BACKEND_OK(cudaMemcpy(kept.data(), s.swa_kept.get(), n * sizeof(int32_t), cudaMemcpyDeviceToHost));
    before_attention(kept);
  }
  FATHOM_CUDA_BACKEND_OK(cuda::swa_attention(kv, args, s.swa_kept.get(), plan, s.swa_weights.get(),
                                             reinterpret_cast<float*>(s.workspace.get()), stream));
  FATHOM_CUDA_BACKEND_OK(cuda::swa_fold(mass.get(), S, swa_decay(sizes.k_local), s.swa_kept.get(), s.swa_weights.get(),
                                        n, stream));
  return cuda::swa_attention_bytes(kv, args, plan).kv_read;
}

// One group of the plan: members' query rows (q + first[m]·row, [n_heads][head_dim] each) are
// gathered, attended with each shared segment read once, and the outputs scattered back to out.
// tables: device block tables, member m's at tables + m·table_stride. pool: the layer's view
// (its block_table unused).
inline int64_t group_step(const PagedKvView& pool, const BatchPlan& plan, const AttentionGroup& g,
                          const int32_t* tables, int32_t table_stride, const float* q, float* out,
                          const std::vector<int64_t>& first, int32_t n_heads, float scale, PolicyScratch& s,
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
                                                    reinterpret_cast<float*>(s.workspace.get()), scale, stream));
  for (int32_t j = 0; j < n; ++j)
    FATHOM_CUDA_BACKEND_OK(cudaMemcpy(out + first[g.members[j]] * static_cast<int64_t>(row), s.out.get() + j * row,
                                      row * sizeof(float), cudaMemcpyDeviceToDevice));
  return cuda::bifurcated_attention_bytes(bp, pool).kv_read;
}

}  // namespace cuda_backend_detail
}  // namespace fathom
