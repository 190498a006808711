#pragma once
// Which experts a step's tokens go to (mixture-of-experts layers, ModelConfig::moe()), computed on
// the host from the router's logits by both backends, and the step's (token, slot) pairs grouped
// by expert: the rows of the expert matmuls, so that each active expert's weights are read once
// a step whatever the number of its tokens.
#include <cstdint>
#include <vector>

namespace fathom {

struct ExpertRouting {
  int64_t tokens = 0;
  int32_t experts = 0, used = 0;      // n_experts, n_experts_used (k)
  // Pairs p < tokens · used, ordered by expert, then token: the expert matmuls' rows.
  std::vector<int32_t> pair_token;    // (pairs) the token whose activations pair p reads
  std::vector<float> pair_weight;     // (pairs) its weight in the token's sum
  std::vector<int32_t> expert_begin;  // (experts + 1) expert e's pairs are [begin[e], begin[e + 1])
  std::vector<int32_t> token_pair;    // (tokens, used) the pair of token t's slot j, slots by falling weight

  int64_t pairs() const { return tokens * used; }
};

// transformers' Qwen3MoE / Mixtral routers (norm_topk_prob): p = softmax(logits) in f32, the `used`
// largest (the lower expert index first among equals), weights p / Σ of those. `logits`: (tokens,
// experts) f32.
void route_tokens(const float* logits, int64_t tokens, int32_t experts, int32_t used, ExpertRouting& out);

}  // namespace fathom
