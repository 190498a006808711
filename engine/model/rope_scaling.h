#pragma once
// RoPE frequencies with context-extension scaling, read from GGUF metadata (<arch>.rope.*) and the
// optional `rope_freqs.weight` tensor. The formulas are Hugging Face transformers'
// (modeling_rope_utils.py: linear, llama3, yarn) so that a file converted from a HF checkpoint
// rotates as the checkpoint does; docs/models.md lists what is supported and what is refused.
#include <cstdint>
#include <string>
#include <vector>

namespace fathom {

class GgufFile;
struct ModelConfig;
struct LayerConfig;

enum class RopeScalingType { kNone, kLinear, kLlama3, kYarn };

const char* rope_scaling_name(RopeScalingType t);  // "none", "linear", "llama3", "yarn"

struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  double factor = 1.0;             // context extension factor (linear, llama3, yarn)
  double original_context = 0;     // tokens the model was pretrained on (llama3, yarn)
  double low_freq_factor = 1.0;    // llama3: wavelengths above original_context / low are divided by factor
  double high_freq_factor = 4.0;   // llama3: wavelengths below original_context / high are kept
  double beta_fast = 32, beta_slow = 1;  // yarn: rotations bounding the interpolation ramp
  // llama3 from the file: per rotated pair, the divisor of its frequency ((rope_dim / 2), the
  // `rope_freqs.weight` tensor as llama.cpp's converter writes it). Empty: the rule above.
  std::vector<float> freq_factors;
};

// Reads <arch>.rope.scaling.* and `rope_freqs.weight`. `rope_dim` sizes the tensor check. Throws
// fathom::Error naming the key or tensor for an unknown scaling type, a missing or out-of-range
// parameter, or a key whose meaning fathom does not implement.
RopeScaling rope_scaling_from_gguf(const GgufFile& f, const std::string& arch, int32_t rope_dim);

// Radians per position of each rotated pair i < rope_dim / 2 after scaling:
// base^(-2i / rope_dim), then linear: / factor; llama3: / freq_factors[i] or the low/high rule;
// yarn: blended between / factor and unchanged over the ramp [low, high] of beta_fast/beta_slow.
std::vector<double> rope_inv_freq(double base, int32_t rope_dim, const RopeScaling& s);

// What multiplies cos and sin (so q·k by its square): YaRN's 0.1 · ln(factor) + 1; 1 otherwise.
float rope_attention_factor(const RopeScaling& s);

// cos/sin [n_tokens][rope_dim / 2] of `layer`'s rotation at positions pos (cpu::rope_table over
// the layer's frequencies): what both backends rotate q and k by.
void layer_rope_table(const ModelConfig& c, const LayerConfig& layer, const int32_t* pos, int64_t n_tokens,
                      float* cos_out, float* sin_out);

}  // namespace fathom
