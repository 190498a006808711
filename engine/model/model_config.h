#pragma once
// Model hyperparameters, read entirely from GGUF metadata (<arch>.* keys).
#include <cstdint>
#include <string>
#include <vector>

#include "engine/model/rope_scaling.h"

namespace fathom {

class GgufFile;

enum class Architecture { kLlama, kGemma2, kGemma3, kQwen2, kQwen3, kPhi3, kQwen3Moe, kGptOss };
// Gate activation of the gated MLP: SwiGLU, GeGLU, or gpt-oss's clamped SwiGLU
// ((clamp(up, ±7) + 1) · g·σ(1.702·g) with g = min(gate, 7)).
enum class Activation { kSilu, kGeluTanh, kSwigluOai };
// How an embedding is pooled from the final hidden states (after the final norm) of a prompt's
// positions: their mean, the first (CLS) or the last position's. GGUF's <arch>.pooling_type.
enum class Pooling { kNone, kMean, kCls, kLast };
const char* pooling_name(Pooling p);  // "none", "mean", "cls", "last"

struct LayerConfig {
  bool sliding = false;     // sliding-window attention layer (gemma3's local layers, phi3's every layer)
  int32_t window = 0;       // tokens a query may see, itself included; 0 = unlimited
  float rope_base = 10000;  // RoPE theta for this layer
  // (rope_dim / 2) radians per position of each rotated pair, the model's RoPE scaling applied
  // (rope_inv_freq in engine/model/rope_scaling.h); the angle of pair i at position p is p · this.
  std::vector<double> rope_inv_freq;
  float rope_attn_factor = 1.0f;  // multiplies cos and sin (YaRN's attention factor), 1 otherwise
};

struct ModelConfig {
  Architecture arch = Architecture::kLlama;
  std::string arch_name;
  int32_t n_layers = 0;
  int32_t dim = 0;         // residual stream width
  int32_t n_heads = 0;     // query heads
  int32_t n_kv_heads = 0;  // key/value heads (GQA: n_heads % n_kv_heads == 0)
  int32_t head_dim = 0;    // per head, for q, k and v
  int32_t ffn_dim = 0;
  int32_t vocab = 0;
  int32_t context_length = 0;
  int32_t rope_dim = 0;    // dimensions rotated per head (<= head_dim)
  bool rope_neox = false;  // rotate (i, i + rope_dim/2) pairs instead of adjacent (2i, 2i+1)
  float rms_eps = 1e-5f;
  float embed_scale = 1.0f;  // gemma: sqrt(dim)
  // Added to every RMSNorm weight at load (fathom.norm_offset): 1 for a Gemma checkpoint's norms,
  // stored as w where the model multiplies by 1 + w (a GGUF holds 1 + w, as llama.cpp's converter
  // writes it: 0).
  float norm_offset = 0.0f;
  float attn_scale = 0.0f;   // logit scale, 1/sqrt(head_dim) unless the model says otherwise
  // Soft-capping (gemma2): attention logits become cap·tanh(logit / cap) (LogitScale), the output
  // logits final·tanh(logit / final); 0: none. A capped model decodes densely (the sparse
  // policies' kernels do not cap).
  float attn_softcap = 0.0f;
  float final_softcap = 0.0f;
  // gpt-oss: per layer and query head a sink logit in every attention softmax (LayerWeights::
  // attn_sinks; a model with sinks decodes densely, like a capped one), and biases on the
  // attention output, the router and every expert's three matrices.
  bool attn_sinks = false;
  bool qk_norm = false;      // RMSNorm over head_dim on q and k (gemma3, qwen3)
  bool fused_gate_up = false;  // the gate and up projections are one ffn_up tensor of 2·ffn_dim rows (phi3)
  bool post_norms = false;   // RMSNorm on the attention and MLP outputs before the residual add
  Activation activation = Activation::kSilu;
  Pooling pooling = Pooling::kNone;  // an embedding model's pooling (<arch>.pooling_type); none for generative models
  // Mixture of experts (qwen3moe; llama with <arch>.expert_count > 0, i.e. Mixtral): every layer's
  // MLP is n_experts gated MLPs of expert_ffn_dim; per token a router (softmax over n_experts
  // logits) picks the n_experts_used most probable and weighs their outputs by those
  // probabilities renormalised to sum 1 (both families' transformers code). 0: a dense MLP.
  int32_t n_experts = 0;
  int32_t n_experts_used = 0;
  int32_t expert_ffn_dim = 0;
  RopeScaling rope_scaling;  // of the global layers (gemma3's local layers rotate unscaled)
  std::vector<LayerConfig> layers;

  int32_t q_dim() const { return n_heads * head_dim; }
  int32_t kv_dim() const { return n_kv_heads * head_dim; }
  int32_t group_size() const { return n_heads / n_kv_heads; }
  bool moe() const { return n_experts > 0; }

  // Throws fathom::Error for an unknown architecture, missing/inconsistent metadata, or an <arch>.*
  // key fathom does not implement (docs/models.md).
  static ModelConfig from_gguf(const GgufFile& file);
};

// What llama.cpp fixes for Gemma 2 and 3 where no GGUF key says it, and a Hugging Face directory's
// config.json must say too (hf_config.cpp refuses any other value by name).
namespace gemma {
// Gemma 2: every other layer a sliding window, the first one sliding (llama.cpp: swa pattern 2).
// Gemma 3: 5 sliding-window layers to 1 global (pattern 6).
constexpr int kGemma2SlidingPattern = 2;
constexpr int kGemma3SlidingPattern = 6;
// Gemma 3's sliding layers rotate by plain RoPE of this base (the global ones by rope.freq_base,
// scaled).
constexpr float kGemma3LocalRopeBase = 10000.0f;
inline bool layer_slides(Architecture arch, int32_t il) {
  return (il + 1) % (arch == Architecture::kGemma2 ? kGemma2SlidingPattern : kGemma3SlidingPattern) != 0;
}
// transformers' query_pre_attn_scalar, which no GGUF key carries: attention logits are scaled by its
// -1/2 power. head_dim for every size but the 27B ones, where it is dim / n_heads (Gemma 2 27B: 144
// with head_dim 128; Gemma 3 27B: 168 with head_dim 128); llama.cpp tells the 27B models by their
// layer count (46 and 62), and so does fathom.
inline int32_t query_pre_attn_scalar(Architecture arch, int32_t n_layers, int32_t dim, int32_t n_heads,
                                     int32_t head_dim) {
  const int32_t layers_27b = arch == Architecture::kGemma2 ? 46 : 62;
  return n_layers == layers_27b ? dim / n_heads : head_dim;
}
}  // namespace gemma

// gpt-oss's clamped SwiGLU, which no GGUF key carries (llama.cpp fixes it, and fathom's kernels:
// cpu::swiglu_oai_mul, the CUDA GluKind::kSwiGluOai): transformers' swiglu_alpha and swiglu_limit.
namespace gpt_oss {
constexpr double kSwigluAlpha = 1.702;
constexpr double kSwigluLimit = 7.0;
// Every other layer a sliding window, the first one sliding (llama.cpp lays gpt-oss out so).
inline bool layer_slides(int64_t il) { return il % 2 == 0; }
}  // namespace gpt_oss

}  // namespace fathom
