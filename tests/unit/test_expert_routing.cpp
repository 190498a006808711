// engine/expert_routing.cpp: the top-k of softmax(router logits), renormalised, as transformers'
// Qwen3MoE (norm_topk_prob) and Mixtral routers compute it, and the pairs grouped by expert.
#include "engine/expert_routing.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace fathom {
namespace {

TEST(ExpertRouting, TopKOfTheSoftmaxRenormalisedAndGroupedByExpert) {
  // 3 tokens, 4 experts, top 2.
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 1.0f,   // experts 1, 3
                                     3.0f, 0.0f, 2.5f, 0.0f,    // experts 0, 2
                                     0.0f, 0.1f, 0.0f, 4.0f};   // experts 3, 1
  ExpertRouting r;
  route_tokens(logits.data(), 3, 4, 2, r);
  ASSERT_EQ(r.pairs(), 6);
  EXPECT_EQ(r.expert_begin, (std::vector<int32_t>{0, 1, 3, 4, 6}));
  EXPECT_EQ(r.pair_token, (std::vector<int32_t>{1, 0, 2, 1, 0, 2}));  // by expert, then token
  // softmax then renormalised over the chosen = softmax over the chosen logits
  const auto w = [](float a, float b) { return 1.0f / (1.0f + std::exp(b - a)); };
  const int32_t t0_first = r.token_pair[0], t0_second = r.token_pair[1];
  EXPECT_EQ(r.pair_token[t0_first], 0);
  EXPECT_EQ(t0_first, 1);   // token 0's heaviest slot: expert 1
  EXPECT_EQ(t0_second, 4);  // then expert 3
  EXPECT_NEAR(r.pair_weight[t0_first], w(2.0f, 1.0f), 1e-6);
  EXPECT_NEAR(r.pair_weight[t0_second], w(1.0f, 2.0f), 1e-6);
  for (int64_t t = 0; t < 3; ++t)
    EXPECT_NEAR(r.pair_weight[r.token_pair[2 * t]] + r.pair_weight[r.token_pair[2 * t + 1]], 1.0f, 1e-6);
  EXPECT_NEAR(r.pair_weight[r.token_pair[2]], w(3.0f, 2.5f), 1e-6);
}

TEST(ExpertRouting, EveryExpertWhenKIsAll) {
  const std::vector<float> logits = {1.0f, 1.0f, 1.0f};
  ExpertRouting r;
  route_tokens(logits.data(), 1, 3, 3, r);
  EXPECT_EQ(r.token_pair, (std::vector<int32_t>{0, 1, 2}));  // ties: the lower expert first
  for (float w : r.pair_weight) EXPECT_NEAR(w, 1.0f / 3, 1e-7);
}

}  // namespace
}  // namespace fathom
