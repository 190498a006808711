// Hugging Face directories (engine/model/hf_dir.h): the safetensors reader against hostile headers,
// config.json's translation and what it refuses by name, shards and their index, and a directory
// loading as the GGUF of the same checkpoint (the logits: tests/kernel/test_cuda_arch_fixtures.cpp).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include <unistd.h>

#include "base/error.h"
#include "engine/model/hf_config.h"
#include "engine/model/hf_dir.h"
#include "engine/model/model.h"
#include "engine/model/safetensors.h"
#include "engine/model/unicode_nfc.h"

namespace fathom {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kArch = std::string(FATHOM_SOURCE_DIR) + "/tests/fixtures/arch/";

// A safetensors image: the 8-byte header length, the header text (padded with spaces to 8 bytes as
// the format's writer does), then `data`.
std::vector<uint8_t> image(const std::string& header, const std::vector<uint8_t>& data) {
  std::string h = header;
  while ((8 + h.size()) % 8 != 0) h += ' ';
  std::vector<uint8_t> out(8 + h.size());
  const uint64_t n = h.size();
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, h.data(), h.size());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

std::string error_of(const std::vector<uint8_t>& img) {
  try {
    parse_safetensors(img.data(), img.size(), "x.safetensors");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Safetensors, ReadsTensorsInDataOrder) {
  const auto img = image(R"({"b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
                             "a": {"dtype": "BF16", "shape": [1, 2], "data_offsets": [0, 4]},
                             "__metadata__": {"format": "pt"}})",
                         std::vector<uint8_t>(12, 1));
  const auto t = parse_safetensors(img.data(), img.size(), "x");
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].name, "a");
  EXPECT_EQ(t[0].dtype, "BF16");
  EXPECT_EQ(t[0].shape, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(t[0].nbytes, 4u);
  EXPECT_EQ(t[1].data, t[0].data + 4);
}

