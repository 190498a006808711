#pragma once
// Batched generation for the CLI and benchmarks: every request's prompt is prefilled in one
// forward pass, then all unfinished requests decode together, one token each per pass.
// (The serving engine with continuous batching and a scheduler builds on the same Model API.)
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/attention/policy.h"
#include "engine/sampler.h"

namespace fathom {

class Model;

struct GenerateRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int32_t max_tokens = 128;
  bool stop_at_end_of_generation = true;  // stop on EOS / end-of-turn tokens (not emitted)
  AttentionPolicy attention;              // decode attention policy (prefill is dense)
};

struct GenerateResult {
  std::vector<int32_t> tokens;          // generated ids (without the stop token)
  std::vector<SampledToken> sampled;    // per generated token, with logprobs when asked
  std::string finish_reason;            // "stop" or "length"
};

struct GenerateStats {
  int64_t prefill_tokens = 0, decode_tokens = 0;
  double prefill_seconds = 0, decode_seconds = 0;
};

// Called after each sampled token that is kept: (request index, token id).
using TokenCallback = std::function<void(size_t request, int32_t token)>;

// Throws fathom::Error when a prompt is empty, does not fit the context, or the KV cache is too
// small for the batch.
std::vector<GenerateResult> generate(Model& model, const std::vector<GenerateRequest>& requests,
                                     GenerateStats* stats = nullptr, const TokenCallback& on_token = {});

// Logits of every prompt position: [prompt.size()][vocab], one prefill pass.
std::vector<float> prompt_logits(Model& model, const std::vector<int32_t>& prompt);

}  // namespace fathom
