// The RoPE scaling metadata rules (engine/model/rope_scaling.h) on in-memory GGUF images: which
// type a file's keys select, what is refused, and the frequency formulas at their band edges. The
// formulas against transformers on whole models: tests/kernel/test_cuda_rope_scaling.cpp.
#include "engine/model/rope_scaling.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <numbers>
#include <string>
#include <vector>

#include "base/error.h"
#include "engine/model/gguf.h"

namespace fathom {
namespace {

// A GGUF image of metadata only: string and float32 keys.
class Meta {
 public:
  Meta& str(const std::string& key, const std::string& v) {
    strs_.emplace_back(key, v);
    return *this;
  }
  Meta& f32(const std::string& key, float v) {
    floats_.emplace_back(key, v);
    return *this;
  }
  std::unique_ptr<GgufFile> file() {
    bytes_.clear();
    bytes_.insert(bytes_.end(), {'G', 'G', 'U', 'F'});
    put(uint32_t{3}).put(uint64_t{0}).put(static_cast<uint64_t>(strs_.size() + floats_.size()));
    for (const auto& [k, v] : strs_) text(k).put(static_cast<uint32_t>(GgufValueType::STRING)).text(v);
    for (const auto& [k, v] : floats_) text(k).put(static_cast<uint32_t>(GgufValueType::FLOAT32)).put(v);
    return GgufFile::parse(bytes_.data(), bytes_.size(), "mem");
  }