TEST(Safetensors, RefusesHostileHeaders) {
  const std::vector<uint8_t> d8(8);
  auto one = [](const std::string& fields) { return "{\"t\": {" + fields + "}}"; };
  const std::pair<std::vector<uint8_t>, const char*> cases[] = {
      {{1, 2, 3}, "not a safetensors file"},
      {image(one(R"("dtype": "F32", "shape": [2], "data_offsets": [0, 8])"), {1, 2}), "extends past"},
      {image(one(R"("dtype": "F32", "shape": [3], "data_offsets": [0, 8])"), d8), "need 12"},
      {image(one(R"("dtype": "Q4", "shape": [2], "data_offsets": [0, 8])"), d8), "unknown dtype"},
      {image(one(R"("dtype": "F32", "shape": [-2], "data_offsets": [0, 8])"), d8), "non-negative"},
      {image(one(R"("dtype": "F32", "shape": [2], "data_offsets": [8, 0])"), d8), "begin after"},
      {image(one(R"("dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 8])"), d8), "overflows"},
      {image(one(R"("dtype": "F32", "shape": [2], "data_offsets": [0, 8], "extra": 1)"), d8), "exactly"},
      {image(one(R"("dtype": "F32", "shape": [1], "data_offsets": [0, 4])"), d8), "belong to none"},
      {image(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                 "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", d8), "overlaps"},
      {image(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", d8), "gap"},
      {image(one(R"("dtype": "F16", "shape": [1], "data_offsets": [1, 3])"), {0, 0, 0, 0}), "aligned"},
      {image(R"({"t": [[[[[1]]]]]})", {}), "nests deeper"},
      {image(R"({"t": )", {}), "not valid JSON"},
      {image(R"([1, 2])", {}), "not a JSON object"},
  };
  for (const auto& [img, want] : cases) EXPECT_NE(error_of(img).find(want), std::string::npos) << want << ": " << error_of(img);
  std::vector<uint8_t> huge(16);
  const uint64_t n = kMaxSafetensorsHeader + 1;
  std::memcpy(huge.data(), &n, 8);
  EXPECT_NE(error_of(huge).find("exceeds the limit"), std::string::npos);
  const uint64_t max = UINT64_MAX;
  std::memcpy(huge.data(), &max, 8);
  EXPECT_NE(error_of(huge).find("exceeds the limit"), std::string::npos);
}

json fixture_config(const std::string& name) {
  std::ifstream in(kArch + name + "-hf/config.json");
  return json::parse(in);
}

std::string config_error(const json& config) {
  try {
    hf_config_from_json(config.dump(), "config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(HfConfig, TranslatesAsLlamaCppsConverter) {
  const HfConfig c = hf_config_from_json(fixture_config("qwen3").dump(), "config.json");
  EXPECT_EQ(c.arch, "qwen3");
  EXPECT_EQ(std::get<uint32_t>(c.metadata.at("qwen3.attention.key_length")), 48u);
  EXPECT_EQ(std::get<float>(c.metadata.at("qwen3.rope.freq_base")), 1e6f);
  EXPECT_EQ(c.tie_word_embeddings, false);
  const HfConfig p = hf_config_from_json(fixture_config("phi3-longrope").dump(), "config.json");
  EXPECT_EQ(std::get<uint32_t>(p.metadata.at("phi3.rope.dimension_count")), 24u);
  EXPECT_EQ(std::get<std::string>(p.metadata.at("phi3.rope.scaling.type")), "longrope");
  EXPECT_EQ(p.extra_tensors.at("rope_factors_long.weight").size(), 12u);
}

TEST(HfConfig, LlamaRotatesTheCheckpointsRowsNeoxStyle) {
  json c = fixture_config("qwen3");
  c["architectures"] = {"LlamaForCausalLM"};
  c["model_type"] = "llama";
  for (const char* k : {"layer_types", "use_sliding_window", "max_window_layers"}) c.erase(k);
  // transformers 4's keys: rope_theta and rope_scaling at the top.
  c.erase("rope_parameters");
  c["rope_theta"] = 500000.0;
  c["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 64}};
  const HfConfig h = hf_config_from_json(c.dump(), "config.json");
  EXPECT_EQ(h.arch, "llama");
  EXPECT_TRUE(std::get<bool>(h.metadata.at("fathom.rope_neox")));
  EXPECT_EQ(std::get<std::string>(h.metadata.at("llama.rope.scaling.type")), "llama3");
  EXPECT_EQ(std::get<float>(h.metadata.at("llama.rope.freq_base")), 500000.0f);
}

TEST(HfConfig, RefusesWhatItDoesNotImplementByName) {
  const json base = fixture_config("qwen2");
  auto with = [&](const char* key, json value) {
    json c = base;
    c[key] = std::move(value);
    return config_error(c);
  };
  EXPECT_NE(with("quantization_config", json::object()).find("'quantization_config'"), std::string::npos);
  EXPECT_NE(with("hidden_act", "gelu").find("hidden_act 'gelu'"), std::string::npos);
  EXPECT_NE(with("use_sliding_window", true).find("use_sliding_window"), std::string::npos);
  EXPECT_NE(with("rope_parameters", {{"rope_type", "dynamic"}, {"factor", 2.0}}).find("'dynamic'"), std::string::npos);
  EXPECT_NE(with("rope_parameters", {{"rope_type", "yarn"}, {"factor", 2.0}, {"original_max_position_embeddings", 64},
                                     {"mscale", 0.7}})
                .find("mscale"),
            std::string::npos);
  EXPECT_NE(with("rope_parameters", {{"rope_type", "linear"}, {"factor", 2.0}, {"beta", 1}}).find("'beta'"),
            std::string::npos);
  EXPECT_NE(with("layer_types", {"full_attention", "sliding_attention"}).find("sliding_attention"), std::string::npos);
  EXPECT_NE(with("architectures", {"Gemma3ForConditionalGeneration"}).find("(model_type 'qwen2')"),
            std::string::npos);  // the class and the model type disagree
  EXPECT_NE(with("architectures", {"PaliGemmaForConditionalGeneration"}).find("PaliGemmaForConditionalGeneration"),
            std::string::npos);
  EXPECT_NE(with("num_attention_heads", "2").find("not an integer"), std::string::npos);
  EXPECT_NE(with("hidden_size", 0).find("out of range"), std::string::npos);
  // Mistral's window is every layer's (llama.attention.sliding_window); Llama has none to give.
  json mistral = base;
  mistral["architectures"] = {"MistralForCausalLM"};
  mistral["model_type"] = "mistral";
  mistral["sliding_window"] = 4096;
  mistral.erase("layer_types");
  const HfConfig m = hf_config_from_json(mistral.dump(), "config.json");
  EXPECT_EQ(std::get<uint32_t>(m.metadata.at("llama.attention.sliding_window")), 4096u);
  json llama = mistral;
  llama["architectures"] = {"LlamaForCausalLM"};
  llama["model_type"] = "llama";
  EXPECT_NE(config_error(llama).find("sliding_window = 4096"), std::string::npos) << config_error(llama);
  EXPECT_NE(config_error(json::array()).find("not a JSON object"), std::string::npos);
}

// A scratch copy of a fixture directory, removed at the end.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& fixture) {
    path_ = fs::temp_directory_path() / ("fathom-hf-" + std::to_string(getpid()) + "-" + fixture);
    fs::remove_all(path_);
    fs::copy(kArch + fixture + "-hf", path_);
  }
  ~ScratchDir() { fs::remove_all(path_); }
  std::string path() const { return path_.string(); }
  void write(const std::string& name, const std::string& text) const { std::ofstream(path_ / name) << text; }

 private:
  fs::path path_;
};

std::string load_error(const std::string& dir) {
  try {
    Model::load(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(HfDir, LoadsAsTheGgufOfTheSameCheckpoint) {
  const auto hf = Model::load(kArch + "qwen2-hf/");
  const auto gguf = Model::load(kArch + "qwen2.gguf");
  EXPECT_EQ(hf->config().n_layers, gguf->config().n_layers);
  EXPECT_EQ(hf->config().rope_neox, gguf->config().rope_neox);
  EXPECT_EQ(hf->vocab(), gguf->vocab());
  EXPECT_EQ(hf->tokenizer().eos_id(), gguf->tokenizer().eos_id());
  const WeightMatrix &a = hf->weights().layers[1].wq, &b = gguf->weights().layers[1].wq;
  ASSERT_EQ(a.bytes(), b.bytes());
  EXPECT_EQ(std::memcmp(a.data, b.data, a.bytes()), 0);
  EXPECT_EQ(hf->weights().layers[1].bq, gguf->weights().layers[1].bq);
}

TEST(HfDir, ShardsThroughTheirIndex) {
  ScratchDir dir("qwen3");
  // Two shards: the file's tensors split in two halves, written as two safetensors files.
  std::ifstream in(dir.path() + "/model.safetensors", std::ios::binary);
  const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto tensors = parse_safetensors(bytes.data(), bytes.size(), "model.safetensors");
  json map = json::object();
  for (int shard = 0; shard < 2; ++shard) {
    json header = json::object();
    std::vector<uint8_t> data;
    for (size_t i = shard; i < tensors.size(); i += 2) {
      const auto& t = tensors[i];
      header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {data.size(), data.size() + t.nbytes}}};
      data.insert(data.end(), t.data, t.data + t.nbytes);
      map[t.name] = "model-0000" + std::to_string(shard + 1) + "-of-00002.safetensors";
    }
    const auto img = image(header.dump(), data);
    std::ofstream(dir.path() + "/model-0000" + std::to_string(shard + 1) + "-of-00002.safetensors", std::ios::binary)
        .write(reinterpret_cast<const char*>(img.data()), static_cast<std::streamsize>(img.size()));
  }
  fs::remove(dir.path() + "/model.safetensors");
  dir.write("model.safetensors.index.json", json{{"metadata", json::object()}, {"weight_map", map}}.dump());
  const auto sharded = Model::load(dir.path());
  const auto single = Model::load(kArch + "qwen3-hf");
  const WeightMatrix &a = sharded->weights().layers[0].w_down, &b = single->weights().layers[0].w_down;
  EXPECT_EQ(std::memcmp(a.data, b.data, a.bytes()), 0);

  // A shard outside the directory, and a tensor the index puts in another shard, are refused.
  json evil = map;
  evil[tensors[0].name] = "../qwen3-hf/model.safetensors";
  dir.write("model.safetensors.index.json", json{{"weight_map", evil}}.dump());
  EXPECT_NE(load_error(dir.path()).find("not a file name inside the directory"), std::string::npos);
  json swapped = map;
  swapped[tensors[0].name] = map[tensors[1].name];
  dir.write("model.safetensors.index.json", json{{"weight_map", swapped}}.dump());
  EXPECT_NE(load_error(dir.path()).find("not listed under this shard"), std::string::npos);
}

TEST(HfDir, RefusesWhatItCannotServe) {
  {
    ScratchDir dir("qwen3");  // untied, but no lm_head: transformers would have a random head
    json c = fixture_config("qwen3");
    std::ifstream in(dir.path() + "/model.safetensors", std::ios::binary);
    const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    json header = json::object();
    std::vector<uint8_t> data;
    for (const auto& t : parse_safetensors(bytes.data(), bytes.size(), "m")) {
      if (t.name == "lm_head.weight") continue;
      header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {data.size(), data.size() + t.nbytes}}};
      data.insert(data.end(), t.data, t.data + t.nbytes);
    }
    const auto img = image(header.dump(), data);
    std::ofstream(dir.path() + "/model.safetensors", std::ios::binary)
        .write(reinterpret_cast<const char*>(img.data()), static_cast<std::streamsize>(img.size()));
    EXPECT_NE(load_error(dir.path()).find("no lm_head.weight"), std::string::npos);
  }
  {
    ScratchDir dir("qwen2");  // an extra tensor (an o_proj bias) is refused by its GGUF name
    std::ifstream in(dir.path() + "/model.safetensors", std::ios::binary);
    const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    json header = json::object();
    std::vector<uint8_t> data;
    for (const auto& t : parse_safetensors(bytes.data(), bytes.size(), "m")) {
      header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {data.size(), data.size() + t.nbytes}}};
      data.insert(data.end(), t.data, t.data + t.nbytes);
    }
    header["model.layers.0.mlp.down_proj.bias"] = {{"dtype", "BF16"}, {"shape", {64}},
                                                      {"data_offsets", {data.size(), data.size() + 128}}};
    data.resize(data.size() + 128);
    const auto img = image(header.dump(), data);
    std::ofstream(dir.path() + "/model.safetensors", std::ios::binary)
        .write(reinterpret_cast<const char*>(img.data()), static_cast<std::streamsize>(img.size()));
    EXPECT_NE(load_error(dir.path()).find("'blk.0.ffn_down.bias'"), std::string::npos);  // an MLP bias
  }
  {
    ScratchDir dir("qwen2");  // an embedding of other rows than vocab_size
    json c = fixture_config("qwen2");
    c["vocab_size"] = 130;
    dir.write("config.json", c.dump());
    EXPECT_NE(load_error(dir.path()).find("vocab_size is 130"), std::string::npos) << load_error(dir.path());
  }
  EXPECT_NE(load_error(kArch).find("config.json"), std::string::npos);  // a directory that is no checkpoint
}

// Mixtures of experts: the counts become llama.cpp's keys; what the routing does not do is refused.
TEST(HfConfig, ExpertsOfQwen3MoeAndMixtral) {
  const HfConfig q = hf_config_from_json(fixture_config("qwen3moe").dump(), "config.json");
  EXPECT_EQ(q.arch, "qwen3moe");
  EXPECT_EQ(std::get<uint32_t>(q.metadata.at("qwen3moe.expert_count")), 4u);
  EXPECT_EQ(std::get<uint32_t>(q.metadata.at("qwen3moe.expert_used_count")), 2u);
  EXPECT_EQ(std::get<uint32_t>(q.metadata.at("qwen3moe.expert_feed_forward_length")), 48u);
  const HfConfig m = hf_config_from_json(fixture_config("mixtral").dump(), "config.json");
  EXPECT_EQ(m.arch, "llama");
  EXPECT_EQ(std::get<uint32_t>(m.metadata.at("llama.expert_count")), 4u);
  const std::pair<const char*, json> refused[] = {
      {"norm_topk_prob", false}, {"decoder_sparse_step", 2}, {"mlp_only_layers", json::array({0})},
      {"shared_expert_intermediate_size", 64}};
  for (const auto& [key, value] : refused) {
    json c = fixture_config("qwen3moe");
    c[key] = value;
    EXPECT_NE(config_error(c).find(key), std::string::npos) << key << ": " << config_error(c);
  }
  json mixtral = fixture_config("mixtral");
  mixtral["num_experts_per_tok"] = 5;  // more than its 4 experts
  EXPECT_NE(config_error(mixtral).find("num_experts_per_tok"), std::string::npos) << config_error(mixtral);
}

TEST(HfDir, NamesTensorsAsLlamaCpp) {
  auto name = [](const char* hf, const char* arch = "llama") { return gguf_tensor_name(hf, 2, arch); };
  EXPECT_EQ(name("model.layers.1.self_attn.qkv_proj.weight", "phi3"), "blk.1.attn_qkv.weight");
  EXPECT_EQ(name("model.layers.1.mlp.gate_up_proj.weight", "phi3"), "blk.1.ffn_up.weight");
  EXPECT_EQ(name("model.embed_tokens.weight"), "token_embd.weight");
  // Experts, one tensor each: qwen3moe's and Mixtral's names.
  EXPECT_EQ(name("model.layers.1.mlp.gate.weight", "qwen3moe"), "blk.1.ffn_gate_inp.weight");
  EXPECT_EQ(name("model.layers.0.mlp.experts.12.up_proj.weight", "qwen3moe"), "blk.0.ffn_up.12.weight");
  EXPECT_EQ(name("model.layers.0.block_sparse_moe.experts.3.w2.weight"), "blk.0.ffn_down.3.weight");
  EXPECT_EQ(name("model.layers.0.block_sparse_moe.gate.weight"), "blk.0.ffn_gate_inp.weight");
  EXPECT_EQ(name("model.layers.0.mlp.experts.07.up_proj.weight"), "model.layers.0.mlp.experts.07.up_proj.weight");
  EXPECT_EQ(name("model.layers.0.mlp.experts.1.w9.weight"), "model.layers.0.mlp.experts.1.w9.weight");
  // Out of range or malformed layer numbers keep their name (and are refused as unused).
  EXPECT_EQ(name("model.layers.2.mlp.up_proj.weight"), "model.layers.2.mlp.up_proj.weight");
  EXPECT_EQ(name("model.layers.01.mlp.up_proj.weight"), "model.layers.01.mlp.up_proj.weight");
  EXPECT_EQ(name("model.layers.99999999999.x"), "model.layers.99999999999.x");
  // The Gemmas' four norms a layer: post_attention_layernorm is the attention output's there, the
  // MLP input's (ffn_norm) elsewhere; the gemma-only names stay unknown to the others.
  for (const char* gemma : {"gemma2", "gemma3"}) {
    EXPECT_EQ(name("model.layers.1.input_layernorm.weight", gemma), "blk.1.attn_norm.weight");
    EXPECT_EQ(name("model.layers.1.post_attention_layernorm.weight", gemma), "blk.1.post_attention_norm.weight");
    EXPECT_EQ(name("model.layers.1.pre_feedforward_layernorm.weight", gemma), "blk.1.ffn_norm.weight");
    EXPECT_EQ(name("model.layers.1.post_feedforward_layernorm.weight", gemma), "blk.1.post_ffw_norm.weight");
    EXPECT_EQ(name("model.layers.0.self_attn.q_norm.weight", gemma), "blk.0.attn_q_norm.weight");
    EXPECT_EQ(name("model.norm.weight", gemma), "output_norm.weight");
  }
  EXPECT_EQ(name("model.layers.1.post_attention_layernorm.weight"), "blk.1.ffn_norm.weight");
  // gpt-oss's pre-MLP norm takes the name llama.cpp gives it; its sinks and biased router.
  EXPECT_EQ(name("model.layers.1.post_attention_layernorm.weight", "gpt-oss"), "blk.1.post_attention_norm.weight");
  EXPECT_EQ(name("model.layers.0.self_attn.sinks", "gpt-oss"), "blk.0.attn_sinks.weight");
  EXPECT_EQ(name("model.layers.0.mlp.router.bias", "gpt-oss"), "blk.0.ffn_gate_inp.bias");
  EXPECT_EQ(name("model.layers.0.mlp.router.weight", "qwen3moe"), "model.layers.0.mlp.router.weight");
  EXPECT_EQ(name("model.layers.1.pre_feedforward_layernorm.weight", "qwen2"),
            "model.layers.1.pre_feedforward_layernorm.weight");
}

// Gemma 2 and 3: config.json as llama.cpp's converter writes their keys (transformers' defaults for
// what it leaves out), and what llama.cpp (and fathom) fix where no GGUF key says it — which layers
// slide, the sliding layers' RoPE base, the attention scale — held to config.json by name.
TEST(HfConfig, GemmaAsLlamaCppsConverter) {
  const HfConfig g2 = hf_config_from_json(fixture_config("gemma2").dump(), "config.json");
  EXPECT_EQ(g2.arch, "gemma2");
  EXPECT_EQ(std::get<float>(g2.metadata.at("gemma2.attn_logit_softcapping")), 20.0f);
  EXPECT_EQ(std::get<float>(g2.metadata.at("gemma2.final_logit_softcapping")), 10.0f);
  EXPECT_EQ(std::get<uint32_t>(g2.metadata.at("gemma2.attention.sliding_window")), 24u);
  EXPECT_EQ(std::get<uint32_t>(g2.metadata.at("gemma2.attention.key_length")), 48u);
  EXPECT_EQ(std::get<float>(g2.metadata.at("fathom.norm_offset")), 1.0f);  // norms stored as w for 1 + w
  EXPECT_EQ(g2.tie_word_embeddings, true);
  // Absent: transformers' Gemma2Config defaults (caps 50 and 30, window 4096, tied).
  json bare = fixture_config("gemma2");
  for (const char* k : {"attn_logit_softcapping", "final_logit_softcapping", "sliding_window", "layer_types",
                        "tie_word_embeddings"})
    bare.erase(k);
  const HfConfig d = hf_config_from_json(bare.dump(), "config.json");
  EXPECT_EQ(std::get<float>(d.metadata.at("gemma2.attn_logit_softcapping")), 50.0f);
  EXPECT_EQ(std::get<float>(d.metadata.at("gemma2.final_logit_softcapping")), 30.0f);
  EXPECT_EQ(std::get<uint32_t>(d.metadata.at("gemma2.attention.sliding_window")), 4096u);
  EXPECT_EQ(d.tie_word_embeddings, true);

  // Gemma 3 in transformers 4's layout (the fixture: the released checkpoints') and 5's (rope
  // parameters per layer type, layer_types) give the same keys.
  const json c4 = fixture_config("gemma3");
  const HfConfig g3 = hf_config_from_json(c4.dump(), "config.json");
  EXPECT_EQ(g3.arch, "gemma3");
  EXPECT_EQ(std::get<float>(g3.metadata.at("gemma3.rope.freq_base")), 1e6f);  // the global layers'
  EXPECT_EQ(std::get<std::string>(g3.metadata.at("gemma3.rope.scaling.type")), "linear");
  EXPECT_EQ(std::get<float>(g3.metadata.at("gemma3.rope.scaling.factor")), 8.0f);
  EXPECT_EQ(std::get<uint32_t>(g3.metadata.at("gemma3.attention.sliding_window")), 24u);
  EXPECT_EQ(std::get<float>(g3.metadata.at("fathom.norm_offset")), 1.0f);
  EXPECT_FALSE(g3.metadata.contains("gemma3.final_logit_softcapping"));
  json c5 = c4;
  for (const char* k : {"rope_theta", "rope_scaling", "rope_local_base_freq", "sliding_window_pattern"}) c5.erase(k);
  c5["rope_parameters"] = {{"full_attention", {{"rope_type", "linear"}, {"factor", 8.0}, {"rope_theta", 1e6}}},
                           {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 10000.0}}}};
  c5["layer_types"] = json::array();
  for (int il = 0; il < 6; ++il) c5["layer_types"].push_back(il == 5 ? "full_attention" : "sliding_attention");
  c5["_sliding_window_pattern"] = 6;
  c5["use_bidirectional_attention"] = false;
  EXPECT_EQ(hf_config_from_json(c5.dump(), "config.json").metadata, g3.metadata);
  // transformers 5 reading a theta from the top into the per-type parameters; Gemma 3's default
  // global theta is 1e6.
  json mixed = c5;
  mixed["rope_parameters"]["full_attention"].erase("rope_theta");
  mixed["rope_parameters"]["sliding_attention"].erase("rope_theta");
  EXPECT_EQ(hf_config_from_json(mixed.dump(), "config.json").metadata, g3.metadata);
  mixed["rope_theta"] = 5e5;
  EXPECT_EQ(std::get<float>(hf_config_from_json(mixed.dump(), "config.json").metadata.at("gemma3.rope.freq_base")),
            5e5f);

  const std::tuple<const char*, const char*, json, const char*> refused[] = {
      {"gemma2", "query_pre_attn_scalar", 256, "query_pre_attn_scalar = 256"},  // not head_dim 48
      {"gemma2", "attn_logit_softcapping", nullptr, "attn_logit_softcapping = null"},
      {"gemma2", "hidden_activation", "gelu", "hidden_activation"},
      {"gemma2", "sliding_window", nullptr, "sliding_window = null"},
      {"gemma2", "layer_types", {"full_attention", "sliding_attention"}, "layer_types makes layer 0 global"},
      {"gemma2", "use_bidirectional_attention", true, "use_bidirectional_attention"},
      {"gemma2", "sliding_window_pattern", 2, "'sliding_window_pattern'"},  // not a Gemma 2 key
      {"gemma3", "sliding_window_pattern", 3, "sliding_window_pattern = 3 makes layer 2 global"},
      {"gemma3", "rope_local_base_freq", 20000.0, "rope_local_base_freq"},
      {"gemma3", "final_logit_softcapping", 30.0, "final_logit_softcapping"},
      {"gemma3", "attn_logit_softcapping", 50.0, "attn_logit_softcapping"},
      {"gemma3", "rope_parameters", {{"rope_type", "default"}, {"rope_theta", 1e6}}, "rope_parameters key 'rope_t"},
      {"gemma3", "rope_parameters", {{"sliding_attention", {{"rope_type", "linear"}, {"factor", 2.0}}}},
       "sliding_attention"},
      {"gemma3", "rope_scaling", {{"rope_type", "dynamic"}, {"factor", 2.0}}, "'dynamic'"},
      {"gemma3", "layer_types", json::array({"sliding_attention"}), "num_hidden_layers entries"},
  };
  for (const auto& [family, key, value, want] : refused) {
    json c = fixture_config(family);
    c[key] = value;
    EXPECT_NE(config_error(c).find(want), std::string::npos) << family << " " << key << ": " << config_error(c);
  }
  // The 27B's scale, told by its layer count as llama.cpp does: dim / heads.
  json big = fixture_config("gemma2");
  big["num_hidden_layers"] = 46;
  big.erase("layer_types");
  EXPECT_NE(config_error(big).find("by 32^-1/2"), std::string::npos) << config_error(big);
  big["query_pre_attn_scalar"] = 32;
  EXPECT_EQ(config_error(big), "");
}

