// The backend-independent parts of policy decode: ALISA's selection mass (its max-pooled mass),
// HiP's refresh turns, the break-even probes a backend measures on behalf of a policy, and the
// registry's parameter tables (defaults, bounds, names).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/error.h"
#include "engine/attention/decode_attention.h"
#include "engine/attention/policies/alisa.h"
#include "engine/attention/policies/hip.h"
#include "engine/attention/policies/sparq.h"
#include "kernels/cpu/matmul.h"

namespace fathom {
namespace {

// The definition: the max over [t − r, t + r] clipped to the array.
std::vector<float> naive_max_pool(const std::vector<float>& v, int32_t r) {
  const int32_t n = static_cast<int32_t>(v.size());
  std::vector<float> out(n);
  for (int32_t t = 0; t < n; ++t)
    out[t] = *std::max_element(v.begin() + std::max(0, t - r), v.begin() + std::min(n, t + r + 1));
  return out;
}

TEST(AlisaSelectionMass, IsTheMassMaxPooledOverTheWindowAtEveryLengthAndWidth) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  // Pools up to 33 take the shifted-max passes (one AVX-512 pass of masked loads when the level
  // has it), larger ones van Herk / Gil-Werman. The largest pool a request may give: the windows
  // clipped at both ends cost O(S), not O(S · pool).
  for (const char* level : {"portable", "avx512"}) {
    if (!cpu::set_simd_level_for_testing(level)) continue;
    for (int32_t pool : {3, 5, 7, 15, 33, 35, 41, 99, 2147483647}) {
      for (int32_t n : {1, 2, 3, 6, 7, 8, 14, 15, 16, 17, 22, 23, 24, 40, 41, 42, 100, 1001, 8000}) {
        alisa::LayerState st;
        st.mass.resize(n);
        for (float& m : st.mass) m = u(rng);
        AttentionPolicy p = AttentionPolicy::named("alisa");
        p.set(alisa::kPool, pool);
        const float* got = alisa::selection_mass(p, st);
        const std::vector<float> want = naive_max_pool(st.mass, pool / 2);
        ASSERT_EQ(std::vector<float>(got, got + n), want) << level << " pool " << pool << " n " << n;
      }
    }
  }
  if (!cpu::set_simd_level_for_testing("avx512")) cpu::set_simd_level_for_testing("avx2");
}

// The fold over the kept positions only is the dense definition mass·keep + weights (weights 0
// where not kept), bit for bit; a kept position outside the mass is an internal error.
TEST(AlisaFoldMass, EqualsTheDenseFoldBitwise) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  const int32_t S = 1000;
  alisa::LayerState st;
  st.mass.resize(S);
  for (float& m : st.mass) m = u(rng);
  std::vector<int32_t> kept;
  std::vector<float> kept_weights, dense(S, 0.0f);
  for (int32_t t = 0; t < S; t += 1 + static_cast<int32_t>(rng() % 7)) {
    kept.push_back(t);
    kept_weights.push_back(u(rng) * 9.0f);
    dense[t] = kept_weights.back();
  }
  const int32_t k_local = 125;
  const float keep = 1.0f - 1.0f / static_cast<float>(k_local);
  std::vector<float> want(S);
  for (int32_t t = 0; t < S; ++t) want[t] = st.mass[t] * keep + dense[t];
  alisa::fold_mass(st, kept, kept_weights.data(), k_local);
  EXPECT_EQ(st.mass, want);
  const std::vector<int32_t> outside = {S};
  EXPECT_THROW(alisa::fold_mass(st, outside, kept_weights.data(), k_local), std::logic_error);
}

TEST(AlisaSelectionMass, PoolOneIsTheRawMassAndEvenPoolsAreRejected) {
  alisa::LayerState st;
  st.mass = {0.1f, 0.9f, 0.2f};
  AttentionPolicy p = AttentionPolicy::named("alisa");
  p.set(alisa::kPool, 1);
  EXPECT_EQ(alisa::selection_mass(p, st), st.mass.data());
  p.set(alisa::kPool, 4);
  EXPECT_THROW(p.validate(), Error);
  p.set(alisa::kPool, 0);
  EXPECT_THROW(p.validate(), Error);
}

