// qwen2, qwen3 and phi3 as the loader reads them (engine/model/model_config.cpp, weights.cpp), on
// tiny in-memory GGUF models: each architecture's layout (biases, QK norms, explicit head_dim,
// phi3's fused tensors as row views, its window and longrope factors) and what is refused by name —
// a tensor the loader does not use, an <arch>.* key fathom does not implement. The logits against
// transformers: tests/kernel/test_cuda_arch_fixtures.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include "base/error.h"
#include "engine/model/gguf.h"
#include "engine/model/model_config.h"
#include "engine/model/weights.h"
#include "tests/unit/gguf_writer.h"

namespace fathom {
namespace {

using Value = std::variant<uint32_t, float, std::string>;

// A model file in memory: metadata and f32 tensors (element i of every tensor is 0.01 · (i % 7 + 1)
// unless given), laid out as the spec says.
class ModelImage {
 public:
  ModelImage& set(const std::string& key, Value v) {
    kvs_[key] = std::move(v);
    return *this;
  }
  ModelImage& tensor(const std::string& name, std::vector<uint64_t> dims, std::vector<float> values = {}) {
    uint64_t n = 1;
    for (uint64_t d : dims) n *= d;
    if (values.empty())
      for (uint64_t i = 0; i < n; ++i) values.push_back(0.01f * static_cast<float>(i % 7 + 1));
    tensors_[name] = {std::move(dims), std::move(values)};
    return *this;
  }
  ModelImage& drop(const std::string& name) {
    kvs_.erase(name);
    tensors_.erase(name);
    return *this;
  }
  const GgufFile& file() {
    test::Writer w;
    w.header(3, tensors_.size(), kvs_.size());
    for (const auto& [key, v] : kvs_) {
      if (const auto* u = std::get_if<uint32_t>(&v)) w.kv(key, GgufValueType::UINT32, *u);
      if (const auto* f = std::get_if<float>(&v)) w.kv(key, GgufValueType::FLOAT32, *f);
      if (const auto* s = std::get_if<std::string>(&v)) w.kv_str(key, *s);
    }
    uint64_t offset = 0;
    for (const auto& [name, t] : tensors_) {
      w.tensor(name, t.first, /*F32*/ 0, offset);
      offset += (t.second.size() * sizeof(float) + 31) / 32 * 32;
    }
    w.pad(32);
    for (const auto& [name, t] : tensors_) {
      for (float x : t.second) w.put(x);
      w.pad(32);
    }
    bytes_ = std::move(w.bytes);
    file_ = GgufFile::parse(bytes_.data(), bytes_.size(), "tiny-model");
    return *file_;
  }

