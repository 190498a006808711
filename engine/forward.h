#pragma once
// The transformer's forward pass, written once for every backend: the layer schedule of the
// llama and gemma3 families (their differences are ModelConfig data: QK-norm, post-norms, the
// MLP's activation, biases, sliding-window layers), and the choice of attention per sequence and
// layer (bifurcated group, sparse policy, or dense).
#include <array>
#include <cstdint>
#include <vector>

#include "engine/attention/policy.h"
#include "engine/batch_plan.h"
#include "engine/forward_ops.h"
#include "engine/kv/kv_layout.h"
#include "engine/model/model_config.h"

namespace fathom {

// KV bytes read by decode attention, per policy of the reading request (indexed by PolicyKind).
using KvReadBytes = std::array<int64_t, kMaxPolicies>;
// Decode layer steps by the policy of the request and the kernel that ran ([requested][ran]; ran is
// dense or a sparse kind): what `auto` chose, and how often a policy fell back to dense.
using AttentionSteps = std::array<std::array<int64_t, kMaxPolicies>, kMaxPolicies>;

// Runs `plan` through `ops` and writes plan.logits_rows() rows of vocab floats to `logits`, and
// the wanted rows of final hidden states (SeqStep::hidden; dim floats each) to `hidden` if given.
// Adds the KV bytes each one-token step's attention read to kv_read and its layer steps to
// `steps` (prefill is not counted; bifurcated groups count as dense). Sizes every step's
// policy_state to the layer count. Failpoint "forward" (one hit per pass).
void run_forward(const ModelConfig& config, const KvLayout& kv, ForwardOps& ops, const BatchPlan& plan,
                 std::vector<float>& logits, std::vector<float>* hidden, KvReadBytes& kv_read, AttentionSteps& steps);

}  // namespace fathom
