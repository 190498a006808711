#include <cmath>
#include <string>

#include "base/error.h"
#include "engine/sampler.h"

// SamplingParams' ranges, apart from the sampler's kernels: the front ends' request checks (and
// scripts/fuzz.sh) use it without them.
namespace fathom {
namespace {

std::string num(double x) { return std::to_string(x); }

}  // namespace

void validate(const SamplingParams& p, int32_t vocab) {
  FATHOM_CHECK(vocab > 0);
  // Written as !(in range) so NaN fails every check.
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature))
    throw Error("temperature must be a finite number >= 0, got " + num(p.temperature));
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f))
    throw Error("top_p must be in (0, 1], got " + num(p.top_p));
  if (p.top_k < 0)
    throw Error("top_k must be >= 0 (0 disables it), got " + std::to_string(p.top_k));
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f))
    throw Error("min_p must be in [0, 1], got " + num(p.min_p));
  if (!(p.repetition_penalty > 0.0f) || !std::isfinite(p.repetition_penalty))
    throw Error("repetition_penalty must be a finite number > 0, got " + num(p.repetition_penalty));
  if (!(p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f))
    throw Error("presence_penalty must be in [-2, 2], got " + num(p.presence_penalty));
  if (!(p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f))
    throw Error("frequency_penalty must be in [-2, 2], got " + num(p.frequency_penalty));
  for (const auto& [id, bias] : p.logit_bias) {
    if (id < 0 || id >= vocab)
      throw Error("logit_bias token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                  std::to_string(vocab) + ")");
    if (!(bias >= -100.0f && bias <= 100.0f))
      throw Error("logit_bias for token " + std::to_string(id) + " must be in [-100, 100], got " +
                  num(bias));
  }
  if (p.logprobs < -1 || p.logprobs > 20)
    throw Error("logprobs must be in [0, 20] (or -1 for off), got " + std::to_string(p.logprobs));
}

}  // namespace fathom