// Gemma 3's vision checkpoints (Gemma3ForConditionalGeneration, model_type gemma3: 4B, 12B, 27B):
// the text model's config is text_config, whose keys left out take transformers' Gemma3TextConfig
// defaults; the vision keys are knowingly unused; any other key, top-level or the text model's, is
// refused by name.
json gemma3_4b_it() {  // google/gemma-3-4b-it's config.json as released
  return json::parse(R"({
    "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999, "eoi_token_index": 256000,
    "eos_token_id": [1, 106], "image_token_index": 262144, "initializer_range": 0.02, "mm_tokens_per_image": 256,
    "model_type": "gemma3",
    "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                    "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                    "sliding_window": 1024},
    "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
    "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                      "model_type": "siglip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 27,
                      "patch_size": 14, "vision_use_head": false}})");
}

TEST(HfConfig, Gemma3ConditionalGenerationReadsItsTextConfig) {
  // The fixture: gemma3-hf's text model in the released layout, the same keys.
  const HfConfig mm = hf_config_from_json(fixture_config("gemma3-mm").dump(), "config.json");
  const HfConfig text = hf_config_from_json(fixture_config("gemma3").dump(), "config.json");
  EXPECT_EQ(mm.arch, "gemma3");
  EXPECT_TRUE(mm.multimodal);
  EXPECT_FALSE(text.multimodal);
  EXPECT_EQ(mm.metadata, text.metadata);
  EXPECT_EQ(mm.vocab_size, 128);
  EXPECT_EQ(mm.tie_word_embeddings, true);
  EXPECT_EQ(mm.eos_ids, std::vector<int64_t>{127});

  // The 4B as released: transformers' defaults for the head counts, head_dim, vocabulary, context,
  // epsilon, attention scale and both RoPE bases.
  const HfConfig g4 = hf_config_from_json(gemma3_4b_it().dump(), "config.json");
  const auto u = [&](const HfConfig& c, const char* key) {
    return std::get<uint32_t>(c.metadata.at(std::string("gemma3.") + key));
  };
  EXPECT_EQ(u(g4, "block_count"), 34u);
  EXPECT_EQ(u(g4, "embedding_length"), 2560u);
  EXPECT_EQ(u(g4, "feed_forward_length"), 10240u);
  EXPECT_EQ(u(g4, "attention.head_count"), 8u);
  EXPECT_EQ(u(g4, "attention.head_count_kv"), 4u);
  EXPECT_EQ(u(g4, "attention.key_length"), 256u);
  EXPECT_EQ(u(g4, "context_length"), 131072u);
  EXPECT_EQ(u(g4, "vocab_size"), 262208u);
  EXPECT_EQ(u(g4, "attention.sliding_window"), 1024u);
  EXPECT_EQ(std::get<float>(g4.metadata.at("gemma3.attention.layer_norm_rms_epsilon")), 1e-6f);
  EXPECT_EQ(std::get<float>(g4.metadata.at("gemma3.rope.freq_base")), 1e6f);
  EXPECT_EQ(std::get<float>(g4.metadata.at("gemma3.rope.scaling.factor")), 8.0f);
  EXPECT_EQ(g4.vocab_size, 262208);
  EXPECT_EQ(g4.tie_word_embeddings, true);
  EXPECT_EQ(g4.eos_ids, (std::vector<int64_t>{1, 106}));
  EXPECT_EQ(ModelConfig::from_gguf(*GgufFile::assemble("g4", g4.metadata, {}, {}, {})).attn_scale, 1.0f / 16);

  // The 12B and the 27B (its attention scale hidden / heads = 168, as llama.cpp's).
  json g12 = gemma3_4b_it();
  g12["text_config"].update(json{{"hidden_size", 3840}, {"intermediate_size", 15360}, {"num_attention_heads", 16},
                                 {"num_hidden_layers", 48}, {"num_key_value_heads", 8}});
  json g27 = gemma3_4b_it();
  g27["text_config"].update(json{{"head_dim", 128}, {"hidden_size", 5376}, {"intermediate_size", 21504},
                                 {"num_attention_heads", 32}, {"num_hidden_layers", 62}, {"num_key_value_heads", 16},
                                 {"query_pre_attn_scalar", 168}});
  EXPECT_EQ(u(hf_config_from_json(g12.dump(), "config.json"), "attention.head_count_kv"), 8u);
  EXPECT_EQ(u(hf_config_from_json(g27.dump(), "config.json"), "attention.key_length"), 128u);
  g27["text_config"].erase("query_pre_attn_scalar");  // 256: not what llama.cpp's 27B scales by
  EXPECT_NE(config_error(g27).find("text_config: query_pre_attn_scalar = 256"), std::string::npos) << config_error(g27);

  // The same checkpoint as transformers 5 saves it: every text key written (rope_parameters,
  // layer_types, the text model's own token ids), tie_word_embeddings at both levels, dtype.
  json v5 = fixture_config("gemma3-mm");
  json& t = v5["text_config"];
  t.erase("rope_scaling");
  t.update(json{{"_sliding_window_pattern", 6}, {"attention_bias", false}, {"attention_dropout", 0.0},
                {"attn_logit_softcapping", nullptr}, {"bos_token_id", 2}, {"eos_token_id", 1},
                {"final_logit_softcapping", nullptr}, {"hidden_activation", "gelu_pytorch_tanh"},
                {"initializer_range", 0.02}, {"pad_token_id", 0}, {"rms_norm_eps", 1e-06},
                {"tie_word_embeddings", true}, {"use_bidirectional_attention", false}, {"use_cache", true},
                {"rope_parameters",
                 {{"full_attention", {{"factor", 8.0}, {"rope_theta", 1e6}, {"rope_type", "linear"}}},
                  {"sliding_attention", {{"rope_theta", 10000.0}, {"rope_type", "default"}}}}}});
  t["layer_types"] = json::array();
  for (int il = 0; il < 6; ++il) t["layer_types"].push_back(il == 5 ? "full_attention" : "sliding_attention");
  v5.erase("torch_dtype");
  v5["dtype"] = "bfloat16";
  v5["tie_word_embeddings"] = true;
  v5["vision_config"].update(json{{"attention_dropout", 0.0}, {"hidden_act", "gelu_pytorch_tanh"},
                                  {"layer_norm_eps", 1e-06}, {"num_channels", 3}});
  const HfConfig h5 = hf_config_from_json(v5.dump(), "config.json");
  EXPECT_EQ(h5.metadata, text.metadata);
  EXPECT_EQ(h5.eos_ids, std::vector<int64_t>{127});  // the top level's, not the text model's 1
  EXPECT_EQ(h5.bos_id, 2);                             // the text model's: the top gives none
  json bare = fixture_config("gemma3-mm");
  bare.erase("eos_token_id");
  bare["text_config"]["eos_token_id"] = 1;
  EXPECT_EQ(hf_config_from_json(bare.dump(), "config.json").eos_ids, std::vector<int64_t>{1});
  json untied = fixture_config("gemma3-mm");
  untied["tie_word_embeddings"] = false;
  EXPECT_EQ(hf_config_from_json(untied.dump(), "config.json").tie_word_embeddings, false);

  // Refused by name: a key neither level reads, the text model's settings fathom does not
  // implement, a text_config of another model, versions disagreeing on the head.
  const std::tuple<const char*, const char*, json, const char*> refused[] = {
      {"", "unsloth_fixed", true, "key 'unsloth_fixed' is not one fathom's Gemma3ForConditionalGeneration reads"},
      {"", "hidden_size", 32, "key 'hidden_size' is not one"},  // the text model's, at the top: not read there
      {"", "text_config", "gemma3_text", "text_config = 'gemma3_text' is not an object"},
      {"", "vision_config", 1, "vision_config = 1 is not an object"},
      {"", "eos_token_id", "x", "eos_token_id"},
      {"text_config", "vision_tower_lr", 0.1, "text_config: key 'vision_tower_lr' is not one fathom's gemma3 reads"},
      {"text_config", "model_type", "gemma2", "text_config: model_type 'gemma2' is not gemma3_text"},
      {"text_config", "final_logit_softcapping", 30.0, "text_config: final_logit_softcapping"},
      {"text_config", "rope_local_base_freq", 20000.0, "text_config: the sliding layers' RoPE base"},
      {"text_config", "use_bidirectional_attention", true, "text_config: use_bidirectional_attention"},
      {"text_config", "tie_word_embeddings", false,
       "tie_word_embeddings = true and text_config.tie_word_embeddings = false disagree"},
  };
  for (const auto& [level, key, value, want] : refused) {
    json c = fixture_config("gemma3-mm");
    if (std::string(key) == "tie_word_embeddings") c["tie_word_embeddings"] = true;
    (*level ? c[level] : c)[key] = value;
    EXPECT_NE(config_error(c).find(want), std::string::npos) << level << " " << key << ": " << config_error(c);
  }
  json other = fixture_config("gemma3-mm");
  other["model_type"] = "gemma3_text";  // the class says otherwise
  EXPECT_NE(config_error(other).find("unsupported architecture 'Gemma3ForConditionalGeneration'"), std::string::npos)
      << config_error(other);
  other.erase("architectures");  // model_type gemma3_text: the top level is no text model's config
  EXPECT_NE(config_error(other).find("not one fathom's gemma3 reads"), std::string::npos) << config_error(other);
}

