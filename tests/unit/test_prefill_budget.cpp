// How a step's token budget is split between prefill chunks (engine/prefill_budget.h).
#include "engine/prefill_budget.h"

#include <gtest/gtest.h>

#include <numeric>
#include <random>

#include "engine/model/model_config.h"

namespace fathom {
namespace {

int64_t sum(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); }

TEST(PrefillBudget, WaterFillsTokensWhenCostIsFlat) {
  // Nobody completes a prompt awaiting its first token: plain water-filling.
  EXPECT_EQ(prefill_shares({{0, 3000, false}, {0, 40, false}}, 512, 0.0), (std::vector<int64_t>{472, 40}));
  EXPECT_EQ(prefill_shares({{0, 3000, false}, {0, 3000, false}}, 512, 0.0), (std::vector<int64_t>{256, 256}));
  EXPECT_EQ(prefill_shares({{0, 100, false}}, 512, 0.0), (std::vector<int64_t>{100}));
}

TEST(PrefillBudget, AStepThatEmitsAFirstTokenHoldsTheOthersToAnEighth) {
  // The 40-token prompt completes in this step: the long one gets 512 / 8 = 64, not 472.
  EXPECT_EQ(prefill_shares({{1024, 3000, true}, {0, 40, true}}, 512, 0.0), (std::vector<int64_t>{64, 40}));
  // A long prompt's last chunk counts too; a second long one waits its turn at the cap.
  EXPECT_EQ(prefill_shares({{2900, 100, true}, {0, 3000, true}}, 512, 0.0), (std::vector<int64_t>{100, 64}));
}

TEST(PrefillBudget, DeepChunksCostMore) {
  // E = 4000, chunk starting at 4000: each token costs 1 + (4000 + 256) / 4000 = 2.064, so
  // floor(512 / 2.064) = 248 tokens fit.
  EXPECT_EQ(prefill_shares({{4000, 3000, false}}, 512, 4000.0), (std::vector<int64_t>{248}));
}

TEST(PrefillBudget, AlwaysProgressesAndNeverOverspends) {
  EXPECT_EQ(sum(prefill_shares({{100000, 50, false}}, 1, 100.0)), 1);  // one token even when it costs more
  EXPECT_EQ(sum(prefill_shares({}, 512, 100.0)), 0);
  std::mt19937 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<PrefillWant> wants(1 + rng() % 6);
    for (PrefillWant& w : wants) w = {static_cast<int64_t>(rng() % 8000), 1 + static_cast<int64_t>(rng() % 4000), (rng() % 2) == 1};
    const int64_t budget = 2 + rng() % 1024;
    const double e = 500.0 + rng() % 8000;
    const std::vector<int64_t> got = prefill_shares(wants, budget, e);
    double cost = 0;
    for (size_t i = 0; i < wants.size(); ++i) {
      ASSERT_GE(got[i], 0);
      ASSERT_LE(got[i], wants[i].tokens);
      const double c = static_cast<double>(std::min(wants[i].tokens, budget));
      cost += static_cast<double>(got[i]) * (1.0 + (static_cast<double>(wants[i].position) + c / 2) / e);
    }
    ASSERT_GE(sum(got), 1);
    if (sum(got) > 1) {
      ASSERT_LE(cost, static_cast<double>(budget) + 1e-6);
    }
  }
}

TEST(PrefillBudget, EquivalentPositionsFromShapes) {
  // SmolLM2-135M: dim 576, 9 heads of 64, 3 KV heads, ffn 1536. Per layer the weights are
  // 2·576·576 + 2·576·192 + 3·576·1536 = 3,538,944; matmul FLOPs per token 2× that = 7,077,888;
  // attention FLOPs per earlier position 4 · 576 = 2,304; 7,077,888 / 2,304 = 3,072.
  ModelConfig c;
  c.dim = 576;
  c.n_heads = 9;
  c.n_kv_heads = 3;
  c.head_dim = 64;
  c.ffn_dim = 1536;
  EXPECT_DOUBLE_EQ(attention_equivalent_positions(c), 3072.0);
}

TEST(StepCostModel, LearnsTheRatioOfTokenToPositionCost) {
  // Steps that take 5 ms + 1 ms per token + 0.5 µs per attention position: E = 1e-3 / 5e-7 = 2000.
  StepCostModel model(3072.0);
  EXPECT_EQ(model.equivalent_positions(), 3072.0) << "the prior until there are observations";
  std::mt19937 rng(3);
  for (int i = 0; i < 200; ++i) {
    const double tokens = 1 + rng() % 512, start = rng() % 4000;
    const double positions = tokens * (start + tokens / 2);
    model.observe(tokens, positions, 5e-3 + 1e-3 * tokens + 5e-7 * positions);
  }
  EXPECT_NEAR(model.equivalent_positions(), 2000.0, 1.0);
}

TEST(StepCostModel, KeepsThePriorWhenStepsCannotTellCostsApart) {
  StepCostModel model(3072.0);
  for (int i = 0; i < 100; ++i) model.observe(1, 100, 0.01);  // every step the same
  EXPECT_EQ(model.equivalent_positions(), 3072.0);
  StepCostModel wild(3072.0);
  std::mt19937 rng(5);
  for (int i = 0; i < 100; ++i) wild.observe(1 + rng() % 512, rng() % 100000, 1e-3 * (rng() % 100));  // noise
  const double e = wild.equivalent_positions();
  EXPECT_TRUE(e == 3072.0 || (e >= 3072.0 / 8 && e <= 3072.0 * 8)) << e;
}

}  // namespace
}  // namespace fathom
