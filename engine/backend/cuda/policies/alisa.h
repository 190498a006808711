#pragma once
// ALISA's CUDA step (kernels/cuda/swa_attention.h: the kept positions chosen from the sequence's
// mass, attended, and their weights folded back into the mass, all on the device;
// kernels/cuda/swa_mass.h) with the parameters of engine/attention/policies/alisa.h.
#include <algorithm>
#include <memory>
#include <vector>

#include "engine/attention/policies/alisa.h"
#include "engine/backend/cuda/policy_context.h"
#include "kernels/cuda/swa_attention.h"
#include "kernels/cuda/swa_mass.h"
#include "kernels/ref/swa.h"

namespace fathom::cuda_backend_detail::alisa_cuda {

// Scratch reused by every step.
struct Scratch : PolicyDeviceScratch {
  DeviceArray<int32_t> swa_kept;     // [n_kept] the kept positions
  DeviceArray<float> swa_weights;    // [n_kept] their softmax weights summed over heads
  DeviceArray<float> swa_select;     // swa_select's workspace
};

// ALISA's mass for one layer of one sequence, on the device ([n] floats in a buffer of `capacity`):
// chosen by, attended and folded into on the device (kernels/cuda/swa_mass.h), so an ALISA step
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

// With a hot-row cache (ctx.cache_rows), the kept positions (ascending) are copied to the host
// before the attention is launched and their host-tier rows cached: the one wait on the device a
// step may have.
inline int64_t step(const PagedKvView& kv, const DecodeArgs& args, const AttentionPolicy& p, LayerPolicyState& st,
                    CudaPolicyContext& ctx) {
  const int32_t S = args.pos + 1;
  SwaDeviceMass& mass = state_of<SwaDeviceMass>(st.backend);
  Scratch& s = own_scratch<Scratch>(ctx);
  const cudaStream_t stream = ctx.stream;
  ref::SwaParams params = alisa::resolve(p, S);
  if (mass.n == 0) params.ratio = 1.0f;  // the first step has no mass: it keeps every position and seeds it
  mass.grow_to(S, stream);
  const ref::SwaSizes sizes = ref::swa_sizes(S, params.ratio);
  const int32_t n = sizes.k_local + sizes.k_global;
  s.swa_kept.reserve_grow(static_cast<size_t>(n));
  s.swa_weights.reserve_grow(static_cast<size_t>(n));
  s.swa_select.reserve_grow(cuda::swa_select_workspace_floats(S));
  const cuda::SwaPlan plan = cuda::plan_swa_attention(kv, args, n);
  ctx.scratch.workspace.reserve_grow(plan.workspace_floats * sizeof(float));
  FATHOM_CUDA_BACKEND_OK(cuda::swa_select(mass.get(), S, alisa::pool_radius(p), sizes.k_local, sizes.k_global,
                                          s.swa_select.get(), s.swa_kept.get(), stream));
  if (ctx.cache_rows) {
    std::vector<int32_t> kept(static_cast<size_t>(n));
    FATHOM_CUDA_BACKEND_OK(cudaStreamSynchronize(stream));
    FATHOM_CUDA_BACKEND_OK(cudaMemcpy(kept.data(), s.swa_kept.get(), n * sizeof(int32_t), cudaMemcpyDeviceToHost));
    ctx.cache_rows([&](int32_t, std::vector<int32_t>& pos) { pos = kept; });
  }
  FATHOM_CUDA_BACKEND_OK(cuda::swa_attention(kv, args, s.swa_kept.get(), plan, s.swa_weights.get(),
                                             reinterpret_cast<float*>(ctx.scratch.workspace.get()), stream));
  FATHOM_CUDA_BACKEND_OK(cuda::swa_fold(mass.get(), S, alisa::decay(sizes.k_local), s.swa_kept.get(), s.swa_weights.get(),
                                        n, stream));
  return cuda::swa_attention_bytes(kv, args, plan).kv_read;
}

}  // namespace fathom::cuda_backend_detail::alisa_cuda
