#include "engine/model/hf_dir.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string_view>

#include "base/error.h"
#include "engine/model/hf_config.h"
#include "engine/model/hf_gpt_oss.h"
#include "engine/model/hf_json.h"
#include "engine/model/hf_tokenizer.h"
#include "engine/model/mapped_file.h"
#include "engine/model/safetensors.h"

namespace fathom {
namespace {

// Size limits of the directory's text files: far above any published checkpoint's (Llama 3's
// tokenizer.json is 9 MB, a 405B model's shard index 100 KB).
constexpr size_t kMaxConfig = 1 << 20, kMaxTokenizer = 64 << 20, kMaxIndex = 16 << 20, kMaxTemplate = 1 << 20;
constexpr size_t kMaxShards = 4096;

// Per-layer tensors: HF suffix after "model.layers.<i>." -> GGUF suffix after "blk.<i>.".
constexpr std::pair<std::string_view, std::string_view> kLayerNames[] = {
    {"input_layernorm.weight", "attn_norm.weight"},
    {"self_attn.q_proj.weight", "attn_q.weight"},
    {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.v_proj.weight", "attn_v.weight"},
    {"self_attn.q_proj.bias", "attn_q.bias"},
    {"self_attn.k_proj.bias", "attn_k.bias"},
    {"self_attn.v_proj.bias", "attn_v.bias"},
    {"self_attn.qkv_proj.weight", "attn_qkv.weight"},
    {"self_attn.qkv_proj.bias", "attn_qkv.bias"},
    {"self_attn.o_proj.weight", "attn_output.weight"},
    {"self_attn.o_proj.bias", "attn_output.bias"},
    {"self_attn.q_norm.weight", "attn_q_norm.weight"},
    {"self_attn.k_norm.weight", "attn_k_norm.weight"},
    {"post_attention_layernorm.weight", "ffn_norm.weight"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},
    {"mlp.up_proj.weight", "ffn_up.weight"},
    {"mlp.gate_up_proj.weight", "ffn_up.weight"},  // phi3: gate rows, then up rows
    {"mlp.down_proj.weight", "ffn_down.weight"},
    {"mlp.gate_proj.bias", "ffn_gate.bias"},
    {"mlp.up_proj.bias", "ffn_up.bias"},
    {"mlp.down_proj.bias", "ffn_down.bias"},
    {"mlp.gate.weight", "ffn_gate_inp.weight"},               // qwen3moe's router
    {"block_sparse_moe.gate.weight", "ffn_gate_inp.weight"},  // Mixtral's
};
// Gemma 2 and 3 normalise each sublayer's input and output: post_attention_layernorm is the
// attention output's norm there (llama.cpp's post_attention_norm), not the MLP input's (llama's
// name for it), which is pre_feedforward_layernorm.
constexpr std::pair<std::string_view, std::string_view> kGemmaLayerNames[] = {
    {"post_attention_layernorm.weight", "post_attention_norm.weight"},
    {"pre_feedforward_layernorm.weight", "ffn_norm.weight"},
    {"post_feedforward_layernorm.weight", "post_ffw_norm.weight"},
};
// gpt-oss's: its pre-MLP norm is post_attention_layernorm, which llama.cpp names as it names Gemma's
// attention output norm; its router has a bias; its attention sinks. Its fused experts are
// hf_gpt_oss.h's.
constexpr std::pair<std::string_view, std::string_view> kGptOssLayerNames[] = {
    {"post_attention_layernorm.weight", "post_attention_norm.weight"},
    {"self_attn.sinks", "attn_sinks.weight"},
    {"mlp.router.weight", "ffn_gate_inp.weight"},
    {"mlp.router.bias", "ffn_gate_inp.bias"},
};
// An expert's matrices: HF suffix after "<prefix><e>." -> GGUF "ffn_<part>.<e>.weight" (one tensor
// per expert, which the weights loader reads as it reads llama.cpp's stacked ones).
constexpr std::string_view kExpertPrefixes[] = {"mlp.experts.", "block_sparse_moe.experts."};
constexpr std::pair<std::string_view, std::string_view> kExpertNames[] = {
    {"gate_proj.weight", "ffn_gate"}, {"up_proj.weight", "ffn_up"}, {"down_proj.weight", "ffn_down"},  // qwen3moe
    {"w1.weight", "ffn_gate"}, {"w3.weight", "ffn_up"}, {"w2.weight", "ffn_down"},                     // Mixtral
};

// The decimal number at the start of `s` (at most 6 digits, no leading zero) and its length; 0 when none.
size_t leading_number(std::string_view s, int64_t& value) {
  size_t i = 0;
  value = 0;
  while (i < s.size() && i < 6 && s[i] >= '0' && s[i] <= '9') value = value * 10 + (s[i++] - '0');
  return i == 0 || (s[0] == '0' && i > 1) ? 0 : i;
}
constexpr std::pair<std::string_view, std::string_view> kGlobalNames[] = {
    {"model.embed_tokens.weight", "token_embd.weight"},
    {"model.norm.weight", "output_norm.weight"},
    {"lm_head.weight", "output.weight"},
};

// Gemma3ForConditionalGeneration's tensors. The text model's are under language_model.model.* as
// released (transformers < 4.52, whose language_model was a Gemma3ForCausalLM) and under
// model.language_model.* as transformers >= 4.52 saves them (transformers turns the first into the
// second at load: the _checkpoint_conversion_mapping of 4.52, conversion_mapping.py's "llava" renames
// of 5); a head of its own is language_model.lm_head.weight or lm_head.weight. The vision tower and
// the projector that joins it to the text are not served: their tensors are skipped.
constexpr std::pair<std::string_view, std::string_view> kMultimodalTextPrefixes[] = {
    {"language_model.model.", "model."}, {"model.language_model.", "model."}, {"language_model.lm_head.", "lm_head."},
    {"lm_head.", "lm_head."}};
constexpr std::string_view kMultimodalVisionPrefixes[] = {"vision_tower.", "multi_modal_projector.",
                                                          "model.vision_tower.", "model.multi_modal_projector."};

// A ConditionalGeneration checkpoint's tensor: nullopt for the vision model's (skipped), else its
// name in a text-only checkpoint ("" when it is neither model's: refused by its own name).
std::optional<std::string> multimodal_text_name(const std::string& name) {
  for (std::string_view prefix : kMultimodalVisionPrefixes)
    if (name.starts_with(prefix)) return std::nullopt;
  for (const auto& [prefix, text] : kMultimodalTextPrefixes)
    if (name.starts_with(prefix)) return std::string(text) + name.substr(prefix.size());
  return std::string();
}

std::string strip_slashes(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}

// A shard's file name from the index: a plain name inside the directory, never a path.
void check_shard_name(const std::string& name, const std::string& index_path) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
      name.find('\\') != std::string::npos || name.find('\0') != std::string::npos)
    throw Error(index_path + ": shard " + hf::shown(name) + " is not a file name inside the directory");
}

// weight_map of model.safetensors.index.json: tensor -> shard file.
std::map<std::string, std::string> read_index(const std::string& text, const std::string& path) {
  const hf::Json j = hf::parse_json(text, path, 4);
  const auto it = j.is_object() ? j.find("weight_map") : j.end();
  if (it == j.end() || !it->is_object()) throw Error(path + ": no weight_map object");
  std::map<std::string, std::string> map;
  std::set<std::string> files;
  for (const auto& [tensor, file] : it->items()) {
    if (!file.is_string()) throw Error(path + ": weight_map entry " + hf::shown(tensor) + " is not a file name");
    check_shard_name(file.get<std::string>(), path);
    files.insert(file.get<std::string>());
    if (files.size() > kMaxShards) throw Error(path + ": more than " + std::to_string(kMaxShards) + " shards");
    map.emplace(tensor, file.get<std::string>());
  }
  if (map.empty()) throw Error(path + ": weight_map is empty");
  return map;
}

GgufTensorInfo tensor_info(const SafetensorsTensor& t, std::string name, const std::string& shard) {
  GgufTensorInfo info{};
  info.name = std::move(name);
  if (!safetensors_ggml_type(t.dtype, info.type))
    throw Error(shard + ": tensor " + hf::shown(t.name) + " has dtype " + hf::shown(t.dtype) +
                ", which fathom does not read (F32, F16, BF16)");
  if (t.shape.size() > 4) throw Error(shard + ": tensor " + hf::shown(t.name) + " has more than 4 dimensions");
  info.dims.assign(t.shape.rbegin(), t.shape.rend());  // ggml order: innermost first
  if (info.dims.empty()) info.dims.push_back(1);
  info.offset = 0;
  info.data = t.data;
  info.nbytes = t.nbytes;
  return info;
}

HfTokenizerFiles tokenizer_files(const std::string& dir) {
  HfTokenizerFiles tf;
  tf.dir = dir;
  const std::optional<std::string> tokenizer = hf::read_text_file(dir + "/tokenizer.json", kMaxTokenizer);
  if (!tokenizer) throw Error(dir + ": no tokenizer.json (fathom reads the tokenizer from it)");
  tf.tokenizer_json = *tokenizer;
  tf.tokenizer_config_json = hf::read_text_file(dir + "/tokenizer_config.json", kMaxTokenizer);
  tf.generation_config_json = hf::read_text_file(dir + "/generation_config.json", kMaxConfig);
  tf.chat_template_jinja = hf::read_text_file(dir + "/chat_template.jinja", kMaxTemplate);
  return tf;
}

}  // namespace

