#include "engine/model/rope_scaling.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <optional>

#include "base/error.h"
#include "engine/model/gguf.h"
#include "engine/model/model_config.h"
#include "kernels/ref/dequant.h"

namespace fathom {
namespace {

constexpr const char* kFreqsTensor = "rope_freqs.weight";
constexpr const char* kLongTensor = "rope_factors_long.weight";
constexpr const char* kShortTensor = "rope_factors_short.weight";

// Every <arch>.rope.scaling.* key read below. `finetuned` (whether the model was trained at the
// extended length) is informational: it changes nothing at inference.
constexpr std::string_view kKeys[] = {"type", "factor", "original_context_length", "low_freq_factor",
                                      "high_freq_factor", "yarn_beta_fast", "yarn_beta_slow", "attn_factor",
                                      "yarn_attn_factor", "yarn_ext_factor", "yarn_log_multiplier", "alpha",
                                      "finetuned"};

class Keys {
 public:
  Keys(const GgufFile& f, const std::string& arch) : f_(f), prefix_(arch + ".rope.scaling.") {}

  std::string name(const char* key) const { return prefix_ + key; }
  std::optional<double> get(const char* key) const { return f_.get_float(name(key)); }

  double positive(const char* key, std::optional<double> fallback = std::nullopt) const {
    const std::optional<double> v = get(key);
    if (!v && !fallback) throw Error(f_.path() + ": rope scaling needs metadata " + name(key));
    const double x = v.value_or(fallback.value_or(0));
    if (!(x > 0) || !std::isfinite(x))
      throw Error(f_.path() + ": metadata " + name(key) + " = " + std::to_string(x) + " must be positive");
    return x;
  }

  // A key whose only value fathom implements is the neutral one: anything else is refused.
  void neutral_only(const char* key, bool (*is_neutral)(double), const std::string& why) const {
    if (const std::optional<double> v = get(key); v && !is_neutral(*v))
      throw Error(f_.path() + ": metadata " + name(key) + " = " + std::to_string(*v) + " is not supported (" + why +
                  ")");
  }

