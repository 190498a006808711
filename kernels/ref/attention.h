#pragma once
// Scalar reference of paged causal attention (the specification of kernels/cpu/attention).
#include "kernels/paged_kv.h"

namespace fathom::ref {

// See AttentionArgs in kernels/paged_kv.h. Two-pass softmax in double precision.
void paged_attention(const PagedKvView& kv, const AttentionArgs& args);

}  // namespace fathom::ref
