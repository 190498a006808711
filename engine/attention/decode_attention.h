#pragma once
// Backend-independent parts of decode attention through a request's policy: the policy, the
// state it keeps across steps (policy_state.h), and the dense byte count. The kernels per policy
// live in the policies' own files (engine/attention/policies/, engine/backend/cuda/policies/).
#include <cstdint>

#include "engine/attention/policy.h"
#include "engine/attention/policy_state.h"
#include "engine/kv/kv_layout.h"

namespace fathom {

// Bytes dense attention reads for one query attending `keys` keys: S rows of K and V per kv head.
int64_t dense_kv_bytes(const KvLayout& kv, int64_t keys);

}  // namespace fathom
