#pragma once
// `auto` is not a kernel: each step it resolves to ALISA with the request's ratio and ALISA
// parameters (its options are ALISA's), dense below ALISA's measured break-even (or min_keys).
// ALISA is the policy that kept dense's passkey answers best on both default models (at 1/8
// everywhere but SmolLM2 8k, at 1/4 everywhere: eval/results/passkey_auto.md) and is also the
// fastest at every length measured (eval/results/sparse_quality_findings.md,
// bench/results/break_even.md); the rule lives here so that a better-measured choice changes
// one place.
#include "engine/attention/policy_registry.h"

namespace fathom::auto_policy {

extern const PolicyDef kDef;

}  // namespace fathom::auto_policy