 private:
  const GgufFile& f_;
  std::string prefix_;
};

std::vector<float> read_freq_factors(const GgufFile& f, const GgufTensorInfo& t, int32_t rope_dim) {
  const GgmlTypeInfo* info = ggml_type_info(static_cast<uint32_t>(t.type));
  if (!info || !info->kernels_read)
    throw Error(f.path() + ": tensor '" + t.name + "' has type " + ggml_type_name(t.type) +
                ", which fathom does not read");
  if (t.elements() != rope_dim / 2)
    throw Error(f.path() + ": tensor '" + t.name + "' has " + std::to_string(t.elements()) +
                " elements, expected rope_dim / 2 = " + std::to_string(rope_dim / 2));
  std::vector<float> v(rope_dim / 2);
  ref::dequantize_row(t.type, t.data, v.data(), static_cast<int64_t>(v.size()));
  for (const float x : v)
    if (!(x > 0) || !std::isfinite(x))
      throw Error(f.path() + ": tensor '" + t.name + "' holds " + std::to_string(x) + ", not a positive factor");
  return v;
}

}  // namespace

const char* rope_scaling_name(RopeScalingType t) {
  switch (t) {
    case RopeScalingType::kNone: return "none";
    case RopeScalingType::kLinear: return "linear";
    case RopeScalingType::kLlama3: return "llama3";
    case RopeScalingType::kYarn: return "yarn";
    case RopeScalingType::kLongrope: return "longrope";
  }
  return "?";
}

bool is_rope_scaling_key(std::string_view suffix) {
  return std::find(std::begin(kKeys), std::end(kKeys), suffix) != std::end(kKeys);
}

RopeScaling rope_scaling_from_gguf(const GgufFile& f, const std::string& arch, int32_t rope_dim,
                                   int64_t context_length) {
  const Keys k(f, arch);
  RopeScaling s;
  const GgufTensorInfo* freqs = f.find_tensor(kFreqsTensor);
  const GgufTensorInfo* long_factors = f.find_tensor(kLongTensor);
  const GgufTensorInfo* short_factors = f.find_tensor(kShortTensor);
  // llama.cpp reads a file without a type as linear (a factor of 1 when absent), and its converter
  // marks Llama 3.1-style scaling by the rope_freqs tensor alone, Phi-3's longrope by its two
  // factor tensors alone.
  const std::optional<std::string> type_key = f.get_string(k.name("type"));
  std::string type = type_key.value_or(k.get("factor").value_or(1.0) != 1.0 ? "linear" : "none");
  if (!type_key && freqs && type == "none") type = "llama3";
  if (!type_key && (long_factors || short_factors) && type == "none") type = "longrope";
  const std::string only_yarn_and_longrope = "only YaRN and longrope scale cos and sin";

  if (type == "none") {
    // nothing to read
  } else if (type == "linear") {
    s.type = RopeScalingType::kLinear;
    s.factor = k.positive("factor");
  } else if (type == "llama3") {
    s.type = RopeScalingType::kLlama3;
    if (freqs) {
      s.freq_factors = read_freq_factors(f, *freqs, rope_dim);
      s.tensors.push_back(kFreqsTensor);
    } else {
      s.factor = k.positive("factor");
      s.original_context = k.positive("original_context_length");
      s.low_freq_factor = k.positive("low_freq_factor", 1.0);  // Llama 3.1's values
      s.high_freq_factor = k.positive("high_freq_factor", 4.0);
      if (!(s.high_freq_factor > s.low_freq_factor))
        throw Error(f.path() + ": " + k.name("high_freq_factor") + " must exceed " + k.name("low_freq_factor"));
    }
  } else if (type == "yarn") {
    s.type = RopeScalingType::kYarn;
    s.factor = k.positive("factor");
    s.original_context = k.positive("original_context_length");
    s.beta_fast = k.positive("yarn_beta_fast", 32.0);
    s.beta_slow = k.positive("yarn_beta_slow", 1.0);
    // llama.cpp's extra YaRN knobs (an attention factor on top of, or instead of, 0.1 ln(factor) + 1;
    // DeepSeek's log multiplier; a partial extrapolation mix) mean other formulas: refused unless neutral.
    const std::string hf_yarn = "fathom's YaRN is Hugging Face's: attention factor 0.1 ln(factor) + 1";
    k.neutral_only("attn_factor", [](double v) { return v == 1.0; }, hf_yarn);
    k.neutral_only("yarn_attn_factor", [](double v) { return v == 1.0; }, hf_yarn);
    k.neutral_only("yarn_ext_factor", [](double v) { return v < 0 || v == 1.0; }, hf_yarn);
    k.neutral_only("yarn_log_multiplier", [](double v) { return v == 0.0; }, hf_yarn);
  } else if (type == "longrope") {
    // Phi-3.5 / Phi-4 (transformers' longrope): each frequency divided by its long or short factor,
    // cos and sin scaled by attn_factor. transformers switches to the long factors once a sequence
    // outgrows the original context; llama.cpp (and fathom, whose rotation is fixed at load) chooses
    // by the context the model serves: identical for every sequence when the context exceeds the
    // original, as it does for the models that carry these factors.
    s.type = RopeScalingType::kLongrope;
    if (!long_factors || !short_factors)
      throw Error(f.path() + ": longrope scaling needs the tensors '" + kLongTensor + "' and '" + kShortTensor + "'");
    s.original_context = k.positive("original_context_length");
    s.long_factors = static_cast<double>(context_length) > s.original_context;
    const std::vector<float> long_v = read_freq_factors(f, *long_factors, rope_dim);
    const std::vector<float> short_v = read_freq_factors(f, *short_factors, rope_dim);
    s.freq_factors = s.long_factors ? long_v : short_v;
    s.tensors = {kLongTensor, kShortTensor};
    s.attn_factor = k.positive("attn_factor", 1.0);
    // llama.cpp would scale positions by 1 / factor on top: transformers' longrope reads factor only
    // for the attention factor, which the file gives as attn_factor.
    k.neutral_only("factor", [](double v) { return v == 1.0; }, "longrope divides by its factor tensors only");
  } else {
    throw Error(f.path() + ": unsupported rope scaling type '" + type + "' in " + k.name("type") +
                " (supported: none, linear, llama3, yarn, longrope)");
  }
  if (s.type != RopeScalingType::kYarn && s.type != RopeScalingType::kLongrope)
    k.neutral_only("attn_factor", [](double v) { return v == 1.0; }, only_yarn_and_longrope);
  if (freqs && s.type != RopeScalingType::kLlama3)
    throw Error(f.path() + ": tensor '" + std::string(kFreqsTensor) + "' with rope scaling type '" + type +
                "' is not supported (only llama3 frequency factors)");
  for (const GgufTensorInfo* t : {long_factors, short_factors})
    if (t && s.type != RopeScalingType::kLongrope)
      throw Error(f.path() + ": tensor '" + t->name + "' with rope scaling type '" + type +
                  "' is not supported (only longrope's factors)");
  if (k.get("alpha"))
    throw Error(f.path() + ": metadata " + k.name("alpha") + " (NTK-aware alpha scaling) is not supported");
  return s;
}

std::vector<double> rope_inv_freq(double base, int32_t rope_dim, const RopeScaling& s) {
  const int32_t half = rope_dim / 2;
  std::vector<double> inv(half);
  for (int32_t i = 0; i < half; ++i) inv[i] = std::pow(base, -2.0 * i / rope_dim);
  constexpr double kTwoPi = 2 * std::numbers::pi;
  switch (s.type) {
    case RopeScalingType::kNone:
      break;
    case RopeScalingType::kLinear:
      for (double& f : inv) f /= s.factor;
      break;
    case RopeScalingType::kLongrope:
      FATHOM_CHECK(!s.freq_factors.empty(), "longrope without its factors");
      [[fallthrough]];
    case RopeScalingType::kLlama3:
      if (!s.freq_factors.empty()) {
        FATHOM_CHECK(static_cast<int32_t>(s.freq_factors.size()) == half);
        for (int32_t i = 0; i < half; ++i) inv[i] /= s.freq_factors[i];
        break;
      }
      // Wavelengths shorter than original / high_freq_factor are kept, longer than original /
      // low_freq_factor divided by factor; between, a blend linear in original / wavelength.
      for (double& f : inv) {
        const double wavelen = kTwoPi / f;
        if (wavelen > s.original_context / s.low_freq_factor) {
          f /= s.factor;
        } else if (wavelen >= s.original_context / s.high_freq_factor) {
          const double smooth = (s.original_context / wavelen - s.low_freq_factor) /
                                (s.high_freq_factor - s.low_freq_factor);
          f = (1 - smooth) * f / s.factor + smooth * f;
        }
      }
      break;
    case RopeScalingType::kYarn: {
      // The pair index at which a frequency completes `rotations` turns over the original context.
      auto correction_dim = [&](double rotations) {
        return rope_dim * std::log(s.original_context / (rotations * kTwoPi)) / (2 * std::log(base));
      };
      const double lo = correction_dim(s.beta_fast), hi = correction_dim(s.beta_slow);
      const double low = std::max(s.yarn_truncate ? std::floor(lo) : lo, 0.0);
      double high = std::min(s.yarn_truncate ? std::ceil(hi) : hi, rope_dim - 1.0);
      if (low == high) high += 0.001;
      for (int32_t i = 0; i < half; ++i) {
        // ramp 0 (pairs below low: fast, kept) .. 1 (above high: slow, interpolated by factor)
        const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
        inv[i] = inv[i] / s.factor * ramp + inv[i] * (1 - ramp);
      }
      break;
    }
  }
  return inv;
}

float rope_attention_factor(const RopeScaling& s) {
  if (s.type == RopeScalingType::kLongrope) return static_cast<float>(s.attn_factor);
  if (s.type != RopeScalingType::kYarn || s.factor <= 1) return 1.0f;
  return static_cast<float>(0.1 * std::log(s.factor) + 1.0);
}

}  // namespace fathom