TEST(AlisaSelectionMass, AHeavyTokenKeepsItsNeighboursSelectable) {
  // A needle's digits: one token carries the mass, its neighbours little; pooled, all of
  // [t − 3, t + 3] rank with it above a lone filler token of middling mass.
  alisa::LayerState st;
  st.mass.assign(64, 0.01f);
  st.mass[30] = 1.0f;
  st.mass[50] = 0.3f;
  AttentionPolicy p = AttentionPolicy::named("alisa");  // default pool 7
  const float* m = alisa::selection_mass(p, st);
  for (int32_t t = 27; t <= 33; ++t) EXPECT_FLOAT_EQ(m[t], 1.0f) << t;
  EXPECT_FLOAT_EQ(m[26], 0.01f);
  EXPECT_FLOAT_EQ(m[34], 0.01f);
}

// The HiP refresh schedule over a sequence's steps, for the layers the policy reads: SmolLM2's
// (all but the leading hip_dense_layers) and Gemma 3's (the global layers 5, 11, 17, ...). Every
// layer estimates at its first step, then every R steps, and the layers take turns: no later step
// re-estimates more than ⌈n / R⌉ of the n layers (before, all n every R-th step).
TEST(HipRefresh, EveryLayerEveryRStepsAndTheLayersTakeTurns) {
  for (const bool gemma : {false, true})
    for (const int32_t R : {1, 2, 4, 8})
      for (const int32_t L : {18, 26, 30}) {
        AttentionPolicy p = AttentionPolicy::named("hip");
        p.set(hip::kRefresh, R);
        auto sliding = [&](int32_t l) { return gemma && l % 6 != 5; };
        std::vector<int32_t> layers;  // the layers the policy reads
        for (int32_t l = 0; l < L; ++l)
          if (layer_uses_policy(p, l, sliding(l))) layers.push_back(l);
        const int32_t n = static_cast<int32_t>(layers.size());
        ASSERT_GT(n, 0);
        std::vector<hip::LayerState> state(n);
        std::vector<int32_t> rank(n);
        for (int32_t i = 0; i < n; ++i) {
          rank[i] = policy_layer_rank(p, layers[i], sliding);
          EXPECT_EQ(rank[i], i) << "consecutive turns";
        }
        std::vector<std::vector<int32_t>> estimated_at(n);
        for (int32_t step = 0; step < 5 * R + 3; ++step) {
          int32_t estimates = 0;
          for (int32_t i = 0; i < n; ++i) {
            const bool due = hip::refresh_due(p, state[i]);
            if (due) {
              estimated_at[i].push_back(step);
              ++estimates;
            }
            hip::count_step(p, due, rank[i], state[i]);
          }
          const std::string where = (gemma ? "gemma" : "smollm2") + std::string(" R ") + std::to_string(R) + " L " +
                                    std::to_string(L) + " step " + std::to_string(step);
          if (step == 0) EXPECT_EQ(estimates, n) << where;
          else EXPECT_LE(estimates, (n + R - 1) / R) << where;
        }
        for (int32_t i = 0; i < n; ++i) {
          const std::vector<int32_t>& at = estimated_at[i];
          ASSERT_GE(at.size(), 2u);
          EXPECT_EQ(at[0], 0);
          EXPECT_EQ(at[1], R - i % R) << "layer " << layers[i] << "'s first turn";
          for (size_t k = 2; k < at.size(); ++k) EXPECT_EQ(at[k] - at[k - 1], R) << "layer " << layers[i];
        }
      }
}