// gpt-oss (transformers' GptOssConfig; llama.cpp's GptOssModel converter): config.json gives the
// keys of the GGUF of the same checkpoint, transformers' defaults for what it leaves out, and what
// fathom fixes (the clamped SwiGLU's constants, alternating windows from a sliding first layer, the
// untruncated YaRN) is held to config.json by name.
TEST(HfConfig, GptOssAsLlamaCppsConverter) {
  const HfConfig h = hf_config_from_json(fixture_config("gpt-oss").dump(), "config.json");
  EXPECT_EQ(h.arch, "gpt-oss");
  const auto gguf = GgufFile::open(kArch + "gpt-oss.gguf");
  int keys = 0;
  for (const auto& [key, value] : gguf->metadata())
    if (key.starts_with("gpt-oss.")) {
      ++keys;
      ASSERT_TRUE(h.metadata.contains(key)) << key;
      EXPECT_EQ(h.metadata.at(key), value) << key;
    }
  EXPECT_EQ(keys, 17);  // expert_feed_forward_length, attention.sliding_window, rope.scaling.* among them
  EXPECT_EQ(h.tie_word_embeddings, false);

  // transformers' defaults: head_dim 64, a 128-token window, the released YaRN (factor 32 over 4096).
  json bare = fixture_config("gpt-oss");
  for (const char* k : {"head_dim", "sliding_window", "layer_types", "rope_parameters", "swiglu_alpha", "swiglu_limit"})
    bare.erase(k);
  const HfConfig d = hf_config_from_json(bare.dump(), "config.json");
  EXPECT_EQ(std::get<uint32_t>(d.metadata.at("gpt-oss.attention.key_length")), 64u);
  EXPECT_EQ(std::get<uint32_t>(d.metadata.at("gpt-oss.attention.sliding_window")), 128u);
  EXPECT_EQ(std::get<std::string>(d.metadata.at("gpt-oss.rope.scaling.type")), "yarn");
  EXPECT_EQ(std::get<float>(d.metadata.at("gpt-oss.rope.scaling.factor")), 32.0f);
  EXPECT_EQ(std::get<uint32_t>(d.metadata.at("gpt-oss.rope.scaling.original_context_length")), 4096u);
  EXPECT_EQ(std::get<float>(d.metadata.at("gpt-oss.rope.freq_base")), 150000.0f);

  // The released config.json's other keys: transformers 4's rope_scaling and rope_theta, the
  // top-k restated, the original context, the MXFP4 quantization of the experts.
  json released = fixture_config("gpt-oss");
  released["rope_scaling"] = released["rope_parameters"];
  released["rope_scaling"].erase("rope_theta");
  released["rope_theta"] = 150000;
  released.erase("rope_parameters");
  released["experts_per_token"] = 2;
  released["initial_context_length"] = 64;
  released["quantization_config"] = {{"quant_method", "mxfp4"},
                                     {"modules_to_not_convert", {"model.layers.*.self_attn", "lm_head"}}};
  EXPECT_EQ(hf_config_from_json(released.dump(), "config.json").metadata, h.metadata);

  // gpt-oss-120b's config.json as released (huggingface.co/openai/gpt-oss-120b).
  json layer_types = json::array();
  for (int il = 0; il < 36; ++il) layer_types.push_back(il % 2 ? "full_attention" : "sliding_attention");
  const json big = {
      {"architectures", {"GptOssForCausalLM"}}, {"attention_bias", true}, {"attention_dropout", 0.0},
      {"eos_token_id", 200002}, {"experts_per_token", 4}, {"head_dim", 64}, {"hidden_act", "silu"},
      {"hidden_size", 2880}, {"initial_context_length", 4096}, {"initializer_range", 0.02},
      {"intermediate_size", 2880}, {"layer_types", layer_types}, {"max_position_embeddings", 131072},
      {"model_type", "gpt_oss"}, {"num_attention_heads", 64}, {"num_experts_per_tok", 4}, {"num_hidden_layers", 36},
      {"num_key_value_heads", 8}, {"num_local_experts", 128}, {"output_router_logits", false},
      {"pad_token_id", 199999},
      {"quantization_config",
       {{"modules_to_not_convert",
         {"model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"}},
        {"quant_method", "mxfp4"}}},
      {"rms_norm_eps", 1e-05},
      {"rope_scaling",
       {{"beta_fast", 32.0}, {"beta_slow", 1.0}, {"factor", 32.0}, {"original_max_position_embeddings", 4096},
        {"rope_type", "yarn"}, {"truncate", false}}},
      {"rope_theta", 150000}, {"router_aux_loss_coef", 0.9}, {"sliding_window", 128}, {"swiglu_limit", 7.0},
      {"tie_word_embeddings", false}, {"transformers_version", "4.55.0.dev0"}, {"use_cache", true},
      {"vocab_size", 201088}};
  const HfConfig r = hf_config_from_json(big.dump(), "config.json");
  EXPECT_EQ(std::get<uint32_t>(r.metadata.at("gpt-oss.expert_count")), 128u);
  EXPECT_EQ(std::get<uint32_t>(r.metadata.at("gpt-oss.expert_feed_forward_length")), 2880u);
  EXPECT_EQ(std::get<uint32_t>(r.metadata.at("gpt-oss.rope.scaling.original_context_length")), 4096u);
  EXPECT_EQ(r.eos_ids, std::vector<int64_t>{200002});

  const std::pair<const char*, json> refused[] = {
      {"swiglu_alpha", 1.0},
      {"swiglu_limit", 10.0},
      {"layer_types", {"full_attention", "sliding_attention"}},
      {"layer_types", {"sliding_attention", "sliding_attention"}},
      {"sliding_window", nullptr},
      {"experts_per_token", 3},
      {"quantization_config", {{"quant_method", "bitsandbytes"}}},
      {"rope_parameters", {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 64}}},
  };
  for (const auto& [key, value] : refused) {
    json c = fixture_config("gpt-oss");
    c[key] = value;
    const std::string want = std::string(key) == "rope_parameters"       ? "truncate = true"
                             : std::string(key) == "quantization_config" ? "quant_method"
                                                                          : key;
    EXPECT_NE(config_error(c).find(want), std::string::npos) << key << ": " << config_error(c);
  }
  // truncate false is gpt-oss's alone: fathom truncates every other architecture's YaRN ramp.
  json qwen = fixture_config("qwen2");
  qwen["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 64},
                             {"truncate", false}};
  EXPECT_NE(config_error(qwen).find("truncate = false"), std::string::npos) << config_error(qwen);
}

