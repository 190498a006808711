// The backend-independent parts of policy decode: SWA's selection mass (max-pooled ALISA mass).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "base/error.h"
#include "engine/attention/decode_attention.h"

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

TEST(SwaSelectionMass, IsTheMassMaxPooledOverTheWindowAtEveryLengthAndWidth) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (int32_t pool : {3, 5, 7, 15}) {
    for (int32_t n : {1, 2, 3, 6, 7, 8, 14, 15, 16, 100, 1001}) {
      LayerPolicyState st;
      st.swa_mass.resize(n);
      for (float& m : st.swa_mass) m = u(rng);
      AttentionPolicy p{PolicyKind::kSwa};
      p.swa_pool = pool;
      const float* got = swa_selection_mass(p, st);
      const std::vector<float> want = naive_max_pool(st.swa_mass, pool / 2);
      ASSERT_EQ(std::vector<float>(got, got + n), want) << "pool " << pool << " n " << n;
    }
  }
}

TEST(SwaSelectionMass, PoolOneIsTheRawMassAndEvenPoolsAreRejected) {
  LayerPolicyState st;
  st.swa_mass = {0.1f, 0.9f, 0.2f};
  AttentionPolicy p{PolicyKind::kSwa};
  p.swa_pool = 1;
  EXPECT_EQ(swa_selection_mass(p, st), st.swa_mass.data());
  p.swa_pool = 4;
  EXPECT_THROW(p.validate(), Error);
  p.swa_pool = 0;
  EXPECT_THROW(p.validate(), Error);
}

TEST(SwaSelectionMass, AHeavyTokenKeepsItsNeighboursSelectable) {
  // A needle's digits: one token carries the mass, its neighbours little; pooled, all of
  // [t − 3, t + 3] rank with it above a lone filler token of middling mass.
  LayerPolicyState st;
  st.swa_mass.assign(64, 0.01f);
  st.swa_mass[30] = 1.0f;
  st.swa_mass[50] = 0.3f;
  AttentionPolicy p{PolicyKind::kSwa};  // default pool 7
  const float* m = swa_selection_mass(p, st);
  for (int32_t t = 27; t <= 33; ++t) EXPECT_FLOAT_EQ(m[t], 1.0f) << t;
  EXPECT_FLOAT_EQ(m[26], 0.01f);
  EXPECT_FLOAT_EQ(m[34], 0.01f);
}

}  // namespace
}  // namespace fathom
