#include "engine/model/model_config.h"

#include <cmath>

#include "base/error.h"
#include "engine/model/gguf.h"

namespace fathom {
namespace {

int32_t require_positive(const GgufFile& f, const std::string& key, int64_t max_value) {
  const int64_t v = f.require_int(key);
  if (v <= 0 || v > max_value)
    throw Error(f.path() + ": metadata " + key + " = " + std::to_string(v) + " is out of range");
  return static_cast<int32_t>(v);
}

// Gemma 3 interleaves 5 sliding-window layers with 1 global layer (llama.cpp: swa pattern 6).
constexpr int kGemma3SlidingPattern = 6;
constexpr float kGemma3LocalRopeBase = 10000.0f;

}  // namespace

ModelConfig ModelConfig::from_gguf(const GgufFile& f) {
  ModelConfig c;
  c.arch_name = f.require_string("general.architecture");
  if (c.arch_name == "llama") {
    c.arch = Architecture::kLlama;
  } else if (c.arch_name == "gemma3") {
    c.arch = Architecture::kGemma3;
  } else {
    throw Error(f.path() + ": unsupported architecture '" + c.arch_name + "' (supported: llama, gemma3)");
  }
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

  const float rope_base = static_cast<float>(f.get_float(a + "rope.freq_base").value_or(10000.0));
  c.rope_scaling = rope_scaling_from_gguf(f, c.arch_name, c.rope_dim, c.context_length);
  const LayerConfig global{false, 0, rope_base, rope_inv_freq(rope_base, c.rope_dim, c.rope_scaling),
                           rope_attention_factor(c.rope_scaling)};
  c.layers.assign(c.n_layers, global);
  if (c.arch == Architecture::kGemma3) {
    c.rope_neox = true;
    c.embed_scale = std::sqrt(static_cast<float>(c.dim));
    c.qk_norm = true;
    c.post_norms = true;
    c.activation = Activation::kGeluTanh;
    const int32_t window = require_positive(f, a + "attention.sliding_window", 1 << 24);
    const LayerConfig local{true, window, kGemma3LocalRopeBase,
                            rope_inv_freq(kGemma3LocalRopeBase, c.rope_dim, RopeScaling{}), 1.0f};
    for (int32_t il = 0; il < c.n_layers; ++il) {
      if ((il + 1) % kGemma3SlidingPattern != 0) c.layers[il] = local;
    }
  }
  return c;
}

}  // namespace fathom