// gpt-oss's fused experts, transposed and split (bf16) or repacked (MXFP4) at load, are the GGUF's
// bytes; so are its router, sinks and biases.
TEST(HfDir, GptOssExpertsAreTheGgufsBytes) {
  for (const auto& [dir, file] : {std::pair{"gpt-oss-hf", "gpt-oss.gguf"}, {"gpt-oss-mxfp4-hf", "gpt-oss.mxfp4.gguf"}}) {
    const auto hf = Model::load(kArch + dir);
    const auto gguf = Model::load(kArch + file);
    ASSERT_EQ(hf->config().n_experts, 4);
    for (size_t il = 0; il < 2; ++il) {
      const LayerWeights &a = hf->weights().layers[il], &b = gguf->weights().layers[il];
      for (int e = 0; e < 4; ++e)
        for (const auto& [x, y] : {std::pair{&a.gate_exps[e], &b.gate_exps[e]}, {&a.up_exps[e], &b.up_exps[e]},
                                   {&a.down_exps[e], &b.down_exps[e]}}) {
          ASSERT_EQ(x->type, y->type) << dir << " layer " << il << " expert " << e;
          ASSERT_EQ(x->bytes(), y->bytes());
          EXPECT_EQ(std::memcmp(x->data, y->data, x->bytes()), 0) << dir << " layer " << il << " expert " << e;
        }
      EXPECT_EQ(a.gate_exps_bias, b.gate_exps_bias) << dir;
      EXPECT_EQ(a.up_exps_bias, b.up_exps_bias) << dir;
      EXPECT_EQ(a.down_exps_bias, b.down_exps_bias) << dir;
      EXPECT_EQ(a.router_bias, b.router_bias) << dir;
      EXPECT_EQ(a.attn_sinks, b.attn_sinks) << dir;
      EXPECT_EQ(a.ffn_norm, b.ffn_norm) << dir;
    }
    EXPECT_EQ(hf->weights().layers[0].gate_exps[0].type, std::string(dir) == "gpt-oss-hf" ? GgmlType::BF16 : GgmlType::MXFP4);
  }
  {
    ScratchDir dir("gpt-oss");  // experts of another width than config.json's
    json c = fixture_config("gpt-oss");
    c["intermediate_size"] = 48;
    dir.write("config.json", c.dump());
    EXPECT_NE(load_error(dir.path()).find("'model.layers.0.mlp.experts.gate_up_proj' has shape [4, 64, 160], "
                                          "expected [4, 64, 96]"),
              std::string::npos)
        << load_error(dir.path());
  }
  {
    ScratchDir dir("gpt-oss-mxfp4");  // MXFP4 blocks without their scales
    std::ifstream in(dir.path() + "/model.safetensors", std::ios::binary);
    const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    json header = json::object();
    std::vector<uint8_t> data;
    for (const auto& t : parse_safetensors(bytes.data(), bytes.size(), "m")) {
      if (t.name == "model.layers.1.mlp.experts.gate_up_proj_scales") continue;
      header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {data.size(), data.size() + t.nbytes}}};
      data.insert(data.end(), t.data, t.data + t.nbytes);
    }
    const auto img = image(header.dump(), data);
    std::ofstream(dir.path() + "/model.safetensors", std::ios::binary)
        .write(reinterpret_cast<const char*>(img.data()), static_cast<std::streamsize>(img.size()));
    EXPECT_NE(load_error(dir.path()).find("'model.layers.1.mlp.experts.gate_up_proj_blocks' has no _scales"),
              std::string::npos)
        << load_error(dir.path());
  }
}

