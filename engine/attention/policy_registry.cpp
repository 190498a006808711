// The registered attention policies: one line each. A new policy is its own files under
// engine/attention/policies/ (and engine/backend/cuda/policies/ for its CUDA step) plus its line
// here, in cpu_steps.cpp for its CPU step and in engine/backend/cuda/cuda_policies.h for its CUDA
// step. PolicyKind is the index in this list.
#include "engine/attention/policy_registry.h"

#include "base/error.h"
#include "engine/attention/policies/alisa.h"
#include "engine/attention/policies/auto.h"
#include "engine/attention/policies/hip.h"
#include "engine/attention/policies/sparq.h"

namespace fathom {
namespace {

const PolicyDef kDense{.name = "dense", .groupable = true};

}  // namespace

std::span<const PolicyDef> policy_registry() {
  static const PolicyDef kAll[] = {
      kDense,
      sparq::kDef,
      hip::kDef,
      alisa::kDef,
      auto_policy::kDef,
  };
  static_assert(std::size(kAll) <= kMaxPolicies);
  return kAll;
}

const PolicyDef& policy_def(PolicyKind k) {
  const std::span<const PolicyDef> all = policy_registry();
  FATHOM_CHECK(k >= 0 && static_cast<size_t>(k) < all.size(), "policy kind out of the registry");
  return all[k];
}

}  // namespace fathom
