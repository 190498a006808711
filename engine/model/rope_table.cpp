// A layer's RoPE cos/sin table on the host (the rotation every backend applies), from the
// frequencies rope_scaling.cpp computed at load. Apart from rope_scaling.cpp so that what reads
// model files (and the fuzzers) links without the CPU kernels.
#include "base/error.h"
#include "engine/model/model_config.h"
#include "engine/model/rope_scaling.h"
#include "kernels/cpu/ops.h"

namespace fathom {

void layer_rope_table(const ModelConfig& c, const LayerConfig& layer, const int32_t* pos, int64_t n_tokens,
                      float* cos_out, float* sin_out) {
  FATHOM_CHECK(static_cast<int32_t>(layer.rope_inv_freq.size()) == c.rope_dim / 2, "layer RoPE frequencies not set");
  cpu::rope_table(pos, n_tokens, c.rope_dim, layer.rope_inv_freq.data(), layer.rope_attn_factor, cos_out, sin_out);
}

}  // namespace fathom
