#include "engine/model/model_config.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <string_view>

#include "base/error.h"
#include "engine/model/gguf.h"

namespace fathom {
namespace {

struct ArchInfo {
  const char* name;  // general.architecture, and the prefix of its keys
  Architecture arch;
  bool reads_sliding_window;  // <arch>.attention.sliding_window: gemma2/3's local layers, phi3's and llama's every layer
  bool reads_experts;         // <arch>.expert_count, expert_used_count: qwen3moe, and llama as Mixtral
};
constexpr ArchInfo kArchs[] = {{"llama", Architecture::kLlama, true, true},
                               {"gemma2", Architecture::kGemma2, true, false},
                               {"gemma3", Architecture::kGemma3, true, false},
                               {"qwen2", Architecture::kQwen2, false, false},
                               {"qwen3", Architecture::kQwen3, false, false},
                               {"phi3", Architecture::kPhi3, true, false},
                               {"qwen3moe", Architecture::kQwen3Moe, false, true},
                               {"gpt-oss", Architecture::kGptOss, true, true}};

// Mixture-of-experts architectures fathom does not load, and the part of them it lacks.
struct RefusedMoe {
  const char* name;
  const char* lacks;
};
constexpr RefusedMoe kRefusedMoe[] = {
    {"qwen2moe", "shared experts (ffn_*_shexp) and their sigmoid gate"},
    {"deepseek", "shared experts"},
    {"deepseek2", "shared experts, grouped top-k routing and multi-head latent attention"},
    {"grok", "expert and attention soft-capping"},
    {"dbrx", "fused QKV clipping and its expert layout"},
    {"olmoe", "its QK norm over the whole projection"},
};

// The <arch>.* keys from_gguf reads (and `vocab_size`, which the embedding's rows restate), besides
// the rope.scaling.* keys rope_scaling.cpp reads. Any other key of the architecture — a sliding
// window where the architecture has none, logit soft-capping, experts — is a
// hyperparameter fathom does not implement: a load error naming it, not a model that runs without it.
constexpr std::string_view kKnownKeys[] = {
    "block_count", "context_length", "embedding_length", "feed_forward_length", "vocab_size",
    "attention.head_count", "attention.head_count_kv", "attention.key_length", "attention.value_length",
    "attention.layer_norm_rms_epsilon", "rope.dimension_count", "rope.freq_base", "pooling_type"};

void refuse_unknown_keys(const GgufFile& f, const ArchInfo& a) {
  const std::string prefix = std::string(a.name) + ".";
  constexpr std::string_view kScaling = "rope.scaling.", kWindow = "attention.sliding_window";
  for (const auto& entry : f.metadata()) {
    const std::string& key = entry.first;
    if (!key.starts_with(prefix)) continue;
    const std::string_view k = std::string_view(key).substr(prefix.size());
    if (std::find(std::begin(kKnownKeys), std::end(kKnownKeys), k) != std::end(kKnownKeys)) continue;
    if (k.starts_with(kScaling) && is_rope_scaling_key(k.substr(kScaling.size()))) continue;
    if (k == kWindow && (a.reads_sliding_window || f.get_int(key) == 0)) continue;  // 0: no window
    // Dense files of some converters say they have no experts; old llama conversions record how
    // they permuted Q and K (informational: llama.cpp reads neither).
    if ((k == "expert_count" || k == "expert_used_count") && (a.reads_experts || f.get_int(key) == 0)) continue;
    if (k == "expert_feed_forward_length" && (a.arch == Architecture::kQwen3Moe || a.arch == Architecture::kGptOss))
      continue;
    if (k == "tensor_data_layout") continue;
    if ((k == "attn_logit_softcapping" || k == "final_logit_softcapping") && a.arch == Architecture::kGemma2) continue;
    throw Error(f.path() + ": metadata " + key + " is not supported by fathom's " + a.name +
                (k == kWindow ? " (sliding-window attention)" : "") +
                ": a hyperparameter it does not implement, refused rather than ignored");
  }
}

int32_t require_positive(const GgufFile& f, const std::string& key, int64_t max_value) {
  const int64_t v = f.require_int(key);
  if (v <= 0 || v > max_value)
    throw Error(f.path() + ": metadata " + key + " = " + std::to_string(v) + " is out of range");
  return static_cast<int32_t>(v);
}

// What llama.cpp assumes where a gemma2 file omits them (Gemma 2's released configs).
constexpr int64_t kGemma2DefaultWindow = 4096;
constexpr double kGemma2DefaultAttnSoftcap = 50.0, kGemma2DefaultFinalSoftcap = 30.0;

float gemma_attn_scale(const ModelConfig& c) {
  const int32_t scalar = gemma::query_pre_attn_scalar(c.arch, c.n_layers, c.dim, c.n_heads, c.head_dim);
  return 1.0f / std::sqrt(static_cast<float>(scalar));
}

// A positive, finite soft cap from `key` (or `fallback` when the file has none).
float softcap_from_gguf(const GgufFile& f, const std::string& key, double fallback) {
  const double v = f.get_float(key).value_or(fallback);
  if (!(v > 0.0) || !std::isfinite(v) || v > 1e6)
    throw Error(f.path() + ": metadata " + key + " = " + std::to_string(v) + " is not a positive soft cap");
  return static_cast<float>(v);
}

// llama.cpp's enum llama_pooling_type: 0 none, 1 mean, 2 cls, 3 last, 4 rank (a reranker's
// classification head, which fathom does not have).
Pooling pooling_from_gguf(const GgufFile& f, const std::string& key) {
  const int64_t v = f.get_int(key).value_or(0);
  switch (v) {
    case 0: return Pooling::kNone;
    case 1: return Pooling::kMean;
    case 2: return Pooling::kCls;
    case 3: return Pooling::kLast;
    default:
      throw Error(f.path() + ": metadata " + key + " = " + std::to_string(v) +
                  (v == 4 ? " (rank: a reranker's classification head) is not supported by fathom"
                          : " is not a pooling type (0 none, 1 mean, 2 cls, 3 last)"));
  }
}

// <arch>.expert_count (0 or absent: dense), expert_used_count (the router's top-k) and, for
// qwen3moe, expert_feed_forward_length (each expert's ffn width; Mixtral's experts are
// feed_forward_length wide).
void read_experts(const GgufFile& f, const std::string& a, ModelConfig& c) {
  constexpr int64_t kMaxExperts = 1024;
  const int64_t n = f.get_int(a + "expert_count").value_or(0);
  if (n == 0) return;
  c.n_experts = require_positive(f, a + "expert_count", kMaxExperts);
  c.n_experts_used = require_positive(f, a + "expert_used_count", c.n_experts);
  c.expert_ffn_dim = c.arch == Architecture::kQwen3Moe || c.arch == Architecture::kGptOss
                         ? require_positive(f, a + "expert_feed_forward_length", 1 << 20)
                         : c.ffn_dim;
}

}  // namespace

const char* pooling_name(Pooling p) {
  switch (p) {
    case Pooling::kNone: return "none";
    case Pooling::kMean: return "mean";
    case Pooling::kCls: return "cls";
    case Pooling::kLast: return "last";
  }
  return "?";
}

ModelConfig ModelConfig::from_gguf(const GgufFile& f) {
  ModelConfig c;
  c.arch_name = f.require_string("general.architecture");
  const auto info =
      std::find_if(std::begin(kArchs), std::end(kArchs), [&](const ArchInfo& a) { return c.arch_name == a.name; });
  if (info == std::end(kArchs)) {
    const auto moe = std::find_if(std::begin(kRefusedMoe), std::end(kRefusedMoe),
                                  [&](const RefusedMoe& m) { return c.arch_name == m.name; });
    throw Error(f.path() + ": unsupported architecture '" + c.arch_name + "'" +
                (moe != std::end(kRefusedMoe) ? std::string(" (a mixture of experts with ") + moe->lacks +
                                                    ", which fathom does not implement)"
                                              : std::string()) +
                " (supported: llama and Mixtral-style llama with experts, gemma2, gemma3, qwen2, qwen3, qwen3moe, phi3, gpt-oss)");
  }
  c.arch = info->arch;
  refuse_unknown_keys(f, *info);
  const std::string a = c.arch_name + ".";
  constexpr int64_t kMaxDim = 1 << 20;
  c.n_layers = require_positive(f, a + "block_count", 4096);
  c.dim = require_positive(f, a + "embedding_length", kMaxDim);
  c.n_heads = require_positive(f, a + "attention.head_count", 4096);
  c.n_kv_heads = c.n_heads;
  if (f.find(a + "attention.head_count_kv")) c.n_kv_heads = require_positive(f, a + "attention.head_count_kv", 4096);
  if (c.n_heads % c.n_kv_heads != 0)
    throw Error(f.path() + ": head_count " + std::to_string(c.n_heads) + " is not a multiple of head_count_kv " +
                std::to_string(c.n_kv_heads));
  c.head_dim = c.dim / c.n_heads;
  if (f.find(a + "attention.key_length")) c.head_dim = require_positive(f, a + "attention.key_length", 4096);
  if (f.find(a + "attention.value_length") && f.require_int(a + "attention.value_length") != c.head_dim)
    throw Error(f.path() + ": key_length != value_length is not supported");
  if (c.head_dim % 2 != 0) throw Error(f.path() + ": head dimension must be even");
  c.ffn_dim = require_positive(f, a + "feed_forward_length", kMaxDim);
  c.context_length = require_positive(f, a + "context_length", 1 << 24);
  c.rms_eps = static_cast<float>(f.require_float(a + "attention.layer_norm_rms_epsilon"));
  c.rope_dim = c.head_dim;
  if (f.find(a + "rope.dimension_count")) c.rope_dim = require_positive(f, a + "rope.dimension_count", c.head_dim);
  c.attn_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  c.pooling = pooling_from_gguf(f, a + "pooling_type");
  // A Hugging Face Gemma directory's norms are w for a model multiplying by 1 + w (hf_config.cpp).
  c.norm_offset = static_cast<float>(f.get_float("fathom.norm_offset").value_or(0.0));
  if (!std::isfinite(c.norm_offset)) throw Error(f.path() + ": metadata fathom.norm_offset is not finite");

  const float rope_base = static_cast<float>(f.get_float(a + "rope.freq_base").value_or(10000.0));
  c.rope_scaling = rope_scaling_from_gguf(f, c.arch_name, c.rope_dim, c.context_length);
  if (c.arch == Architecture::kGptOss) c.rope_scaling.yarn_truncate = false;  // as trained (rope_scaling.h)
  const LayerConfig global{false, 0, rope_base, rope_inv_freq(rope_base, c.rope_dim, c.rope_scaling),
                           rope_attention_factor(c.rope_scaling)};
  c.layers.assign(c.n_layers, global);
  // llama.cpp's converter permutes llama's Q and K rows for adjacent-pair rotation; the other
  // architectures keep the checkpoint's rotate-half (NEOX) layout. fathom.rope_neox says which a
  // file holds where that differs: a Hugging Face llama's rows as the checkpoint has them (hf_config.cpp).
  c.rope_neox = f.get_bool("fathom.rope_neox").value_or(c.arch != Architecture::kLlama);
  if (c.arch == Architecture::kQwen3 || c.arch == Architecture::kQwen3Moe) c.qk_norm = true;
  if (info->reads_experts) read_experts(f, a, c);
  if (c.arch == Architecture::kPhi3) c.fused_gate_up = true;
  if (c.arch == Architecture::kPhi3 || c.arch == Architecture::kLlama) {
    // One window on every layer, as transformers applies Phi-3-mini's (2047 of 4096) and Mistral
    // 7B v0.1's (4096; llama.cpp ignores both, and its converter does not write Mistral's); 0
    // (Phi-4, every other llama) or a window as long as the context changes nothing.
    const int64_t window = f.get_int(a + "attention.sliding_window").value_or(0);
    if (window < 0 || window > (1 << 24))
      throw Error(f.path() + ": metadata " + a + "attention.sliding_window = " + std::to_string(window) +
                  " is out of range");
    if (window > 0 && window < c.context_length)
      for (LayerConfig& l : c.layers) l.sliding = true, l.window = static_cast<int32_t>(window);
  }
  if (c.arch == Architecture::kGemma2) {
    // Gemma 2: Gemma 3's layer layout without the QK norms, every other layer a sliding window
    // (one RoPE base for all), attention and final logits soft-capped.
    c.embed_scale = std::sqrt(static_cast<float>(c.dim));
    c.post_norms = true;
    c.activation = Activation::kGeluTanh;
    c.attn_scale = gemma_attn_scale(c);
    c.attn_softcap = softcap_from_gguf(f, a + "attn_logit_softcapping", kGemma2DefaultAttnSoftcap);
    c.final_softcap = softcap_from_gguf(f, a + "final_logit_softcapping", kGemma2DefaultFinalSoftcap);
    const int64_t window = f.get_int(a + "attention.sliding_window").value_or(kGemma2DefaultWindow);
    if (window <= 0 || window > (1 << 24))
      throw Error(f.path() + ": metadata " + a + "attention.sliding_window = " + std::to_string(window) +
                  " is out of range");
    for (int32_t il = 0; il < c.n_layers; ++il)
      if (gemma::layer_slides(c.arch, il))
        c.layers[il].sliding = true, c.layers[il].window = static_cast<int32_t>(window);
  }
  if (c.arch == Architecture::kGptOss) {
    // gpt-oss: every other layer a sliding window (the first one sliding; 128 tokens), attention
    // sinks, biases (attention, router, experts), the clamped SwiGLU, experts of
    // expert_feed_forward_length.
    if (!c.moe()) throw Error(f.path() + ": gpt-oss without " + a + "expert_count");
    c.attn_sinks = true;
    c.activation = Activation::kSwigluOai;
    const int32_t window = require_positive(f, a + "attention.sliding_window", 1 << 24);
    for (int32_t il = 0; il < c.n_layers; ++il)
      if (gpt_oss::layer_slides(il)) c.layers[il].sliding = true, c.layers[il].window = window;
  }
  if (c.arch == Architecture::kGemma3) {
    c.embed_scale = std::sqrt(static_cast<float>(c.dim));
    c.qk_norm = true;
    c.post_norms = true;
    c.activation = Activation::kGeluTanh;
    c.attn_scale = gemma_attn_scale(c);
    const int32_t window = require_positive(f, a + "attention.sliding_window", 1 << 24);
    const LayerConfig local{true, window, gemma::kGemma3LocalRopeBase,
                            rope_inv_freq(gemma::kGemma3LocalRopeBase, c.rope_dim, RopeScaling{}), 1.0f};
    for (int32_t il = 0; il < c.n_layers; ++il)
      if (gemma::layer_slides(c.arch, il)) c.layers[il] = local;
  }
  return c;
}

}  // namespace fathom
