#include "engine/model/hf_config.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <iterator>
#include <set>

#include "base/error.h"
#include "engine/model/hf_json.h"
#include "engine/model/model_config.h"

namespace fathom {
namespace {

using hf::Json;
using hf::shown;

struct ArchName {
  const char* hf_class;    // config.json "architectures"
  const char* model_type;  // config.json "model_type"
  const char* gguf;        // general.architecture
  bool experts = false;    // a mixture of experts
  bool vision = false;     // a vision model beside the text model, whose config is text_config
};
// Mistral is llama, with its sliding window (on every layer) when it has one; Mixtral is llama with
// experts, as llama.cpp writes it. Gemma 3's text-only class (model_type gemma3_text) is gemma3, and
// so is the text model of Gemma3ForConditionalGeneration (model_type gemma3: Gemma 3 4B, 12B and 27B
// as released), whose vision tower fathom does not serve (translate_gemma3_multimodal).
constexpr ArchName kArchs[] = {{"LlamaForCausalLM", "llama", "llama"},
                               {"MistralForCausalLM", "mistral", "llama"},
                               {"MixtralForCausalLM", "mixtral", "llama", true},
                               {"Qwen2ForCausalLM", "qwen2", "qwen2"},
                               {"Qwen3ForCausalLM", "qwen3", "qwen3"},
                               {"Qwen3MoeForCausalLM", "qwen3_moe", "qwen3moe", true},
                               {"Phi3ForCausalLM", "phi3", "phi3"},
                               {"Gemma2ForCausalLM", "gemma2", "gemma2"},
                               {"Gemma3ForCausalLM", "gemma3_text", "gemma3"},
                               {"GptOssForCausalLM", "gpt_oss", "gpt-oss", true},
                               {"Gemma3ForConditionalGeneration", "gemma3", "gemma3", false, true}};
constexpr const ArchName& kGemma3Text = kArchs[8];
static_assert(std::string_view(kGemma3Text.model_type) == "gemma3_text");

// Gemma3TextConfig's defaults (transformers' models/gemma3/configuration_gemma3.py) for the keys
// fathom needs that a Gemma 3 config.json may leave out: the 4B, 12B and 27B's text_config names
// only what differs from them (the 4B's has no head count, vocab_size, context, rms_norm_eps, ...).
// The others (head_dim 256, query_pre_attn_scalar 256, sliding_window 4096, rope_theta 1e6,
// rope_local_base_freq 10000, sliding_window_pattern 6, no soft-caps, tied) are defaulted where
// they are read.
struct Gemma3TextDefaults {
  static constexpr int64_t vocab_size = 262208, hidden_size = 2304, intermediate_size = 9216,
                           num_hidden_layers = 26, num_attention_heads = 8, num_key_value_heads = 4,
                           max_position_embeddings = 131072;
  static constexpr double rms_norm_eps = 1e-6;
};

// Gemma3Config's keys of the vision model and of the joining of images into the text (and their
// aliases, transformers' attribute_map): fathom serves the text model only, so they are read as
// knowingly unused, as the vision tower's tensors are skipped (hf_dir.cpp).
constexpr std::string_view kGemma3VisionKeys[] = {"mm_tokens_per_image", "boi_token_index", "eoi_token_index",
                                                  "image_token_index", "boi_token_id", "eoi_token_id",
                                                  "image_token_id"};

// Keys that change nothing at inference: the checkpoint's bookkeeping, training-only settings
// (dropout, initialisation, tensor-parallel slicing that sums to the same products), what the
// tokenizer files say again (token ids, read below) and output flags.
constexpr std::string_view kInformational[] = {
    "_name_or_path", "architectures", "model_type", "torch_dtype", "dtype", "transformers_version",
    "use_cache", "pad_token_id", "initializer_range", "attention_dropout", "embd_pdrop", "resid_pdrop",
    "auto_map", "output_attentions", "output_hidden_states", "return_dict", "pretraining_tp",
    "tokenizer_class", "bos_token_id", "eos_token_id", "_attn_implementation_autoset", "max_window_layers",
    "output_router_logits", "router_aux_loss_coef", "cache_implementation"};

// Every rope parameter a scaling type reads; any other in rope_scaling / rope_parameters is refused.
constexpr std::string_view kRopeCommon[] = {"rope_type", "type", "rope_theta", "partial_rotary_factor"};

class Keys {
 public:
  Keys(const Json& j, const std::string& path) : j_(j), path_(path) {}

  // The value, or null when absent or JSON null; the key counts as read either way.
  const Json* get(const std::string& key) {
    read_.insert(key);
    const auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }

  // The key is there with the value null (where that differs from absent: a default).
  bool null(const std::string& key) const {
    const auto it = j_.find(key);
    return it != j_.end() && it->is_null();
  }