std::unique_ptr<GgufFile> open_hf_tokenizer(const std::string& dir_arg) {
  const std::string dir = strip_slashes(dir_arg);
  const HfTokenizerFiles tf = tokenizer_files(dir);
  std::map<std::string, GgufValue> metadata;
  int64_t rows = 0;
  std::vector<int64_t> eos;
  std::optional<int64_t> bos;
  if (const auto text = hf::read_text_file(dir + "/config.json", kMaxConfig)) {
    HfConfig cfg = hf_config_from_json(*text, dir + "/config.json");
    rows = cfg.vocab_size, eos = cfg.eos_ids, bos = cfg.bos_id;
  } else {
    // No config: as many ids as the vocabulary and added tokens use.
    const hf::Json tok = hf::parse_json(tf.tokenizer_json, dir + "/tokenizer.json", 16);
    auto max_id = [&](const hf::Json& v) {
      if (v.is_number_unsigned()) rows = std::max<int64_t>(rows, static_cast<int64_t>(std::min<uint64_t>(v.get<uint64_t>(), 1 << 21)) + 1);
    };
    if (tok.is_object() && tok.contains("model") && tok["model"].is_object() && tok["model"].contains("vocab") &&
        tok["model"]["vocab"].is_object())
      for (const auto& entry : tok["model"]["vocab"].items()) max_id(entry.value());
    if (tok.is_object() && tok.contains("added_tokens") && tok["added_tokens"].is_array())
      for (const hf::Json& t : tok["added_tokens"])
        if (t.is_object() && t.contains("id")) max_id(t["id"]);
  }
  hf_tokenizer_metadata(tf, rows, eos, bos, metadata);
  return GgufFile::assemble(dir, std::move(metadata), {}, {}, {});
}