// A Gemma directory reads its norms as 1 + w, what the GGUF of the same checkpoint stores; the
// matrices are the same bytes.
TEST(HfDir, GemmaNormsAreOnePlusTheCheckpoints) {
  for (const char* family : {"gemma2", "gemma3"}) {
    const auto hf = Model::load(kArch + family + "-hf");
    const auto gguf = Model::load(kArch + family + ".gguf");
    EXPECT_EQ(hf->config().norm_offset, 1.0f);
    EXPECT_EQ(gguf->config().norm_offset, 0.0f);
    const LayerWeights &a = hf->weights().layers[1], &b = gguf->weights().layers[1];
    EXPECT_EQ(a.attn_norm, b.attn_norm) << family;
    EXPECT_EQ(a.post_attn_norm, b.post_attn_norm) << family;
    EXPECT_EQ(a.ffn_norm, b.ffn_norm) << family;
    EXPECT_EQ(a.post_ffn_norm, b.post_ffn_norm) << family;
    EXPECT_EQ(a.q_norm, b.q_norm) << family;
    EXPECT_EQ(a.k_norm, b.k_norm) << family;
    EXPECT_EQ(hf->weights().output_norm, gguf->weights().output_norm) << family;
    ASSERT_EQ(a.w_gate.bytes(), b.w_gate.bytes());
    EXPECT_EQ(std::memcmp(a.w_gate.data, b.w_gate.data, a.w_gate.bytes()), 0);
    EXPECT_EQ(hf->config().attn_scale, gguf->config().attn_scale);
    for (size_t il = 0; il < hf->config().layers.size(); ++il) {
      const LayerConfig &x = hf->config().layers[il], &y = gguf->config().layers[il];
      EXPECT_EQ(x.sliding, y.sliding) << family << " layer " << il;
      EXPECT_EQ(x.window, y.window) << family << " layer " << il;
      EXPECT_EQ(x.rope_inv_freq, y.rope_inv_freq) << family << " layer " << il;
    }
  }
}