  int64_t integer(const std::string& key, std::optional<int64_t> fallback, int64_t max_value) {
    const Json* v = get(key);
    if (!v) {
      if (!fallback) throw Error(path_ + ": missing " + key);
      return *fallback;
    }
    if (!v->is_number_integer()) throw Error(path_ + ": " + key + " = " + shown(*v) + " is not an integer");
    const int64_t x = v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)
                          ? INT64_MAX
                          : v->get<int64_t>();
    if (x <= 0 || x > max_value)
      throw Error(path_ + ": " + key + " = " + std::to_string(x) + " is out of range (1 to " +
                  std::to_string(max_value) + ")");
    return x;
  }

  double number(const std::string& key, std::optional<double> fallback) {
    const Json* v = get(key);
    if (!v) {
      if (!fallback) throw Error(path_ + ": missing " + key);
      return *fallback;
    }
    return finite_number(*v, key);
  }

  double finite_number(const Json& v, const std::string& key) const {
    if (!v.is_number()) throw Error(path_ + ": " + key + " = " + shown(v) + " is not a number");
    const double x = v.get<double>();
    if (!std::isfinite(x)) throw Error(path_ + ": " + key + " is not finite");
    return x;
  }

  std::optional<bool> boolean(const std::string& key) {
    const Json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) throw Error(path_ + ": " + key + " = " + shown(*v) + " is not true or false");
    return v->get<bool>();
  }

  std::optional<std::string> string(const std::string& key) {
    const Json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_string()) throw Error(path_ + ": " + key + " = " + shown(*v) + " is not a string");
    return v->get<std::string>();
  }

  // A key whose only value fathom implements is `neutral` (or absent / null).
  void neutral_only(const std::string& key, const Json& neutral, const std::string& what) {
    const Json* v = get(key);
    if (v && *v != neutral)
      throw Error(path_ + ": " + key + " = " + shown(*v) + " is not supported (" + what + ")");
  }

  void check_all_read(const std::string& arch) const {
    for (const auto& [key, value] : j_.items()) {
      if (read_.contains(key)) continue;
      if (std::find(std::begin(kInformational), std::end(kInformational), key) != std::end(kInformational)) continue;
      throw Error(path_ + ": key " + shown(key) + " is not one fathom's " + arch +
                  " reads: a setting it does not implement, refused rather than ignored");
    }
  }

 private:
  const Json& j_;
  const std::string& path_;
  std::set<std::string, std::less<>> read_;
};

GgufValue u32(int64_t v) { return GgufValue{std::in_place_type<uint32_t>, static_cast<uint32_t>(v)}; }
GgufValue f32(double v) { return GgufValue{std::in_place_type<float>, static_cast<float>(v)}; }
GgufValue str(std::string s) { return GgufValue{std::in_place_type<std::string>, std::move(s)}; }

const ArchName& find_arch(Keys& k, const std::string& path) {
  const Json* classes = k.get("architectures");
  const std::optional<std::string> type = k.string("model_type");
  std::optional<std::string> cls;
  if (classes) {
    if (!classes->is_array() || classes->size() != 1 || !(*classes)[0].is_string())
      throw Error(path + ": architectures = " + shown(*classes) + " is not a list of one class name");
    cls = (*classes)[0].get<std::string>();
  }
  if (!cls && !type) throw Error(path + ": neither architectures nor model_type names the model");
  for (const ArchName& a : kArchs) {
    if ((cls && *cls != a.hf_class) || (type && *type != a.model_type)) continue;
    return a;
  }
  throw Error(path + ": unsupported architecture " + shown(cls.value_or(type.value_or(""))) +
              (type ? " (model_type " + shown(*type) + ")" : "") +
              " (fathom loads from a Hugging Face directory: LlamaForCausalLM, MistralForCausalLM, "
              "MixtralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM, Phi3ForCausalLM, "
              "Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3ForConditionalGeneration, GptOssForCausalLM)");
  return kArchs[0];  // unreachable
}

std::vector<float> factor_list(const Json& rope, const char* key, int32_t rope_dim, const std::string& path) {
  const auto it = rope.find(key);
  if (it == rope.end() || !it->is_array() || it->size() != static_cast<size_t>(rope_dim / 2))
    throw Error(path + ": longrope needs " + key + ": a list of rope_dim / 2 = " + std::to_string(rope_dim / 2) +
                " factors");
  std::vector<float> v;
  for (const Json& x : *it) {
    if (!x.is_number() || !(x.get<double>() > 0) || !std::isfinite(x.get<double>()))
      throw Error(path + ": " + key + " holds " + shown(x) + ", not a positive factor");
    v.push_back(static_cast<float>(x.get<double>()));
  }
  return v;
}

// rope_scaling (transformers 4) and rope_parameters (transformers 5) as one object.
Json rope_parameters(Keys& k, const std::string& path) {
  Json rope = Json::object();
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    const Json* v = k.get(key);
    if (!v) continue;
    if (!v->is_object()) throw Error(path + ": " + key + " = " + shown(*v) + " is not an object");
    for (const auto& [name, value] : v->items()) rope[name] = value;
  }
  return rope;
}

