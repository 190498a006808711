#pragma once
// Generation for the CLI (`fathom generate`, `fathom chat`): the requests go through an Engine
// (the same scheduler, batching and stop rules as the server), and the results are collected.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/attention/policy.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/speculative/drafter.h"

namespace fathom {

class Backend;
class DraftModel;
class Model;

struct GenerateRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int32_t max_tokens = 128;               // clamped to the context; 0 generates nothing
  bool stop_at_end_of_generation = true;  // stop on EOS / end-of-turn tokens (not emitted)
  AttentionPolicy attention;              // decode attention policy (prefill is dense)
  Speculation speculative = Speculation::kOff;  // Request::speculative
};

struct GenerateResult {
  std::vector<int32_t> tokens;          // generated ids (without the stop token)
  std::vector<SampledToken> sampled;    // per generated token, with logprobs when asked
  std::string finish_reason;            // "stop" or "length"
};

struct GenerateStats {
  int64_t prefill_tokens = 0, decode_tokens = 0;
  double prefill_seconds = 0, decode_seconds = 0;  // submission to every first token; the rest
};

// Called after each sampled token that is kept: (request index, token id).
using TokenCallback = std::function<void(size_t request, int32_t token)>;

// Throws fathom::Error when a request is invalid (empty prompt, no room in the context or the KV
// cache, a policy the backend lacks) or generation fails.
// `base`: the engine's limits (speculative decoding's among them); its step sizes grow to take every
// prompt in one step. `draft`: the draft model of Speculation::kModel requests (null: none).
std::vector<GenerateResult> generate(const Model& model, Backend& backend, const std::vector<GenerateRequest>& requests,
                                     GenerateStats* stats = nullptr, const TokenCallback& on_token = {},
                                     const SchedulerConfig& base = SchedulerConfig(), DraftModel* draft = nullptr);

// Logits of every prompt position: [prompt.size()][vocab], one prefill pass straight through the
// backend (an analysis tool, not generation).
std::vector<float> prompt_logits(const Model& model, Backend& backend, const std::vector<int32_t>& prompt);

}  // namespace fathom
