#pragma once
// The attention policies fathom knows, one PolicyDef each (policy_registry.cpp lists them). A
// policy is its own files under engine/attention/policies/: its parameter table, how it turns
// the request's ratio into kernel parameters, its per-layer state (<name>.{h,cpp}, which need
// only the kernels' references), its CPU step (<name>_cpu.cpp, registered in cpu_steps.cpp) and
// its CUDA step (engine/backend/cuda/policies/, registered in cuda_policies.h). The kernels stay
// out of this table so that what parses and validates a policy (the server, the fuzzers) links
// without them. Nothing else names a policy: the forward, the backends, the server's option
// parser and the metrics read these tables.
#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>

#include "engine/attention/policy.h"
#include "engine/attention/policy_state.h"

namespace fathom {

struct PolicyDef {
  const char* name;                        // canonical: request and config values, metric labels
  const char* alias = nullptr;             // an older name still accepted (deprecated)
  std::span<const ParamSpec> params = {};  // its options object, "<name>": {...}

  // What the policy runs as (auto: the policy it stands for); null: itself.
  AttentionPolicy (*resolve)(const AttentionPolicy&) = nullptr;
  // Whether a step at S keys (head dimension d) would select every key; null: always (dense).
  bool (*selects_every_key)(const AttentionPolicy&, int32_t S, int32_t d) = nullptr;
  // Leading layers that stay dense (HiP's dense_layers); null: none.
  int32_t (*dense_layers)(const AttentionPolicy&) = nullptr;
  // The ratio its break-even is probed at (its own ratio parameter, if it has one); null: kv_read_ratio.
  double (*probe_ratio)(const AttentionPolicy&) = nullptr;
  // Copies into `probe` the parameters of `p` that change its speed enough to be measured apart,
  // rounded to a bounded set (HiP: scope and refresh); null: none.
  void (*probe_params)(const AttentionPolicy& p, AttentionPolicy& probe) = nullptr;
  // Decode steps a break-even measurement averages over (HiP: a whole refresh period); null: 8.
  int32_t (*measure_steps)(const AttentionPolicy&) = nullptr;
  // Whether /metrics carries its hot-row hit/miss series from start-up, at 0 (the policies whose
  // steps gather rows on both backends; SparQ's CPU step reads through the cache too, and its
  // series appear with its first lookup).
  bool hot_row_series = false;
  // Whether a request with it may join a bifurcated group (groups read densely).
  bool groupable = false;
};

// Every registered policy, in PolicyKind order (dense first).
std::span<const PolicyDef> policy_registry();
const PolicyDef& policy_def(PolicyKind k);

// A backend's steps indexed by PolicyKind: for each registered policy, `value(e)` of the entry of
// `entries` whose `name` is the policy's (value-initialised where none is). Backends build theirs
// once (a static) and look a step up per layer.
template <typename Value, typename Entries, typename Get>
std::array<Value, kMaxPolicies> index_by_policy(const Entries& entries, Get value) {
  std::array<Value, kMaxPolicies> table{};
  for (PolicyKind i = 0; i < policy_count(); ++i)
    for (const auto& e : entries)
      if (std::strcmp(e.name, policy_name(i)) == 0) table[static_cast<size_t>(i)] = value(e);
  return table;
}

}  // namespace fathom