std::unique_ptr<GgufFile> open_model_file(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_directory(path, ec) ? open_hf_directory(path) : GgufFile::open(path);
}

std::string gguf_tensor_name(const std::string& hf_name, int64_t n_layers, std::string_view arch) {
  for (const auto& [hf, gguf] : kGlobalNames)
    if (hf_name == hf) return std::string(gguf);
  constexpr std::string_view kLayers = "model.layers.";
  if (!hf_name.starts_with(kLayers)) return hf_name;
  const std::string_view after = std::string_view(hf_name).substr(kLayers.size());
  int64_t layer = 0;
  const size_t digits = leading_number(after, layer);
  if (digits == 0 || digits >= after.size() || after[digits] != '.' || layer >= n_layers) return hf_name;
  const std::string_view suffix = after.substr(digits + 1);
  const std::string blk = "blk." + std::to_string(layer) + ".";
  if (arch == "gemma2" || arch == "gemma3")
    for (const auto& [hf, gguf] : kGemmaLayerNames)
      if (suffix == hf) return blk + std::string(gguf);
  if (arch == "gpt-oss")
    for (const auto& [hf, gguf] : kGptOssLayerNames)
      if (suffix == hf) return blk + std::string(gguf);
  for (const auto& [hf, gguf] : kLayerNames)
    if (suffix == hf) return blk + std::string(gguf);
  for (std::string_view prefix : kExpertPrefixes) {
    if (!suffix.starts_with(prefix)) continue;
    const std::string_view rest = suffix.substr(prefix.size());
    int64_t expert = 0;
    const size_t n = leading_number(rest, expert);
    if (n == 0 || n >= rest.size() || rest[n] != '.') return hf_name;
    for (const auto& [hf, gguf] : kExpertNames)
      if (rest.substr(n + 1) == hf) return blk + std::string(gguf) + "." + std::to_string(expert) + ".weight";
  }
  return hf_name;
}