// Rewrites a scratch directory's model.safetensors: each tensor under the name `rename` gives it
// ("" drops it), then `extra` (name -> dtype, shape), zero-filled.
void rewrite_shard(const ScratchDir& dir, const std::function<std::string(const std::string&)>& rename,
                   const std::vector<std::tuple<std::string, std::string, std::vector<int64_t>>>& extra = {}) {
  std::ifstream in(dir.path() + "/model.safetensors", std::ios::binary);
  const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  json header = json::object();
  std::vector<uint8_t> data;
  for (const auto& t : parse_safetensors(bytes.data(), bytes.size(), "m")) {
    const std::string name = rename(t.name);
    if (name.empty()) continue;
    header[name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {data.size(), data.size() + t.nbytes}}};
    data.insert(data.end(), t.data, t.data + t.nbytes);
  }
  for (const auto& [name, dtype, shape] : extra) {
    size_t n = dtype == "F32" ? 4 : 2;
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    header[name] = {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {data.size(), data.size() + n}}};
    data.resize(data.size() + n);
  }
  const auto img = image(header.dump(), data);
  std::ofstream(dir.path() + "/model.safetensors", std::ios::binary)
      .write(reinterpret_cast<const char*>(img.data()), static_cast<std::streamsize>(img.size()));
}

