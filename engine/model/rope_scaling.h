#pragma once
// RoPE frequencies with context-extension scaling, read from GGUF metadata (<arch>.rope.*) and the
// optional frequency-factor tensors (`rope_freqs.weight`; longrope's `rope_factors_long.weight` and
// `rope_factors_short.weight`). The formulas are Hugging Face transformers' (modeling_rope_utils.py:
// linear, llama3, yarn, longrope) so that a file converted from a HF checkpoint rotates as the
// checkpoint does; docs/models.md lists what is supported and what is refused.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace fathom {

class GgufFile;
struct ModelConfig;
struct LayerConfig;

enum class RopeScalingType { kNone, kLinear, kLlama3, kYarn, kLongrope };

const char* rope_scaling_name(RopeScalingType t);  // "none", "linear", "llama3", "yarn", "longrope"

struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  double factor = 1.0;             // context extension factor (linear, llama3, yarn)
  double original_context = 0;     // tokens the model was pretrained on (llama3, yarn, longrope)
  double low_freq_factor = 1.0;    // llama3: wavelengths above original_context / low are divided by factor
  double high_freq_factor = 4.0;   // llama3: wavelengths below original_context / high are kept
  double beta_fast = 32, beta_slow = 1;  // yarn: rotations bounding the interpolation ramp
  // yarn: the ramp's ends rounded out to whole pairs (floor, ceil), as transformers' `truncate`
  // (default true) and llama.cpp always do; gpt-oss was trained without (transformers' truncate: false).
  bool yarn_truncate = true;
  // Per rotated pair, the divisor of its frequency (rope_dim / 2 of them): llama3 from the file (the
  // `rope_freqs.weight` tensor as llama.cpp's converter writes it; empty: the rule above), or
  // longrope's long or short factors, whichever the context selects.
  std::vector<float> freq_factors;
  bool long_factors = false;       // longrope: the context exceeds the original, the long factors apply
  double attn_factor = 1.0;        // longrope: multiplies cos and sin (<arch>.rope.scaling.attn_factor)
  std::vector<std::string> tensors;  // the tensors read (the weights loader counts them as consumed)
};

// Reads <arch>.rope.scaling.* and the frequency-factor tensors. `rope_dim` sizes the tensor check;
// `context_length` (the model's, <arch>.context_length) chooses longrope's factors as llama.cpp
// does: the long ones when it exceeds the original context, else the short ones. Throws
// fathom::Error naming the key or tensor for an unknown scaling type, a missing or out-of-range
// parameter, or a key whose meaning fathom does not implement.
RopeScaling rope_scaling_from_gguf(const GgufFile& f, const std::string& arch, int32_t rope_dim,
                                   int64_t context_length);

// Whether <arch>.rope.scaling.<suffix> is a key rope_scaling_from_gguf reads (uses, or refuses
// unless neutral): every other rope.scaling key is unknown to fathom.
bool is_rope_scaling_key(std::string_view suffix);

// Radians per position of each rotated pair i < rope_dim / 2 after scaling:
// base^(-2i / rope_dim), then linear: / factor; llama3: / freq_factors[i] or the low/high rule;
// yarn: blended between / factor and unchanged over the ramp [low, high] of beta_fast/beta_slow;
// longrope: / freq_factors[i].
std::vector<double> rope_inv_freq(double base, int32_t rope_dim, const RopeScaling& s);

// What multiplies cos and sin (so q·k by its square): YaRN's 0.1 · ln(factor) + 1; longrope's
// attn_factor; 1 otherwise.
float rope_attention_factor(const RopeScaling& s);

// cos/sin [n_tokens][rope_dim / 2] of `layer`'s rotation at positions pos (cpu::rope_table over
// the layer's frequencies): what both backends rotate q and k by.
void layer_rope_table(const ModelConfig& c, const LayerConfig& layer, const int32_t* pos, int64_t n_tokens,
                      float* cos_out, float* sin_out);

}  // namespace fathom
