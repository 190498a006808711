#pragma once
// Token sampling from one row of logits: greedy, temperature, top-k, top-p, min-p,
// repetition / presence / frequency penalties, logit bias, per-request seed, logprobs.
#include <cstdint>
#include <optional>
#include <random>
#include <utility>
#include <vector>

namespace fathom {

struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy
  int32_t top_k = 0;         // 0 = off
  float top_p = 1.0f;        // 1 = off
  float min_p = 0.0f;        // 0 = off
  float repetition_penalty = 1.0f;  // 1 = off; over prompt + generated tokens (CTRL/HF rule)
  float presence_penalty = 0.0f;    // over generated tokens (OpenAI rule)
  float frequency_penalty = 0.0f;   // over generated tokens (OpenAI rule)
  std::vector<std::pair<int32_t, float>> logit_bias;  // token id -> added to the logit
  std::optional<uint64_t> seed;     // unset: drawn from the engine's generator
  int32_t logprobs = -1;            // -1 off; 0 chosen token only; n: also the top n alternatives
};

struct SampledToken {
  int32_t id = -1;
  float logprob = 0.0f;  // log-softmax of the raw model logits (before penalties and temperature)
  std::vector<std::pair<int32_t, float>> top;  // top alternatives by raw logprob, best first
};

// Throws fathom::Error naming the offending field when params are out of range for a model
// with `vocab` tokens. Call once when a request is admitted; Sampler assumes valid params.
void validate(const SamplingParams& params, int32_t vocab);

// In place on logits [vocab], in the order sample() uses: logit_bias added; repetition
// penalty over distinct tokens of prompt ∪ generated (logit > 0 ? logit / p : logit * p);
// then for each distinct generated token: -= presence + frequency * count.
// Exposed so tests can check the formulas directly.
void apply_penalties_and_bias(float* logits, int32_t vocab, const SamplingParams& params,
                              const std::vector<int32_t>& prompt,
                              const std::vector<int32_t>& generated);

// Token `id`'s log-softmax under the raw `logits` [vocab] (no penalties, no temperature) and
// the best `top_n` alternatives, best first. `scratch`: a reusable [vocab] buffer.
SampledToken score_token(const float* logits, int32_t vocab, int32_t id, int32_t top_n, std::vector<float>& scratch);

class Sampler {
 public:
  // `fallback_seed` is used when params.seed is unset.
  Sampler(const SamplingParams& params, uint64_t fallback_seed);
  // logits: [vocab]; prompt / generated: the token ids so far (for penalties).
  SampledToken sample(const float* logits, int32_t vocab, const std::vector<int32_t>& prompt,
                      const std::vector<int32_t>& generated);
  const SamplingParams& params() const { return params_; }

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<float> scratch_;         // [vocab] processed logits, then weights
  std::vector<uint64_t> key_scratch_;   // candidates as (value, id) sort keys, see sampler.cpp
  std::vector<int32_t> count_scratch_;  // [vocab] per-token counts, all zero between calls
};

}  // namespace fathom