// Gemma3ForConditionalGeneration serves its text model: the released layout (language_model.model.*,
// gemma3-mm-hf) and transformers >= 4.52's (model.language_model.*) load gemma3-hf's weights, the
// vision tower's and projector's tensors skipped; any other tensor is refused by its name.
TEST(HfDir, Gemma3ConditionalGenerationServesItsTextModel) {
  const auto text = Model::load(kArch + "gemma3-hf");
  const auto same_weights = [&](const Model& m, const std::string& what) {
    EXPECT_EQ(m.config().arch, Architecture::kGemma3) << what;
    EXPECT_EQ(m.config().norm_offset, 1.0f) << what;
    EXPECT_EQ(m.vocab(), text->vocab()) << what;
    EXPECT_EQ(m.tokenizer().eos_id(), text->tokenizer().eos_id()) << what;
    EXPECT_EQ(m.weights().output_norm, text->weights().output_norm) << what;
    for (size_t il = 0; il < text->weights().layers.size(); ++il) {
      const LayerWeights &a = m.weights().layers[il], &b = text->weights().layers[il];
      EXPECT_EQ(a.q_norm, b.q_norm) << what << " layer " << il;
      EXPECT_EQ(a.post_ffn_norm, b.post_ffn_norm) << what << " layer " << il;
      for (const auto& [x, y] : {std::pair{&a.wq, &b.wq}, {&a.w_down, &b.w_down}}) {
        ASSERT_EQ(x->bytes(), y->bytes()) << what;
        EXPECT_EQ(std::memcmp(x->data, y->data, x->bytes()), 0) << what << " layer " << il;
      }
    }
  };
  same_weights(*Model::load(kArch + "gemma3-mm-hf"), "released layout");

  // transformers >= 4.52's names, and an untied head (language_model.lm_head as released,
  // lm_head at the top as 4.52 saves it).
  const auto v452 = [](const std::string& n) {
    for (const char* p : {"vision_tower.", "multi_modal_projector."})
      if (n.starts_with(p)) return "model." + n;
    return n.starts_with("language_model.model.") ? "model.language_model." + n.substr(21) : n;
  };
  {
    ScratchDir dir("gemma3-mm");
    rewrite_shard(dir, v452);
    same_weights(*Model::load(dir.path()), "transformers >= 4.52's layout");
  }
  for (const char* head : {"language_model.lm_head.weight", "lm_head.weight"}) {
    ScratchDir dir("gemma3-mm");
    json c = fixture_config("gemma3-mm");
    c["tie_word_embeddings"] = false;
    dir.write("config.json", c.dump());
    EXPECT_NE(load_error(dir.path()).find("no lm_head.weight"), std::string::npos) << load_error(dir.path());
    rewrite_shard(dir, [](const std::string& n) { return n; }, {{head, "BF16", {128, 32}}});
    const auto m = Model::load(dir.path());
    EXPECT_NE(m->weights().output.data, m->weights().token_embd.data) << head;
  }

  // Refused, each by name: the text model's tensors under the text-only class's names, a tensor
  // of neither model, the two layouts mixed, and the directory's config refusals.
  {
    ScratchDir dir("gemma3-mm");
    rewrite_shard(dir, [](const std::string& n) { return n; },
                  {{"model.norm.weight", "BF16", {32}},
                   {"language_model.model.layers.0.mlp.down_proj.bias", "BF16", {32}},
                   {"image_newline", "BF16", {32}}});
    const std::string e = load_error(dir.path());
    EXPECT_NE(e.find("3 tensors that fathom's gemma3 does not use"), std::string::npos) << e;
    EXPECT_NE(e.find("'model.norm.weight'"), std::string::npos) << e;
    EXPECT_NE(e.find("'blk.0.ffn_down.bias'"), std::string::npos) << e;  // an MLP bias, by its GGUF name
    EXPECT_NE(e.find("'image_newline'"), std::string::npos) << e;
  }
  {
    ScratchDir dir("gemma3-mm");
    rewrite_shard(dir, [](const std::string& n) { return n; },
                  {{"model.language_model.layers.1.self_attn.q_norm.weight", "BF16", {24}}});
    EXPECT_NE(load_error(dir.path()).find("are the same weight (blk.1.attn_q_norm.weight)"), std::string::npos)
        << load_error(dir.path());
  }
  {
    ScratchDir dir("gemma3-mm");
    json c = fixture_config("gemma3-mm");
    c["image_seq_length"] = 256;
    dir.write("config.json", c.dump());
    EXPECT_NE(load_error(dir.path()).find("'image_seq_length'"), std::string::npos) << load_error(dir.path());
  }
}

// Against Python's unicodedata.normalize("NFC", ...) (tests/e2e/test_hf_tokenizer.py compares the
// tokenizer with `tokenizers` on thousands of random strings).
TEST(Nfc, ComposesAsUax15) {
  const std::pair<const char*, const char*> cases[] = {
      {"e\u0301", "\u00e9"},
      {"A\u030a \u212b", "\u00c5 \u00c5"},                   // the Angstrom sign is a singleton
      {"\u1100\u1161\u11a8", "\uac01"},                      // Hangul jamo L V T
      {"\uac00\u11a8", "\uac01"},                             // LV syllable + T
      {"a\u0301\u0327", "\u00e1\u0327"},                      // reordered: cedilla (202) before acute (230)
      {"C\u0301\u0327", "\u1e08"},                            // C + cedilla + acute -> one composite
      {"\u0f73", "\u0f71\u0f72"},                             // composition-excluded
      {"plain ascii", "plain ascii"},
      {"\xff invalid", "\xff invalid"},                        // not UTF-8: unchanged
  };
  for (const auto& [in, want] : cases) EXPECT_EQ(nfc(in), want) << in;
}

}  // namespace
}  // namespace fathom
