#include "engine/attention/cpu_steps.h"

#include <array>
#include <cstring>

#include "engine/attention/policies/alisa.h"
#include "engine/attention/policies/hip.h"
#include "engine/attention/policies/sparq.h"

namespace fathom {
namespace {

constexpr CpuPolicyStep kCpuSteps[] = {
    {"sparq", sparq::cpu_step, sparq::cpu_reads_host_tier},
    {"hip", hip::cpu_step, hip::cpu_reads_host_tier},
    {"alisa", alisa::cpu_step, alisa::cpu_reads_host_tier},
};

}  // namespace

const CpuPolicyStep* cpu_step_of(PolicyKind k) {
  static const auto by_kind = [] {  // by PolicyKind: a step looks its policy up per layer
    std::array<const CpuPolicyStep*, kMaxPolicies> table{};
    for (PolicyKind i = 0; i < policy_count(); ++i)
      for (const CpuPolicyStep& s : kCpuSteps)
        if (std::strcmp(s.name, policy_name(i)) == 0) table[static_cast<size_t>(i)] = &s;
    return table;
  }();
  return k >= 0 && k < kMaxPolicies ? by_kind[static_cast<size_t>(k)] : nullptr;
}

}  // namespace fathom