// A request's policy maps to a bounded set of probes: ratios up to powers of two or eighths,
// HiP's refresh down to 1, 2 or 4; HiP's mask scope is its own probe (per query head costs more
// than per kv head).
TEST(BreakEvenProbe, BucketsRatiosAndHipVariantsIntoABoundedSet) {
  AttentionPolicy p = AttentionPolicy::named("hip", 0.1);
  AttentionPolicy probe = break_even_probe(p);
  EXPECT_EQ(probe.kv_read_ratio, 0.125);
  EXPECT_EQ(probe.integer(hip::kRefresh), 4);
  EXPECT_TRUE(probe.flag(hip::kPerKvHead));
  EXPECT_TRUE(is_default_probe(probe));
  std::vector<AttentionPolicy> seen;
  for (int32_t refresh = 1; refresh <= 1000; ++refresh)
    for (bool per_kv_head : {false, true}) {
      p.set(hip::kRefresh, refresh);
      p.set(hip::kPerKvHead, per_kv_head);
      probe = break_even_probe(p);
      EXPECT_LE(probe.integer(hip::kRefresh), std::max(1, std::min(refresh, AttentionPolicy{}.integer(hip::kRefresh))));
      EXPECT_EQ(probe.flag(hip::kPerKvHead), per_kv_head);
      if (std::none_of(seen.begin(), seen.end(), [&](const AttentionPolicy& s) { return same_break_even_probe(s, probe); }))
        seen.push_back(probe);
    }
  EXPECT_EQ(seen.size(), 6u);  // refresh 1, 2, 4 × per query head, per kv head
  // Ratios: powers of two up to 1/8, multiples of 1/8 above; never below the ratio asked for.
  AttentionPolicy swa = AttentionPolicy::named("alisa");
  std::vector<double> buckets;
  for (double r = 0.001; r <= 1.0; r += 0.001) {
    swa.kv_read_ratio = r;
    const double b = break_even_probe(swa).kv_read_ratio;
    EXPECT_GE(b, r - 1e-12) << r;
    if (buckets.empty() || buckets.back() != b) buckets.push_back(b);
  }
  EXPECT_EQ(buckets, (std::vector<double>{1.0 / 64, 1.0 / 32, 1.0 / 16, 0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0}));
  swa.kv_read_ratio = 0.375;
  EXPECT_EQ(break_even_probe(swa).kv_read_ratio, 0.375);
  swa.set(alisa::kRatio, 0.2);  // ALISA's own ratio, when given, is the one it reads at
  EXPECT_EQ(break_even_probe(swa).kv_read_ratio, 0.25);
  AttentionPolicy sparq = AttentionPolicy::named("sparq");
  sparq.set(hip::kRefresh, 1);  // another policy's parameter: probes compare by their own policy's only
  EXPECT_TRUE(same_break_even_probe(break_even_probe(sparq), break_even_probe(AttentionPolicy::named("sparq"))));
}

// The registry: names and the old alias, every policy's defaults valid, each bound enforced by
// validate(), and a parameter handle that addresses its own policy's values only.
TEST(PolicyRegistry, NamesDefaultsAndBoundsComeFromTheTables) {
  EXPECT_EQ(policy_kind("dense"), kDensePolicy);
  EXPECT_EQ(policy_kind("swa"), policy_kind("alisa"));  // the deprecated name still parses
  EXPECT_STREQ(policy_name(policy_kind("swa")), "alisa");
  EXPECT_THROW(policy_kind("nope"), Error);
  for (PolicyKind k = 0; k < policy_count(); ++k) {
    AttentionPolicy p(k);
    EXPECT_NO_THROW(p.validate()) << policy_name(k);
    EXPECT_EQ(resolve_auto(p).kind == k, !p.is("auto")) << policy_name(k);
  }
  AttentionPolicy p = AttentionPolicy::named("hip");
  EXPECT_EQ(p.integer(hip::kRefresh), 4);
  EXPECT_FALSE(p.is_set(hip::kMaskK));
  p.set(hip::kRefresh, 0);
  EXPECT_THROW(p.validate(), Error);
  p.set(hip::kRefresh, 2);
  EXPECT_NO_THROW(p.validate());
  EXPECT_EQ(p.integer(sparq::kR), -1);  // another policy's values are its own
  p.set(sparq::kR, 3);
  EXPECT_EQ(p.integer(hip::kRefresh), 2);
  p.set(alisa::kRatio, 1.5);
  EXPECT_THROW(p.validate(), Error);
  p.set(alisa::kRatio, 0.5);
  p.set(sparq::kReallocation, 2);
  EXPECT_THROW(p.validate(), Error);
}

}  // namespace
}  // namespace fathom
