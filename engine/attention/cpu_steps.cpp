#include "engine/attention/cpu_steps.h"

#include "engine/attention/policies/alisa.h"
#include "engine/attention/policies/hip.h"
#include "engine/attention/policies/sparq.h"
#include "engine/attention/policy_registry.h"

namespace fathom {
namespace {

constexpr CpuPolicyStep kCpuSteps[] = {
    {"sparq", sparq::cpu_step, sparq::cpu_reads_host_tier},
    {"hip", hip::cpu_step, hip::cpu_reads_host_tier},
    {"alisa", alisa::cpu_step, alisa::cpu_reads_host_tier},
};

}  // namespace

const CpuPolicyStep* cpu_step_of(PolicyKind k) {
  static const auto by_kind =
      index_by_policy<const CpuPolicyStep*>(kCpuSteps, [](const CpuPolicyStep& s) { return &s; });
  return k >= 0 && k < kMaxPolicies ? by_kind[static_cast<size_t>(k)] : nullptr;
}

}  // namespace fathom