 private:
  template <class T>
  Meta& put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
    return *this;
  }
  Meta& text(const std::string& s) {
    put(static_cast<uint64_t>(s.size()));
    bytes_.insert(bytes_.end(), s.begin(), s.end());
    return *this;
  }
  std::vector<std::pair<std::string, std::string>> strs_;
  std::vector<std::pair<std::string, float>> floats_;
  std::vector<uint8_t> bytes_;
};

constexpr int32_t kRopeDim = 32;

constexpr int64_t kContext = 8192;

RopeScaling scaling(Meta& m) { return rope_scaling_from_gguf(*m.file(), "llama", kRopeDim, kContext); }

std::string refusal(Meta& m) {
  try {
    scaling(m);
  } catch (const Error& e) {
    return e.what();
  }
  return "(accepted)";
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(RopeScalingMetadata, TypeFromTheKeys) {
  Meta none;
  EXPECT_EQ(scaling(none).type, RopeScalingType::kNone);
  // llama.cpp reads a factor without a type as linear.
  Meta untyped;
  untyped.f32("llama.rope.scaling.factor", 2.0f);
  EXPECT_EQ(scaling(untyped).type, RopeScalingType::kLinear);
  EXPECT_EQ(scaling(untyped).factor, 2.0);
  Meta yarn;
  yarn.str("llama.rope.scaling.type", "yarn").f32("llama.rope.scaling.factor", 4.0f);
  yarn.f32("llama.rope.scaling.original_context_length", 4096.0f).f32("llama.rope.scaling.yarn_beta_fast", 16.0f);
  const RopeScaling y = scaling(yarn);
  EXPECT_EQ(y.type, RopeScalingType::kYarn);
  EXPECT_EQ(y.beta_fast, 16.0);
  EXPECT_EQ(y.beta_slow, 1.0);
  EXPECT_FLOAT_EQ(rope_attention_factor(y), static_cast<float>(0.1 * std::log(4.0) + 1.0));
}

TEST(RopeScalingMetadata, RefusesWhatItDoesNotImplement) {
  Meta unknown;
  unknown.str("llama.rope.scaling.type", "dynamic");
  EXPECT_TRUE(has(refusal(unknown), "unsupported rope scaling type 'dynamic'")) << refusal(unknown);

  // longrope's factors are tensors (tests/kernel/test_cuda_arch_fixtures.cpp loads them).
  Meta longrope_without_factors;
  longrope_without_factors.str("llama.rope.scaling.type", "longrope");
  EXPECT_TRUE(has(refusal(longrope_without_factors), "rope_factors_long.weight")) << refusal(longrope_without_factors);

  // attn_factor scales cos and sin in llama.cpp whatever the type: only YaRN and longrope define one.
  Meta linear_attn_factor;
  linear_attn_factor.str("llama.rope.scaling.type", "linear").f32("llama.rope.scaling.factor", 2.0f);
  linear_attn_factor.f32("llama.rope.scaling.attn_factor", 1.5f);
  EXPECT_TRUE(has(refusal(linear_attn_factor), "llama.rope.scaling.attn_factor")) << refusal(linear_attn_factor);

  Meta linear_without_factor;
  linear_without_factor.str("llama.rope.scaling.type", "linear");
  EXPECT_TRUE(has(refusal(linear_without_factor), "llama.rope.scaling.factor"));

  Meta llama3_without_context;
  llama3_without_context.str("llama.rope.scaling.type", "llama3").f32("llama.rope.scaling.factor", 8.0f);
  EXPECT_TRUE(has(refusal(llama3_without_context), "llama.rope.scaling.original_context_length"));

  Meta negative;
  negative.str("llama.rope.scaling.type", "linear").f32("llama.rope.scaling.factor", -2.0f);
  EXPECT_TRUE(has(refusal(negative), "must be positive"));

  for (const auto& [key, value, ok] : std::vector<std::tuple<std::string, float, bool>>{
           {"attn_factor", 1.0f, true},         {"attn_factor", 0.7f, false},
           {"yarn_attn_factor", 2.0f, false},   {"yarn_ext_factor", -1.0f, true},
           {"yarn_ext_factor", 0.5f, false},    {"yarn_log_multiplier", 0.0f, true},
           {"yarn_log_multiplier", 0.1f, false}}) {
    Meta m;
    m.str("llama.rope.scaling.type", "yarn").f32("llama.rope.scaling.factor", 4.0f);
    m.f32("llama.rope.scaling.original_context_length", 4096.0f).f32("llama.rope.scaling." + key, value);
    const std::string r = refusal(m);
    EXPECT_EQ(r == "(accepted)", ok) << key << " = " << value << ": " << r;
    if (!ok) {
      EXPECT_TRUE(has(r, "llama.rope.scaling." + key)) << r;
    }
  }

  Meta alpha;
  alpha.f32("llama.rope.scaling.alpha", 1000.0f);
  EXPECT_TRUE(has(refusal(alpha), "llama.rope.scaling.alpha"));
}

// Band edges of Llama 3.1's rule (factor 8, low 1, high 4, original 8192): wavelengths under 2048
// are kept, over 8192 divided by 8, between blended so the factor is continuous at both edges.
TEST(RopeScalingMetadata, Llama3RuleBands) {
  Meta m;
  m.str("llama.rope.scaling.type", "llama3").f32("llama.rope.scaling.factor", 8.0f);
  m.f32("llama.rope.scaling.original_context_length", 8192.0f);
  const RopeScaling s = scaling(m);
  const double base = 500000;
  const std::vector<double> plain = rope_inv_freq(base, kRopeDim, RopeScaling{});
  const std::vector<double> scaled = rope_inv_freq(base, kRopeDim, s);
  int kept = 0, divided = 0, blended = 0;
  for (int32_t i = 0; i < kRopeDim / 2; ++i) {
    const double wavelen = 2 * std::numbers::pi / plain[i], ratio = plain[i] / scaled[i];
    if (wavelen < 2048) {
      EXPECT_EQ(ratio, 1.0) << i;
      ++kept;
    } else if (wavelen > 8192) {
      EXPECT_DOUBLE_EQ(ratio, 8.0) << i;
      ++divided;
    } else {
      const double smooth = (8192 / wavelen - 1) / 3;  // 1 at 2048, 0 at 8192
      EXPECT_DOUBLE_EQ(1 / ratio, (1 - smooth) / 8 + smooth) << i;
      ++blended;
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(blended, 0);
}

}  // namespace
}  // namespace fathom
