#pragma once
// What a decode policy's CUDA step (engine/backend/cuda/policies/) gets from the CUDA backend:
// device scratch shared by the pass, the stream, and the hot-row cache's entry point.
#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "engine/attention/decode_attention.h"
#include "engine/backend/cuda/device_array.h"
#include "kernels/cuda/bifurcated_attention.h"
#include "kernels/paged_kv.h"

namespace fathom {
namespace cuda_backend_detail {

// A policy's own device scratch (e.g. ALISA's kept positions), one per policy per backend.
class PolicyDeviceScratch {
 public:
  virtual ~PolicyDeviceScratch() = default;
};

// Device scratch reused by every call of a pass (the stream orders its uses).
struct PolicyScratch {
  DeviceArray<std::byte> workspace;
  DeviceArray<std::byte> plan;       // a bifurcated plan's device copy
  DeviceArray<float> q, out;         // a group's query rows gathered, and its outputs
  std::deque<cuda::BifurcatedPlan> host_plans;  // alive until the pass ends (async plan copies read them)
  std::array<std::unique_ptr<PolicyDeviceScratch>, kMaxPolicies> own;  // by PolicyKind
};

// Fills `pos` with the positions kv head g's attention will read.
using RowsOf = std::function<void(int32_t g, std::vector<int32_t>& pos)>;

struct CudaPolicyContext {
  PolicyScratch& scratch;
  cudaStream_t stream;
  PolicyKind kind;  // the policy running (its own scratch slot)
  // Null without a hot-row cache (every row is read in place: the device tier, or mapped host
  // memory). Else the step calls it once its selection is known and before its attention is
  // launched: the backend copies the host-tier rows it names into the cache.
  std::function<void(const RowsOf&)> cache_rows;
};

// The state of type T in `slot`'s scratch for the running policy, created there if absent.
template <typename T>
T& own_scratch(CudaPolicyContext& ctx) {
  std::unique_ptr<PolicyDeviceScratch>& slot = ctx.scratch.own[static_cast<size_t>(ctx.kind)];
  if (dynamic_cast<T*>(slot.get()) == nullptr) slot = std::make_unique<T>();
  return static_cast<T&>(*slot);
}

// One decode query of one layer; returns the KV bytes read.
using CudaPolicyStep = int64_t (*)(const PagedKvView& kv, const DecodeArgs& args, const AttentionPolicy& p,
                                   LayerPolicyState& state, CudaPolicyContext& ctx);

}  // namespace cuda_backend_detail
}  // namespace fathom