std::unique_ptr<GgufFile> open_hf_directory(const std::string& dir_arg) {
  const std::string dir = strip_slashes(dir_arg);
  const std::string config_path = dir + "/config.json";
  const std::optional<std::string> config_text = hf::read_text_file(config_path, kMaxConfig);
  if (!config_text) throw Error(dir + ": a model directory needs config.json (a Hugging Face checkpoint)");
  HfConfig cfg = hf_config_from_json(*config_text, config_path);
  const int64_t n_layers = std::get<uint32_t>(cfg.metadata.at(cfg.arch + ".block_count"));

  hf_tokenizer_metadata(tokenizer_files(dir), cfg.vocab_size, cfg.eos_ids, cfg.bos_id, cfg.metadata);

  // Shards: the index's, or the one model.safetensors.
  const std::string index_path = dir + "/model.safetensors.index.json";
  std::map<std::string, std::string> weight_map;
  std::set<std::string> shard_names;
  if (const auto index = hf::read_text_file(index_path, kMaxIndex)) {
    weight_map = read_index(*index, index_path);
    for (const auto& entry : weight_map) shard_names.insert(entry.second);
  } else {
    shard_names.insert("model.safetensors");
  }
  std::vector<std::shared_ptr<const MappedFile>> maps;
  std::vector<GgufTensorInfo> tensors;
  std::set<std::string> seen;
  std::map<std::string, std::string> gguf_names;  // GGUF name -> the checkpoint's
  bool has_lm_head = false;
  const auto meta_int = [&](const char* key) { return int64_t{std::get<uint32_t>(cfg.metadata.at(cfg.arch + key))}; };
  std::optional<GptOssExperts> gpt_oss;
  if (cfg.arch == "gpt-oss")
    gpt_oss.emplace(n_layers, meta_int(".expert_count"), meta_int(".expert_feed_forward_length"),
                    meta_int(".embedding_length"));
  for (const std::string& shard : shard_names) {
    const std::string shard_path = dir + "/" + shard;
    std::shared_ptr<const MappedFile> map = MappedFile::open(shard_path);
    for (const SafetensorsTensor& t : parse_safetensors(map->data(), map->size(), shard_path)) {
      if (!seen.insert(t.name).second)
        throw Error(shard_path + ": tensor " + hf::shown(t.name) + " is also in another shard");
      if (!weight_map.empty()) {
        const auto it = weight_map.find(t.name);
        if (it == weight_map.end() || it->second != shard)
          throw Error(shard_path + ": tensor " + hf::shown(t.name) + " is not listed under this shard in " + index_path);
      }
      // A buffer old checkpoints saved, recomputed from config.json (llama.cpp's converter skips it too).
      if (t.name.ends_with(".rotary_emb.inv_freq")) continue;
      if (gpt_oss && gpt_oss->take(t, shard_path)) continue;
      // Its name in a text model's checkpoint ("" for none).
      std::string hf_name = t.name;
      if (cfg.multimodal) {
        std::optional<std::string> text = multimodal_text_name(t.name);
        if (!text) continue;  // the vision model's: not served
        hf_name = std::move(*text);
      }
      if (hf_name == "lm_head.weight") {
        has_lm_head = true;
        // Tied: transformers uses the embedding in its place.
        if (cfg.tie_word_embeddings.value_or(false)) continue;
      }
      // One without a GGUF name keeps the checkpoint's: the weights loader refuses it as unused.
      std::string gguf = hf_name.empty() ? hf_name : gguf_tensor_name(hf_name, n_layers, cfg.arch);
      if (gguf == hf_name) gguf = t.name;
      if (const auto [it, fresh] = gguf_names.emplace(gguf, t.name); !fresh)
        throw Error(shard_path + ": tensors " + hf::shown(it->second) + " and " + hf::shown(t.name) +
                    " are the same weight (" + gguf + ")");
      tensors.push_back(tensor_info(t, std::move(gguf), shard_path));
    }
    maps.push_back(std::move(map));
  }
  for (const auto& [tensor, shard] : weight_map)
    if (!seen.contains(tensor))
      throw Error(index_path + ": tensor " + hf::shown(tensor) + " is not in its shard " + hf::shown(shard));
  if (cfg.tie_word_embeddings == false && !has_lm_head)
    throw Error(config_path + ": tie_word_embeddings is false but the checkpoint has no lm_head.weight");
  // The vocabulary was padded to vocab_size: every row of the embedding must have its token.
  for (const GgufTensorInfo& t : tensors)
    if (t.name == "token_embd.weight" && (t.dims.size() != 2 || t.dims[1] != cfg.vocab_size))
      throw Error(dir + ": model.embed_tokens.weight has " + std::to_string(t.dims.back()) +
                  " rows, but config.json vocab_size is " + std::to_string(cfg.vocab_size));

  std::vector<std::vector<uint8_t>> owned;
  if (gpt_oss) gpt_oss->emit(tensors, owned);
  for (const auto& [name, values] : cfg.extra_tensors) {
    std::vector<uint8_t> bytes(values.size() * sizeof(float));
    std::memcpy(bytes.data(), values.data(), bytes.size());
    GgufTensorInfo info{};
    info.name = name;
    info.type = GgmlType::F32;
    info.dims = {static_cast<int64_t>(values.size())};
    info.data = bytes.data();
    info.nbytes = bytes.size();
    tensors.push_back(std::move(info));
    owned.push_back(std::move(bytes));
  }
  return GgufFile::assemble(dir, std::move(cfg.metadata), std::move(tensors), std::move(maps), std::move(owned));
}

}  // namespace fathom