// gpt-oss's: transformers' GptOssConfig gives a config without any its released YaRN (factor 32
// over 4096 positions, untruncated).
Json gpt_oss_rope(Keys& k, const std::string& path) {
  Json rope = rope_parameters(k, path);
  if (rope.empty())
    rope = Json{{"rope_type", "yarn"}, {"factor", 32.0}, {"beta_fast", 32.0}, {"beta_slow", 1.0},
                {"truncate", false}, {"original_max_position_embeddings", 4096}};
  return rope;
}

// The RoPE of the checkpoint as <arch>.rope.* keys (and longrope's factor tensors).
// `default_theta`: the base when neither rope_theta nor the parameters give one (transformers'
// default_theta of the config class).
void translate_rope(Keys& k, const Json& rope, const std::string& path, HfConfig& out, int32_t head_dim,
                    int64_t context, double default_theta = 10000.0) {
  const std::string a = out.arch + ".";
  auto param = [&](const char* key) -> const Json* {
    const auto it = rope.find(key);
    return it == rope.end() || it->is_null() ? nullptr : &*it;
  };
  auto param_number = [&](const char* key, std::optional<double> fallback) {
    const Json* v = param(key);
    if (!v) {
      if (!fallback) throw Error(path + ": rope scaling needs " + key);
      return *fallback;
    }
    const double x = k.finite_number(*v, key);
    if (!(x > 0)) throw Error(path + ": rope parameter " + std::string(key) + " must be positive");
    return x;
  };
  // transformers 5 keeps rope_theta and partial_rotary_factor in rope_parameters, 4 at the top.
  auto top_or_param = [&](const char* key, double fallback) {
    const Json* top = k.get(key);
    if (param(key)) return param_number(key, std::nullopt);
    if (!top) return fallback;
    return k.finite_number(*top, key);
  };
  const double theta = top_or_param("rope_theta", default_theta);
  if (!(theta > 1)) throw Error(path + ": rope_theta must exceed 1");
  const double prf = top_or_param("partial_rotary_factor", 1.0);
  if (!(prf > 0 && prf <= 1)) throw Error(path + ": partial_rotary_factor must be in (0, 1]");
  const int32_t rope_dim = static_cast<int32_t>(head_dim * prf);
  if (rope_dim < 2 || rope_dim % 2 != 0)
    throw Error(path + ": head_dim × partial_rotary_factor = " + std::to_string(rope_dim) + " is not an even width");
  const Json* orig_top = k.get("original_max_position_embeddings");  // phi3 keeps it at the top
  out.metadata[a + "rope.freq_base"] = f32(theta);
  out.metadata[a + "rope.dimension_count"] = u32(rope_dim);

  std::string type = "default";
  for (const char* key : {"rope_type", "type"})
    if (const Json* v = param(key)) {
      if (!v->is_string()) throw Error(path + ": rope " + key + " = " + shown(*v) + " is not a string");
      type = v->get<std::string>();
    }
  std::vector<std::string_view> allowed(std::begin(kRopeCommon), std::end(kRopeCommon));
  auto original = [&]() -> double {
    if (const Json* v = param("original_max_position_embeddings")) return k.finite_number(*v, "original_max_position_embeddings");
    if (orig_top) return k.finite_number(*orig_top, "original_max_position_embeddings");
    throw Error(path + ": rope scaling " + type + " needs original_max_position_embeddings");
  };
  const std::string s = a + "rope.scaling.";
  if (type == "default") {
    // plain RoPE
  } else if (type == "linear") {
    allowed.insert(allowed.end(), {"factor"});
    out.metadata[s + "type"] = str("linear");
    out.metadata[s + "factor"] = f32(param_number("factor", std::nullopt));
  } else if (type == "llama3") {
    allowed.insert(allowed.end(), {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"});
    out.metadata[s + "type"] = str("llama3");
    out.metadata[s + "factor"] = f32(param_number("factor", std::nullopt));
    out.metadata[s + "low_freq_factor"] = f32(param_number("low_freq_factor", std::nullopt));
    out.metadata[s + "high_freq_factor"] = f32(param_number("high_freq_factor", std::nullopt));
    out.metadata[s + "original_context_length"] = u32(static_cast<int64_t>(original()));
  } else if (type == "yarn") {
    allowed.insert(allowed.end(), {"factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "truncate",
                                   "attention_factor", "mscale", "mscale_all_dim"});
    // fathom's YaRN is transformers' with its attention factor 0.1 ln(factor) + 1 and a truncated ramp.
    for (const char* key : {"attention_factor", "mscale", "mscale_all_dim"})
      if (param(key)) throw Error(path + ": rope parameter " + std::string(key) + " (YaRN) is not supported");
    // gpt-oss was trained with the ramp untruncated (fathom's gpt-oss always rotates so, as
    // llama.cpp's does): its checkpoints say truncate false; transformers' default is true.
    const Json truncate = param("truncate") ? *param("truncate") : Json(true);
    if (truncate != Json(out.arch != "gpt-oss"))
      throw Error(path + ": rope parameter truncate = " + shown(truncate) + " (YaRN) is not supported by fathom's " +
                  out.arch + (out.arch == "gpt-oss" ? " (its YaRN ramp is untruncated: truncate false)" : ""));
    out.metadata[s + "type"] = str("yarn");
    out.metadata[s + "factor"] = f32(param_number("factor", std::nullopt));
    out.metadata[s + "original_context_length"] = u32(static_cast<int64_t>(original()));
    out.metadata[s + "yarn_beta_fast"] = f32(param_number("beta_fast", 32.0));
    out.metadata[s + "yarn_beta_slow"] = f32(param_number("beta_slow", 1.0));
  } else if (type == "longrope") {
    allowed.insert(allowed.end(), {"long_factor", "short_factor", "original_max_position_embeddings", "factor",
                                   "attention_factor"});
    const double orig = original();
    if (!(orig > 1)) throw Error(path + ": original_max_position_embeddings must exceed 1");
    // transformers: the attention factor given, else sqrt(1 + ln(factor) / ln(original)) with factor
    // given or max_position_embeddings / original, 1 when factor <= 1.
    double attn = 1.0;
    if (param("attention_factor")) {
      attn = param_number("attention_factor", std::nullopt);
    } else {
      const double factor = param("factor") ? param_number("factor", std::nullopt) : static_cast<double>(context) / orig;
      if (factor > 1) attn = std::sqrt(1 + std::log(factor) / std::log(orig));
    }
    out.metadata[s + "type"] = str("longrope");
    out.metadata[s + "attn_factor"] = f32(attn);
    out.metadata[s + "original_context_length"] = u32(static_cast<int64_t>(orig));
    out.extra_tensors["rope_factors_long.weight"] = factor_list(rope, "long_factor", rope_dim, path);
    out.extra_tensors["rope_factors_short.weight"] = factor_list(rope, "short_factor", rope_dim, path);
  } else {
    throw Error(path + ": unsupported rope scaling type " + shown(type) +
                " (supported: default, linear, llama3, yarn, longrope)");
  }
  for (const auto& [name, value] : rope.items())
    if (std::find(allowed.begin(), allowed.end(), name) == allowed.end() && !value.is_null())
      throw Error(path + ": rope parameter " + shown(name) + " is not supported with rope type " + shown(type));
  // phi3's GGUF carries its original context whatever the scaling (llama.cpp's converter writes it).
  if (out.arch == "phi3" && !out.metadata.contains(s + "original_context_length"))
    out.metadata[s + "original_context_length"] =
        u32(orig_top ? static_cast<int64_t>(k.finite_number(*orig_top, "original_max_position_embeddings")) : context);
}

// Gemma 3's RoPE: the global layers' (transformers 4: rope_theta, default 1e6, and rope_scaling;
// transformers 5: rope_parameters.full_attention) become the <arch>.rope.* keys as any
// architecture's; the sliding layers' (rope_local_base_freq, rope_parameters.sliding_attention)
// must be plain RoPE of base 10000, which llama.cpp and fathom fix (model_config.h).
void translate_gemma3_rope(Keys& k, const std::string& path, HfConfig& out, int32_t head_dim, int64_t context) {
  Json global = Json::object(), local = Json::object();
  if (const Json* params = k.get("rope_parameters")) {
    if (!params->is_object()) throw Error(path + ": rope_parameters = " + shown(*params) + " is not an object");
    for (const auto& [name, value] : params->items()) {
      // transformers reads only the per-layer-type entries of a Gemma 3's rope_parameters.
      Json* into = name == "full_attention" ? &global : name == "sliding_attention" ? &local : nullptr;
      if (!into)
        throw Error(path + ": rope_parameters key " + shown(name) +
                    " is not one fathom's gemma3 reads (its RoPE is per layer type: full_attention, "
                    "sliding_attention)");
      if (!value.is_object())
        throw Error(path + ": rope_parameters." + name + " = " + shown(value) + " is not an object");
      *into = value;
    }
  }
  if (const Json* scaling = k.get("rope_scaling")) {  // transformers 4: the global layers' scaling
    if (!scaling->is_object()) throw Error(path + ": rope_scaling = " + shown(*scaling) + " is not an object");
    for (const auto& [name, value] : scaling->items()) global[name] = value;
  }
  translate_rope(k, global, path, out, head_dim, context, 1e6);

  double base = gemma::kGemma3LocalRopeBase;
  if (const Json* top = k.get("rope_local_base_freq")) base = k.finite_number(*top, "rope_local_base_freq");
  for (const auto& [name, value] : local.items()) {
    if (value.is_null()) continue;
    if (name == "rope_theta")
      base = k.finite_number(value, "rope_parameters.sliding_attention.rope_theta");
    else if (name != "rope_type" && name != "type")
      throw Error(path + ": rope_parameters.sliding_attention." + name +
                  " is not supported by fathom's gemma3 (its sliding layers rotate by plain RoPE)");
    else if (value != Json("default"))
      throw Error(path + ": rope_parameters.sliding_attention." + name + " = " + shown(value) +
                  " is not supported by fathom's gemma3 (its sliding layers rotate by plain RoPE)");
  }
  if (base != gemma::kGemma3LocalRopeBase)
    throw Error(path + ": the sliding layers' RoPE base " + shown(Json(base)) +
                " (rope_local_base_freq) is not supported by fathom's gemma3, which rotates them with base 10000 "
                "as llama.cpp does");
}

// The window of the sliding layers (`sliding_window`, `default_window` when absent; null, no window,
// is refused) and which layers slide: layer_types when given (num_hidden_layers entries,
// sliding_attention or full_attention), else `implied` (what the config's other keys say; `implied_by`
// names them). A layer that slides where fathom's `fixed` layout (`layout`, as llama.cpp lays the
// layers out: no GGUF key says it) does not, or the reverse, is refused by name.
void translate_sliding_layers(Keys& k, const std::string& path, HfConfig& out, int64_t layers, int64_t default_window,
                              const std::function<bool(int64_t)>& implied, const std::string& implied_by,
                              const std::function<bool(int64_t)>& fixed, const char* layout) {
  if (k.null("sliding_window"))
    throw Error(path + ": sliding_window = null is not supported by fathom's " + out.arch +
                " (its sliding layers have a window)");
  out.metadata[out.arch + ".attention.sliding_window"] = u32(k.integer("sliding_window", default_window, 1 << 24));
  const Json* types = k.get("layer_types");
  if (types && (!types->is_array() || static_cast<int64_t>(types->size()) != layers))
    throw Error(path + ": layer_types is not a list of num_hidden_layers entries");
  for (int64_t il = 0; il < layers; ++il) {
    bool slides = implied(il);
    if (types) {
      const Json& t = (*types)[il];
      if (t != Json("sliding_attention") && t != Json("full_attention"))
        throw Error(path + ": layer_types entry " + shown(t) + " is not supported by fathom's " + out.arch +
                    " (sliding_attention, full_attention)");
      slides = t == Json("sliding_attention");
    }
    if (slides != fixed(il))
      throw Error(path + ": " + (types ? std::string("layer_types") : implied_by) + " makes layer " +
                  std::to_string(il) + (slides ? " sliding" : " global") + ", which fathom's " + out.arch +
                  " does not: " + layout + ", as llama.cpp lays them out");
  }
}

// Gemma 2 and 3 (transformers' Gemma2Config and Gemma3TextConfig; llama.cpp's Gemma2Model and
// Gemma3Model converters). What llama.cpp fixes where no GGUF key says it (which layers slide, the
// sliding layers' RoPE, the attention scale) config.json must say too, and any other value is
// refused by name; a key config.json leaves out has transformers' default.
void translate_gemma(Keys& k, const std::string& path, HfConfig& out, int64_t dim, int64_t heads, int64_t head_dim,
                     int64_t layers) {
  const bool gemma2 = out.arch == "gemma2";
  const Architecture arch = gemma2 ? Architecture::kGemma2 : Architecture::kGemma3;
  const std::string a = out.arch + ".";
  // transformers' Gemma RMSNorm multiplies by 1 + w and the checkpoint holds w; llama.cpp's
  // converter writes 1 + w. The weights loader adds the 1 as it reads the norms (vectors, converted
  // to f32 at load anyway): the matrices stay views into the shards.
  out.metadata["fathom.norm_offset"] = f32(1.0);
  k.neutral_only("hidden_activation", "gelu_pytorch_tanh", "fathom's Gemma MLP is GeGLU with the tanh GELU");
  // Gemma 2's released configs also carry hidden_act, which transformers' Gemma 2 and 3 never read
  // (their MLP reads hidden_activation): not read here either.
  k.get("hidden_act");
  k.neutral_only("use_bidirectional_attention", false, "bidirectional attention: fathom's is causal");

  const int64_t want = gemma::query_pre_attn_scalar(arch, static_cast<int32_t>(layers), static_cast<int32_t>(dim),
                                                    static_cast<int32_t>(heads), static_cast<int32_t>(head_dim));
  if (const double scalar = k.number("query_pre_attn_scalar", 256.0); scalar != static_cast<double>(want))
    throw Error(path + ": query_pre_attn_scalar = " + shown(Json(scalar)) + " is not supported by fathom's " +
                out.arch + ", which scales attention logits by " + std::to_string(want) +
                "^-1/2 for this shape (head_dim; hidden_size / num_attention_heads for the 27B's layer count), "
                "as llama.cpp does");

  // Soft-capping: Gemma 2 caps (50 and 30 by default; null would be none, which fathom's gemma2
  // does not do), Gemma 3 does not (fathom's gemma3 has no caps).
  for (const auto& [key, fallback] : {std::pair{"attn_logit_softcapping", 50.0}, {"final_logit_softcapping", 30.0}}) {
    if (!gemma2) {
      k.neutral_only(key, Json(), "soft-capping");
      continue;
    }
    if (k.null(key))
      throw Error(path + ": " + key + " = null (no soft-capping) is not supported by fathom's gemma2, which caps");
    const double cap = k.number(key, fallback);
    if (!(cap > 0)) throw Error(path + ": " + key + " must be positive");
    out.metadata[a + key] = f32(cap);
  }

  // Without layer_types, every other layer slides (Gemma 2) or every sliding_window_pattern-th is
  // global (Gemma 3, default 6; the _sliding_window_pattern transformers >= 4.55 writes beside
  // layer_types, it never reads back).
  int64_t pattern = gemma::kGemma2SlidingPattern;
  if (!gemma2) {
    k.get("_sliding_window_pattern");
    pattern = k.integer("sliding_window_pattern", gemma::kGemma3SlidingPattern, 1 << 20);
  }
  translate_sliding_layers(
      k, path, out, layers, 4096, [&](int64_t il) { return (il + 1) % pattern != 0; },
      "sliding_window_pattern = " + std::to_string(pattern),
      [&](int64_t il) { return gemma::layer_slides(arch, static_cast<int32_t>(il)); },
      gemma2 ? "every other layer slides, the first one" : "5 sliding layers to 1 global");
  if (!out.tie_word_embeddings) out.tie_word_embeddings = true;  // transformers' default for both
}

// gpt-oss (transformers' GptOssConfig; llama.cpp's GptOssModel converter): the window of its
// sliding layers, which must be every other one from the first (fathom's gpt-oss, as llama.cpp
// lays it out), its clamped SwiGLU's constants, which fathom fixes, and the MXFP4 quantization the
// released checkpoints declare (the expert tensors' own dtypes say which are packed: hf_gpt_oss.h).
void translate_gpt_oss(Keys& k, const std::string& path, HfConfig& out, int64_t layers) {
  const std::string a = out.arch + ".";
  // The experts' width is intermediate_size (llama.cpp's converter writes it so).
  out.metadata[a + "expert_feed_forward_length"] = out.metadata.at(a + "feed_forward_length");
  // The released configs restate the router's top-k as experts_per_token, which transformers never reads.
  if (const Json* v = k.get("experts_per_token");
      v && *v != Json(std::get<uint32_t>(out.metadata.at(a + "expert_used_count"))))
    throw Error(path + ": experts_per_token = " + shown(*v) + " differs from num_experts_per_tok");
  k.get("initial_context_length");  // also the released configs'; YaRN's original context is the rope's
  // transformers' gpt-oss experts apply their own activation: hidden_act is never read.
  k.get("hidden_act");
  for (const auto& [key, fathoms] : {std::pair{"swiglu_alpha", gpt_oss::kSwigluAlpha}, {"swiglu_limit", gpt_oss::kSwigluLimit}})
    if (const double v = k.number(key, fathoms); v != static_cast<double>(fathoms))
      throw Error(path + ": " + key + " = " + shown(Json(v)) + " is not supported by fathom's gpt-oss, whose clamped "
                  "SwiGLU is fixed at swiglu_alpha 1.702, swiglu_limit 7 (as llama.cpp's)");
  translate_sliding_layers(k, path, out, layers, 128, gpt_oss::layer_slides, "", gpt_oss::layer_slides,
                           "every other layer slides, the first one");
  if (const Json* q = k.get("quantization_config")) {
    if (!q->is_object()) throw Error(path + ": quantization_config = " + shown(*q) + " is not an object");
    for (const auto& [name, value] : q->items()) {
      if (name == "quant_method" && value == Json("mxfp4")) continue;
      if (name == "modules_to_not_convert") continue;  // the tensors' dtypes say what is packed
      throw Error(path + ": quantization_config." + name + " = " + shown(value) +
                  " is not supported (fathom reads gpt-oss's MXFP4 experts: quant_method mxfp4)");
    }
  }
}

}  // namespace

// A mixture of experts' keys: the expert count (transformers 5's num_local_experts, 4's num_experts),
// the router's top-k and, for qwen3moe, the experts' width; what fathom's routing does not do is
// refused (Qwen3-MoE without top-k renormalisation, dense layers among the MoE ones).
void translate_experts(Keys& k, const std::string& arch, const std::string& path, HfConfig& out) {
  const std::string a = arch + ".";
  constexpr int64_t kMaxExperts = 1024;
  const int64_t experts = k.get("num_local_experts") ? k.integer("num_local_experts", std::nullopt, kMaxExperts)
                                                     : k.integer("num_experts", std::nullopt, kMaxExperts);
  out.metadata[a + "expert_count"] = u32(experts);
  out.metadata[a + "expert_used_count"] = u32(k.integer("num_experts_per_tok", std::nullopt, experts));
  k.number("router_jitter_noise", 0.0);  // training only
  if (arch != "qwen3moe") return;
  out.metadata[a + "expert_feed_forward_length"] = u32(k.integer("moe_intermediate_size", std::nullopt, 1 << 20));
  if (!k.boolean("norm_topk_prob").value_or(false))
    throw Error(path + ": norm_topk_prob false (top-k router weights not renormalised) is not supported by fathom's "
                "qwen3moe");
  k.neutral_only("decoder_sparse_step", 1, "experts on every layer only");
  k.neutral_only("mlp_only_layers", Json::array(), "dense MLP layers among the experts' ones");
}

namespace {

// A text model's config.json keys (`k`) of architecture `arch` -> the GGUF metadata; the caller
// checks that every key was read.
HfConfig translate_text_model(Keys& k, const ArchName& arch, const std::string& path) {
  HfConfig out;
  out.arch = arch.gguf;
  const std::string a = out.arch + ".";
  constexpr int64_t kMaxDim = 1 << 20, kMaxCount = 4096;
  out.metadata["general.architecture"] = str(out.arch);
  // Gemma 3's config.json may leave out what Gemma3TextConfig defaults; the others' must say it.
  using G3 = Gemma3TextDefaults;
  const bool gemma3 = out.arch == "gemma3";
  const auto dflt = [&](int64_t v) { return gemma3 ? std::optional<int64_t>(v) : std::nullopt; };
  const int64_t dim = k.integer("hidden_size", dflt(G3::hidden_size), kMaxDim);
  const int64_t heads = k.integer("num_attention_heads", dflt(G3::num_attention_heads), kMaxCount);
  const int64_t kv_heads = k.integer("num_key_value_heads", gemma3 ? G3::num_key_value_heads : heads, kMaxCount);
  const bool gemma = out.arch == "gemma2" || gemma3;
  const bool gpt_oss = out.arch == "gpt-oss";
  if (!k.get("head_dim") && !gemma && !gpt_oss && dim % heads != 0)
    throw Error(path + ": hidden_size " + std::to_string(dim) + " is not a multiple of num_attention_heads");
  const int64_t head_dim =
      k.integer("head_dim", gemma ? 256 : gpt_oss ? 64 : dim / heads, kMaxCount);  // transformers' defaults
  const int64_t context = k.integer("max_position_embeddings", dflt(G3::max_position_embeddings), 1 << 24);
  out.vocab_size = k.integer("vocab_size", dflt(G3::vocab_size), 1 << 21);  // the largest are ~262k
  const int64_t layers = k.integer("num_hidden_layers", dflt(G3::num_hidden_layers), kMaxCount);
  out.metadata[a + "block_count"] = u32(layers);
  out.metadata[a + "context_length"] = u32(context);
  out.metadata[a + "embedding_length"] = u32(dim);
  out.metadata[a + "feed_forward_length"] = u32(k.integer("intermediate_size", dflt(G3::intermediate_size), kMaxDim));
  out.metadata[a + "attention.head_count"] = u32(heads);
  out.metadata[a + "attention.head_count_kv"] = u32(kv_heads);
  out.metadata[a + "attention.key_length"] = u32(head_dim);
  out.metadata[a + "attention.value_length"] = u32(head_dim);
  out.metadata[a + "vocab_size"] = u32(out.vocab_size);
  const double eps = k.number("rms_norm_eps", gemma3 ? std::optional<double>(G3::rms_norm_eps) : std::nullopt);
  if (!(eps > 0 && eps < 1)) throw Error(path + ": rms_norm_eps must be in (0, 1)");
  out.metadata[a + "attention.layer_norm_rms_epsilon"] = f32(eps);
  if (out.arch == "gemma3")
    translate_gemma3_rope(k, path, out, static_cast<int32_t>(head_dim), context);
  else if (gpt_oss)
    translate_rope(k, gpt_oss_rope(k, path), path, out, static_cast<int32_t>(head_dim), context, 150000.0);
  else
    translate_rope(k, rope_parameters(k, path), path, out, static_cast<int32_t>(head_dim), context);
  if (arch.experts) translate_experts(k, out.arch, path, out);
  if (gpt_oss) translate_gpt_oss(k, path, out, layers);
  out.tie_word_embeddings = k.boolean("tie_word_embeddings");
  if (gemma) {
    translate_gemma(k, path, out, dim, heads, head_dim, layers);
  } else if (!gpt_oss) {  // gpt-oss's hidden_act is never read (translate_gpt_oss)
    if (const auto act = k.string("hidden_act"); act && *act != "silu")
      throw Error(path + ": hidden_act " + shown(*act) + " is not supported by fathom's " + out.arch + " (silu only)");
  }
  // Biases are read from the checkpoint's tensors (Q, K, V and o_proj's); one fathom lacks (the
  // MLP's) is refused by the weights loader, which names it.
  k.boolean("attention_bias");
  k.boolean("mlp_bias");
  k.neutral_only("lm_head_bias", false, "an output bias");
  k.neutral_only("full_attn_mod", 1, "Phi-4's alternating attention");
  k.neutral_only("interpolate_factor", 1, "position interpolation");

  // Sliding windows: phi3 and mistral apply `sliding_window` to every layer; Qwen 2/3 only with
  // use_sliding_window (and per layer_types), which fathom does not implement; llama has none; the
  // Gemmas' were read above.
  const Json* window = k.get("sliding_window");
  if (const Json* types = gemma || gpt_oss ? nullptr : k.get("layer_types")) {
    if (!types->is_array()) throw Error(path + ": layer_types is not a list");
    for (const Json& t : *types)
      if (t != Json("full_attention"))
        throw Error(path + ": layer_types entry " + shown(t) + " is not supported by fathom's " + out.arch +
                    " (full_attention only)");
  }
  if (k.boolean("use_sliding_window").value_or(false))
    throw Error(path + ": use_sliding_window (sliding-window attention) is not supported by fathom's " + out.arch);
  const bool mistral = std::string_view(arch.model_type) == "mistral" || std::string_view(arch.model_type) == "mixtral";
  if (out.arch == "phi3" || (mistral && window)) {
    int64_t w = 0;
    if (window) {
      if (!window->is_number_integer() || window->get<int64_t>() < 0 || window->get<int64_t>() > (1 << 24))
        throw Error(path + ": sliding_window = " + shown(*window) + " is out of range");
      w = window->get<int64_t>();
    }
    out.metadata[a + "attention.sliding_window"] = u32(w);
  } else if (window && out.arch == "llama") {
    throw Error(path + ": sliding_window = " + shown(*window) + " (sliding-window attention) is not supported by "
                "fathom's llama (Mistral's and Mixtral's, on every layer, are)");
  }
  // llama.cpp's converter permutes llama's Q and K rows for adjacent-pair rotation; the checkpoint's
  // rows are rotate-half (NEOX), which fathom rotates as they are (no copy of the weights).
  if (out.arch == "llama") out.metadata["fathom.rope_neox"] = GgufValue{std::in_place_type<bool>, true};

  out.eos_ids = hf::token_ids(k.get("eos_token_id"), path, "eos_token_id");
  const std::vector<int64_t> bos = hf::token_ids(k.get("bos_token_id"), path, "bos_token_id");
  if (!bos.empty()) out.bos_id = bos[0];
  return out;
}

// Gemma3ForConditionalGeneration (transformers' Gemma3Config): the text model's Gemma3TextConfig
// nested as text_config (absent: all its defaults, as transformers), a SigLIP vision_config and the
// keys joining image embeddings into the text. fathom serves the text model, text in and text out:
// text_config is read as a gemma3_text config.json is, every key of it read or refused by name; the
// vision keys are knowingly unused; any other top-level key is refused by name.
HfConfig translate_gemma3_multimodal(Keys& k, const std::string& path) {
  if (const Json* v = k.get("vision_config"); v && !v->is_object())
    throw Error(path + ": vision_config = " + shown(*v) + " is not an object");
  for (std::string_view key : kGemma3VisionKeys) k.get(std::string(key));
  const Json* text = k.get("text_config");
  if (text && !text->is_object()) throw Error(path + ": text_config = " + shown(*text) + " is not an object");
  static const Json kEmpty = Json::object();
  const Json& tj = text ? *text : kEmpty;
  const std::string text_path = path + ": text_config";
  Keys t(tj, text_path);
  if (const auto type = t.string("model_type"); type && *type != kGemma3Text.model_type)
    throw Error(text_path + ": model_type " + shown(*type) + " is not gemma3_text (Gemma 3's text model)");
  HfConfig out = translate_text_model(t, kGemma3Text, text_path);
  t.check_all_read(out.arch);
  out.multimodal = true;

  // Tied unless said otherwise: transformers 5 reads the top level's tie_word_embeddings
  // (Gemma3Config's, default true), 4 the text config's (get_text_config()): they must agree.
  const std::optional<bool> top_tie = k.boolean("tie_word_embeddings");
  const auto it = tj.find("tie_word_embeddings");
  const std::optional<bool> text_tie =
      it == tj.end() || it->is_null() ? std::nullopt : std::optional<bool>(it->get<bool>());  // checked above
  if (top_tie && text_tie && *top_tie != *text_tie)
    throw Error(path + ": tie_word_embeddings = " + shown(Json(*top_tie)) + " and text_config.tie_word_embeddings = " +
                shown(Json(*text_tie)) + " disagree (transformers 5 reads the first, 4 the second)");
  out.tie_word_embeddings = top_tie.value_or(text_tie.value_or(true));
  // The released configs give the token ids at the top (eos_token_id [1, 106]); text_config's
  // (read above) where the top gives none, as transformers' generation config takes them.
  if (std::vector<int64_t> eos = hf::token_ids(k.get("eos_token_id"), path, "eos_token_id"); !eos.empty())
    out.eos_ids = std::move(eos);
  if (const std::vector<int64_t> bos = hf::token_ids(k.get("bos_token_id"), path, "bos_token_id"); !bos.empty())
    out.bos_id = bos[0];
  k.check_all_read("Gemma3ForConditionalGeneration");
  return out;
}

}  // namespace

HfConfig hf_config_from_json(std::string_view text, const std::string& path) {
  const Json j = hf::parse_json(text, path, 8);
  if (!j.is_object()) throw Error(path + ": not a JSON object");
  Keys k(j, path);
  const ArchName& arch = find_arch(k, path);
  if (arch.vision) return translate_gemma3_multimodal(k, path);
  HfConfig out = translate_text_model(k, arch, path);
  k.check_all_read(out.arch);
  return out;
}

}  // namespace fathom