 private:
  std::map<std::string, Value> kvs_;
  std::map<std::string, std::pair<std::vector<uint64_t>, std::vector<float>>> tensors_;
  std::vector<uint8_t> bytes_;
  std::unique_ptr<GgufFile> file_;
};

constexpr uint64_t kDim = 8, kFfn = 12, kVocab = 10;

// One layer, 2 query heads over 1 KV head of 4 dims (qwen3: 6, so q_dim 12 != dim 8), as
// llama.cpp's converter lays each architecture out.
ModelImage tiny(const std::string& arch) {
  ModelImage m;
  const std::string a = arch + ".";
  m.set("general.architecture", arch).set(a + "block_count", 1u).set(a + "context_length", 64u);
  m.set(a + "embedding_length", static_cast<uint32_t>(kDim));
  m.set(a + "feed_forward_length", static_cast<uint32_t>(kFfn));
  m.set(a + "attention.head_count", 2u).set(a + "attention.head_count_kv", 1u);
  m.set(a + "attention.layer_norm_rms_epsilon", 1e-6f).set(a + "rope.freq_base", 10000.0f);
  uint64_t head_dim = 4;
  const bool qwen3 = arch == "qwen3" || arch == "qwen3moe";
  if (qwen3) {
    head_dim = 6;
    m.set(a + "attention.key_length", 6u).set(a + "attention.value_length", 6u);
  }
  const uint64_t q = 2 * head_dim, kv = head_dim;
  m.tensor("token_embd.weight", {kDim, kVocab}).tensor("output_norm.weight", {kDim});
  m.tensor("blk.0.attn_norm.weight", {kDim}).tensor("blk.0.ffn_norm.weight", {kDim});
  m.tensor("blk.0.attn_output.weight", {q, kDim}).tensor("blk.0.ffn_down.weight", {kFfn, kDim});
  if (arch == "phi3") {
    m.tensor("blk.0.attn_qkv.weight", {kDim, q + 2 * kv}).tensor("blk.0.ffn_up.weight", {kDim, 2 * kFfn});
    m.set(a + "rope.scaling.original_context_length", 64u).set(a + "rope.dimension_count", 4u);
    m.set(a + "attention.sliding_window", 16u);
  } else {
    m.tensor("blk.0.attn_q.weight", {kDim, q}).tensor("blk.0.attn_k.weight", {kDim, kv});
    m.tensor("blk.0.attn_v.weight", {kDim, kv});
    m.tensor("blk.0.ffn_gate.weight", {kDim, kFfn}).tensor("blk.0.ffn_up.weight", {kDim, kFfn});
  }
  if (arch == "qwen2")
    m.tensor("blk.0.attn_q.bias", {q}).tensor("blk.0.attn_k.bias", {kv}).tensor("blk.0.attn_v.bias", {kv});
  if (qwen3) m.tensor("blk.0.attn_q_norm.weight", {head_dim}).tensor("blk.0.attn_k_norm.weight", {head_dim});
  return m;
}

std::string refusal(ModelImage& m) {
  try {
    const GgufFile& f = m.file();
    ModelWeights::from_gguf(f, ModelConfig::from_gguf(f));
  } catch (const Error& e) {
    return e.what();
  }
  return "(loaded)";
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

const uint8_t* bytes(const WeightMatrix& m) { return static_cast<const uint8_t*>(m.data); }

TEST(ArchConfig, Qwen2BiasesAndNeoxRope) {
  ModelImage m = tiny("qwen2");
  m.tensor("blk.0.attn_k.bias", {4}, {1, 2, 3, 4});
  const GgufFile& f = m.file();
  const ModelConfig c = ModelConfig::from_gguf(f);
  EXPECT_EQ(c.arch, Architecture::kQwen2);
  EXPECT_TRUE(c.rope_neox);
  EXPECT_FALSE(c.qk_norm);
  const ModelWeights w = ModelWeights::from_gguf(f, c);
  EXPECT_EQ(w.output.data, w.token_embd.data);  // tied
  EXPECT_EQ(w.layers[0].bq.size(), 8u);
  EXPECT_EQ(w.layers[0].bk, (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(w.layers[0].bv.size(), 4u);
}

TEST(ArchConfig, Qwen3QkNormsAndExplicitHeadDim) {
  ModelImage m = tiny("qwen3");
  const GgufFile& f = m.file();
  const ModelConfig c = ModelConfig::from_gguf(f);
  EXPECT_TRUE(c.rope_neox);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.head_dim, 6);
  EXPECT_EQ(c.q_dim(), 12);
  EXPECT_EQ(c.rope_dim, 6);
  const ModelWeights w = ModelWeights::from_gguf(f, c);
  EXPECT_EQ(w.layers[0].q_norm.size(), 6u);
  EXPECT_EQ(w.layers[0].wo.cols, 12);
  EXPECT_TRUE(w.layers[0].bq.empty());
  // Without its QK norms a qwen3 file is incomplete.
  m.drop("blk.0.attn_k_norm.weight");
  EXPECT_TRUE(has(refusal(m), "'blk.0.attn_k_norm.weight'")) << refusal(m);
}

TEST(ArchConfig, Phi3FusedTensorsAreRowViews) {
  ModelImage m = tiny("phi3");
  std::vector<float> bias(16);
  for (size_t i = 0; i < bias.size(); ++i) bias[i] = static_cast<float>(i);
  m.tensor("blk.0.attn_qkv.bias", {16}, bias);
  const GgufFile& f = m.file();
  const ModelConfig c = ModelConfig::from_gguf(f);
  EXPECT_TRUE(c.rope_neox);
  EXPECT_TRUE(c.fused_gate_up);
  EXPECT_EQ(c.rope_dim, 4);
  for (const LayerConfig& l : c.layers) {
    EXPECT_TRUE(l.sliding);
    EXPECT_EQ(l.window, 16);
  }
  const ModelWeights w = ModelWeights::from_gguf(f, c);
  const LayerWeights& L = w.layers[0];
  const uint8_t* qkv = f.find_tensor("blk.0.attn_qkv.weight")->data;
  const size_t row = kDim * sizeof(float);
  EXPECT_EQ(bytes(L.wq), qkv);
  EXPECT_EQ(bytes(L.wk), qkv + 8 * row);
  EXPECT_EQ(bytes(L.wv), qkv + 12 * row);
  EXPECT_EQ(L.wq.rows, 8);
  EXPECT_EQ(L.wk.rows, 4);
  EXPECT_EQ(L.wv.rows, 4);
  const uint8_t* gate_up = f.find_tensor("blk.0.ffn_up.weight")->data;
  EXPECT_EQ(bytes(L.w_gate), gate_up);  // the gate rows first, as transformers' gate_up_proj
  EXPECT_EQ(bytes(L.w_up), gate_up + kFfn * row);
  EXPECT_EQ(L.w_gate.rows, static_cast<int64_t>(kFfn));
  EXPECT_EQ(L.w_up.rows, static_cast<int64_t>(kFfn));
  EXPECT_EQ(L.bq, std::vector<float>(bias.begin(), bias.begin() + 8));
  EXPECT_EQ(L.bk, std::vector<float>(bias.begin() + 8, bias.begin() + 12));
  EXPECT_EQ(L.bv, std::vector<float>(bias.begin() + 12, bias.end()));
  EXPECT_EQ(w.matrix_bytes, (16 + 8 + 24 + 12 + 10) * row);  // qkv, o, gate and up, down, output

  // A window as long as the context, or 0 (Phi-4), is no window.
  for (uint32_t window : {0u, 64u}) {
    m.set("phi3.attention.sliding_window", window);
    EXPECT_FALSE(ModelConfig::from_gguf(m.file()).layers[0].sliding) << window;
  }
}

TEST(ArchConfig, Phi3LongropeFactorsByContext) {
  ModelImage m = tiny("phi3");
  m.tensor("rope_factors_long.weight", {2}, {2, 8}).tensor("rope_factors_short.weight", {2}, {1, 1.5f});
  m.set("phi3.rope.scaling.attn_factor", 1.25f).set("phi3.rope.scaling.original_context_length", 32u);
  // rope_dim 4: frequencies 1 and 10000^(-1/2), each divided by its factor
  const std::vector<double> plain{1.0, std::pow(10000.0, -0.5)};
  for (const auto& [context, factors] : std::vector<std::pair<uint32_t, std::vector<double>>>{
           {64, {2, 8}}, {32, {1, 1.5}}}) {
    m.set("phi3.context_length", context);
    const GgufFile& f = m.file();
    const ModelConfig c = ModelConfig::from_gguf(f);
    EXPECT_EQ(c.rope_scaling.type, RopeScalingType::kLongrope);
    EXPECT_EQ(c.rope_scaling.long_factors, context > 32) << context;
    for (size_t i = 0; i < 2; ++i)
      EXPECT_NEAR(c.layers[0].rope_inv_freq[i], plain[i] / factors[i], 1e-12) << context << " pair " << i;
    EXPECT_FLOAT_EQ(c.layers[0].rope_attn_factor, 1.25f);
    EXPECT_NO_THROW(ModelWeights::from_gguf(f, c));  // both factor tensors consumed
  }
  m.drop("rope_factors_short.weight");
  EXPECT_TRUE(has(refusal(m), "rope_factors_short.weight")) << refusal(m);
  m.tensor("rope_factors_short.weight", {3});
  EXPECT_TRUE(has(refusal(m), "'rope_factors_short.weight' has 3 elements")) << refusal(m);
}

TEST(ArchConfig, Phi3GateUpMustBeFused) {
  ModelImage m = tiny("phi3");
  m.tensor("blk.0.ffn_up.weight", {kDim, kFfn});
  EXPECT_TRUE(has(refusal(m), "'blk.0.ffn_up.weight' has shape [8, 12], expected [8, 24]")) << refusal(m);
  m = tiny("phi3");
  m.tensor("blk.0.ffn_gate.weight", {kDim, kFfn});
  EXPECT_TRUE(has(refusal(m), "'blk.0.ffn_gate.weight'")) << refusal(m);
}

TEST(ArchConfig, TensorsTheLoaderDoesNotUseAreRefusedByName) {
  for (const char* arch : {"qwen2", "qwen3", "phi3"}) {
    ModelImage m = tiny(arch);
    ASSERT_EQ(refusal(m), "(loaded)") << arch;
    m.tensor("blk.0.ffn_down.bias", {kDim});  // an MLP bias: no kernel adds it
    const std::string r = refusal(m);
    EXPECT_TRUE(has(r, "'blk.0.ffn_down.bias'") && has(r, "does not use")) << arch << ": " << r;
  }
  // The attention output's bias is read (llama's attention_bias, gpt-oss).
  ModelImage with_bo = tiny("qwen2");
  with_bo.tensor("blk.0.attn_output.bias", {kDim});
  const GgufFile& f = with_bo.file();
  EXPECT_EQ(ModelWeights::from_gguf(f, ModelConfig::from_gguf(f)).layers[0].bo.size(), kDim);
  // Both a fused QKV and separate Q, K, V: the separate ones would be ignored.
  ModelImage both = tiny("phi3");
  both.tensor("blk.0.attn_q.weight", {kDim, 8});
  EXPECT_TRUE(has(refusal(both), "'blk.0.attn_q.weight'")) << refusal(both);
}

TEST(ArchConfig, KeysFathomDoesNotImplementAreRefusedByName) {
  const std::vector<std::tuple<std::string, std::string, Value>> cases{
      {"qwen2", "qwen2.attention.sliding_window", 4096u},  // use_sliding_window: layers past max_window_layers
      {"qwen3", "qwen3.expert_count", 8u},                  // qwen3moe's, not qwen3's
      {"phi3", "phi3.attn_logit_softcapping", 30.0f},
      {"qwen3", "qwen3.rope.scaling.mystery", 1.0f}};
  for (const auto& [arch, key, value] : cases) {
    ModelImage m = tiny(arch);
    m.set(key, value);
    const std::string r = refusal(m);
    EXPECT_TRUE(has(r, "metadata " + key + " is not supported by fathom's " + arch)) << r;
  }
  // An embedding model's pooling is read (1 mean, 2 CLS, 3 last); 4, a reranker's head, is refused.
  ModelImage pooled = tiny("qwen2");
  EXPECT_EQ(ModelConfig::from_gguf(pooled.set("qwen2.pooling_type", 3u).file()).pooling, Pooling::kLast);
  EXPECT_EQ(ModelConfig::from_gguf(pooled.set("qwen2.pooling_type", 1u).file()).pooling, Pooling::kMean);
  EXPECT_TRUE(has(refusal(pooled.set("qwen2.pooling_type", 4u)), "qwen2.pooling_type = 4 (rank")) << refusal(pooled);
  EXPECT_TRUE(has(refusal(pooled.set("qwen2.pooling_type", 9u)), "is not a pooling type")) << refusal(pooled);
  ModelImage window = tiny("qwen2");
  EXPECT_TRUE(has(refusal(window.set("qwen2.attention.sliding_window", 4096u)), "sliding-window attention"));
  EXPECT_EQ(refusal(window.set("qwen2.attention.sliding_window", 0u)), "(loaded)");  // 0: none
  // What dense files of other converters carry and mean nothing by: no experts, Q/K layout notes.
  ModelImage benign = tiny("qwen2");
  benign.set("qwen2.expert_count", 0u).set("qwen2.expert_used_count", 0u);
  benign.set("qwen2.tensor_data_layout", std::string("Meta AI original pth"));
  EXPECT_EQ(refusal(benign), "(loaded)");
  EXPECT_TRUE(has(refusal(benign.set("qwen2.expert_count", 8u)), "qwen2.expert_count")) << refusal(benign);
}

// Mistral 7B v0.1 as a GGUF with its window: every layer slides; 0 or the context's length is none.
TEST(ArchConfig, LlamaWindowIsEveryLayers) {
  ModelImage m = tiny("llama");
  ModelConfig c = ModelConfig::from_gguf(m.set("llama.attention.sliding_window", 16u).file());
  EXPECT_TRUE(c.layers[0].sliding);
  EXPECT_EQ(c.layers[0].window, 16);
  c = ModelConfig::from_gguf(m.set("llama.attention.sliding_window", 64u).file());  // = context_length
  EXPECT_FALSE(c.layers[0].sliding);
}

// Gemma 2: every other layer a sliding window (the first one sliding), both soft caps from the file
// or llama.cpp's defaults (50, 30; window 4096), and the 27B's logit scale by its layer count, as
// llama.cpp tells it (46 layers; Gemma 3's 27B: 62): (dim / heads)^-1/2 instead of head_dim^-1/2.
TEST(ArchConfig, Gemma2WindowsSoftCapsAndLogitScale) {
  ModelImage m = tiny("gemma2");
  m.set("gemma2.block_count", 3u).set("gemma2.attention.sliding_window", 16u);
  m.set("gemma2.attn_logit_softcapping", 20.0f).set("gemma2.final_logit_softcapping", 10.0f);
  m.set("gemma2.attention.key_length", 6u).set("gemma2.attention.value_length", 6u);
  ModelConfig c = ModelConfig::from_gguf(m.file());
  EXPECT_EQ(c.arch, Architecture::kGemma2);
  ASSERT_EQ(c.layers.size(), 3u);
  EXPECT_TRUE(c.layers[0].sliding && c.layers[2].sliding);
  EXPECT_FALSE(c.layers[1].sliding);
  EXPECT_EQ(c.layers[0].window, 16);
  EXPECT_EQ(c.layers[1].window, 0);
  EXPECT_EQ(c.attn_softcap, 20.0f);
  EXPECT_EQ(c.final_softcap, 10.0f);
  EXPECT_TRUE(c.post_norms && c.rope_neox && !c.qk_norm);
  EXPECT_FLOAT_EQ(c.attn_scale, 1.0f / std::sqrt(6.0f));  // head_dim 6 (q_dim 12 != dim 8)
  c = ModelConfig::from_gguf(m.drop("gemma2.attn_logit_softcapping").drop("gemma2.final_logit_softcapping")
                                 .drop("gemma2.attention.sliding_window").file());
  EXPECT_EQ(c.attn_softcap, 50.0f);
  EXPECT_EQ(c.final_softcap, 30.0f);
  EXPECT_EQ(c.layers[0].window, 4096);
  EXPECT_FLOAT_EQ(ModelConfig::from_gguf(m.set("gemma2.block_count", 46u).file()).attn_scale, 1.0f / 2.0f);  // 8 / 2 heads
  ModelImage g3 = tiny("gemma3");
  g3.set("gemma3.attention.sliding_window", 16u).set("gemma3.attention.key_length", 6u);
  g3.set("gemma3.attention.value_length", 6u);
  EXPECT_FLOAT_EQ(ModelConfig::from_gguf(g3.file()).attn_scale, 1.0f / std::sqrt(6.0f));
  EXPECT_FLOAT_EQ(ModelConfig::from_gguf(g3.set("gemma3.block_count", 62u).file()).attn_scale, 1.0f / 2.0f);
  EXPECT_TRUE(has(refusal(m.set("gemma2.attn_logit_softcapping", -1.0f)), "is not a positive soft cap"));
}

// 4 experts, 2 per token: qwen3moe's of expert_feed_forward_length 5, Mixtral's (a llama with
// experts) of feed_forward_length.
constexpr uint64_t kExperts = 4, kQwenExpertFfn = 5;
ModelImage tiny_moe(const std::string& arch) {
  ModelImage m = tiny(arch);
  const uint64_t ffn = arch == "qwen3moe" ? kQwenExpertFfn : kFfn;
  m.drop("blk.0.ffn_gate.weight").drop("blk.0.ffn_up.weight").drop("blk.0.ffn_down.weight");
  m.set(arch + ".expert_count", static_cast<uint32_t>(kExperts)).set(arch + ".expert_used_count", 2u);
  if (arch == "qwen3moe") m.set(arch + ".expert_feed_forward_length", static_cast<uint32_t>(ffn));
  m.tensor("blk.0.ffn_gate_inp.weight", {kDim, kExperts});
  m.tensor("blk.0.ffn_gate_exps.weight", {kDim, ffn, kExperts}).tensor("blk.0.ffn_up_exps.weight", {kDim, ffn, kExperts});
  m.tensor("blk.0.ffn_down_exps.weight", {ffn, kDim, kExperts});
  return m;
}

TEST(ArchConfig, ExpertsAreOneViewPerExpertOfTheStackedTensors) {
  for (const std::string arch : {"qwen3moe", "llama"}) {
    ModelImage m = tiny_moe(arch);
    const GgufFile& f = m.file();
    const ModelConfig c = ModelConfig::from_gguf(f);
    const uint64_t ffn = arch == "qwen3moe" ? kQwenExpertFfn : kFfn;
    EXPECT_TRUE(c.moe());
    EXPECT_EQ(c.n_experts, 4);
    EXPECT_EQ(c.n_experts_used, 2);
    EXPECT_EQ(c.expert_ffn_dim, static_cast<int32_t>(ffn)) << arch;
    EXPECT_EQ(c.qk_norm, arch == "qwen3moe");
    const ModelWeights w = ModelWeights::from_gguf(f, c);
    const LayerWeights& L = w.layers[0];
    EXPECT_EQ(L.w_gate.data, nullptr);
    EXPECT_EQ(L.router.rows, 4);
    ASSERT_EQ(L.gate_exps.size(), kExperts);
    const size_t gate_bytes = ffn * kDim * sizeof(float);
    for (size_t e = 0; e < kExperts; ++e) {
      EXPECT_EQ(bytes(L.gate_exps[e]), bytes(L.gate_exps[0]) + e * gate_bytes);
      EXPECT_EQ(L.down_exps[e].rows, static_cast<int64_t>(kDim));
      EXPECT_EQ(L.down_exps[e].cols, static_cast<int64_t>(ffn));
    }
    // Per token, in rows of dim floats: Q, K, V, O (q_dim rows or columns), the router, 2 experts'
    // three matrices (ffn rows or columns each), the output.
    const size_t row = kDim * sizeof(float), q = arch == "qwen3moe" ? 12 : 8, kv = q / 2;
    EXPECT_EQ(w.matrix_bytes, (q + 2 * kv + q + kExperts + 2 * 3 * ffn + kVocab) * row) << arch;
  }
}

// gpt-oss: every other layer a window (the first sliding), sinks and the biases of the attention
// output, the router and the experts all required (each named when missing), its pre-MLP norm under
// llama.cpp's post_attention_norm name, yarn untruncated.
ModelImage tiny_gpt_oss() {
  ModelImage m = tiny_moe("qwen3moe");
  m.set("general.architecture", std::string("gpt-oss"));
  for (const char* k : {"block_count", "context_length", "embedding_length", "feed_forward_length",
                        "attention.head_count", "attention.head_count_kv", "attention.layer_norm_rms_epsilon",
                        "rope.freq_base", "attention.key_length", "attention.value_length", "expert_count",
                        "expert_used_count", "expert_feed_forward_length"})
    m.drop(std::string("qwen3moe.") + k);
  m.set("gpt-oss.block_count", 1u).set("gpt-oss.context_length", 64u).set("gpt-oss.embedding_length", 8u);
  m.set("gpt-oss.feed_forward_length", 5u).set("gpt-oss.attention.head_count", 2u);
  m.set("gpt-oss.attention.head_count_kv", 1u).set("gpt-oss.attention.layer_norm_rms_epsilon", 1e-5f);
  m.set("gpt-oss.attention.key_length", 6u).set("gpt-oss.attention.value_length", 6u);
  m.set("gpt-oss.expert_count", 4u).set("gpt-oss.expert_used_count", 2u).set("gpt-oss.expert_feed_forward_length", 5u);
  m.set("gpt-oss.attention.sliding_window", 16u).set("gpt-oss.rope.scaling.type", std::string("yarn"));
  m.set("gpt-oss.rope.scaling.factor", 4.0f).set("gpt-oss.rope.scaling.original_context_length", 16u);
  m.drop("blk.0.attn_q_norm.weight").drop("blk.0.attn_k_norm.weight");
  m.drop("blk.0.ffn_norm.weight").tensor("blk.0.post_attention_norm.weight", {kDim});
  m.tensor("blk.0.attn_sinks.weight", {2}).tensor("blk.0.attn_output.bias", {kDim});
  m.tensor("blk.0.ffn_gate_inp.bias", {kExperts}).tensor("blk.0.ffn_gate_exps.bias", {kQwenExpertFfn, kExperts});
  m.tensor("blk.0.ffn_up_exps.bias", {kQwenExpertFfn, kExperts}).tensor("blk.0.ffn_down_exps.bias", {kDim, kExperts});
  return m;
}

TEST(ArchConfig, GptOssLayoutAndRequiredTensors) {
  ModelImage m = tiny_gpt_oss();
  ASSERT_EQ(refusal(m), "(loaded)");
  const GgufFile& f = m.file();
  const ModelConfig c = ModelConfig::from_gguf(f);
  EXPECT_EQ(c.arch, Architecture::kGptOss);
  EXPECT_TRUE(c.attn_sinks && c.rope_neox && !c.rope_scaling.yarn_truncate);
  EXPECT_EQ(c.activation, Activation::kSwigluOai);
  EXPECT_TRUE(c.layers[0].sliding);
  EXPECT_EQ(c.layers[0].window, 16);
  const ModelWeights w = ModelWeights::from_gguf(f, c);
  EXPECT_EQ(w.layers[0].attn_sinks.size(), 2u);
  EXPECT_EQ(w.layers[0].down_exps_bias.size(), kExperts * kDim);
  for (const char* t : {"blk.0.attn_sinks.weight", "blk.0.ffn_gate_inp.bias", "blk.0.ffn_up_exps.bias"}) {
    ModelImage missing = tiny_gpt_oss();
    missing.drop(t);
    EXPECT_TRUE(has(refusal(missing), std::string("'") + t + "'")) << t << ": " << refusal(missing);
  }
}

TEST(ArchConfig, MixtureOfExpertsFathomLacksIsRefusedByName) {
  ModelImage m = tiny_moe("qwen3moe");
  m.set("general.architecture", std::string("qwen2moe"));
  const std::string r = refusal(m);
  EXPECT_TRUE(has(r, "unsupported architecture 'qwen2moe'") && has(r, "shared experts")) << r;
  // A qwen3moe file with a shared expert: its key and tensors are refused by name.
  ModelImage shared = tiny_moe("qwen3moe");
  shared.set("qwen3moe.expert_shared_feed_forward_length", 6u);
  EXPECT_TRUE(has(refusal(shared), "qwen3moe.expert_shared_feed_forward_length")) << refusal(shared);
  shared.drop("qwen3moe.expert_shared_feed_forward_length").tensor("blk.0.ffn_up_shexp.weight", {kDim, 6});
  EXPECT_TRUE(has(refusal(shared), "'blk.0.ffn_up_shexp.weight'")) << refusal(shared);
  // One tensor per expert (blk.N.ffn_gate.E.weight: old Mixtral conversions, and what a Hugging Face
  // directory's experts.E.* become) loads as the stacked layout does; a missing expert is named.
  ModelImage old = tiny_moe("llama");
  old.drop("blk.0.ffn_gate_exps.weight").drop("blk.0.ffn_up_exps.weight").drop("blk.0.ffn_down_exps.weight");
  for (uint64_t e = 0; e < kExperts; ++e) {
    const std::string n = std::to_string(e);
    old.tensor("blk.0.ffn_gate." + n + ".weight", {kDim, kFfn}).tensor("blk.0.ffn_up." + n + ".weight", {kDim, kFfn});
    old.tensor("blk.0.ffn_down." + n + ".weight", {kFfn, kDim});
  }
  EXPECT_EQ(refusal(old), "(loaded)");
  const GgufFile& per_expert = old.file();
  const ModelWeights w = ModelWeights::from_gguf(per_expert, ModelConfig::from_gguf(per_expert));
  ASSERT_EQ(w.layers[0].down_exps.size(), kExperts);
  EXPECT_EQ(w.layers[0].down_exps[3].data, per_expert.find_tensor("blk.0.ffn_down.3.weight")->data);
  old.drop("blk.0.ffn_up.2.weight");
  EXPECT_TRUE(has(refusal(old), "missing tensor 'blk.0.ffn_up.2.weight'")) << refusal(old);
  ModelImage too_many = tiny_moe("llama");
  EXPECT_TRUE(has(refusal(too_many.set("llama.expert_used_count", 5u)), "llama.expert_used_count = 5 is out of range"))
      << refusal(too_many);
}

}  // namespace
}  // namespace fathom
