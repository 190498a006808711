#include "server/request_rules.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "engine/model/model.h"
#include "engine/request.h"
#include "server/config.h"

namespace fathom {
namespace {

// Past the model's context: OpenAI's code, which clients match on to shorten a conversation.
[[noreturn]] void too_long(const std::string& field, const std::string& message) {
  throw RuleError(RuleError::Kind::kInvalid, field, message, "context_length_exceeded");
}

[[noreturn]] void invalid(const std::string& field, const std::string& message) {
  throw RuleError(RuleError::Kind::kInvalid, field, message);
}

struct NumberRange {
  std::string_view name;
  double lo, hi;
  bool lo_open;  // the lower bound itself is excluded
};

constexpr NumberRange kSamplingRanges[] = {
    {"temperature", 0.0, 2.0, false},        {"top_p", 0.0, 1.0, true},
    {"min_p", 0.0, 1.0, false},              {"presence_penalty", -2.0, 2.0, false},
    {"frequency_penalty", -2.0, 2.0, false}, {"repetition_penalty", 0.0, 10.0, true},
    {"logit_bias", -100.0, 100.0, false},
};

}  // namespace

void check_served_model(const std::string& name, const ServerConfig& config, const std::string& field) {
  if (name.empty()) return;
  const std::filesystem::path file(config.model);
  if (name == config.model_name || name == config.model || name == file.filename().string() ||
      name == file.stem().string())
    return;
  throw RuleError(RuleError::Kind::kNotFound, field,
                  "the model '" + name + "' does not exist (this server serves '" + config.model_name + "')");
}

void check_prompt_fits(size_t prompt_tokens, const Model& model, const std::string& field) {
  const int64_t context = model.config().context_length;
  if (prompt_tokens == 0) invalid(field, "the prompt is empty");
  if (static_cast<int64_t>(prompt_tokens) >= context)
    too_long(field, "the prompt has " + std::to_string(prompt_tokens) + " tokens; this model's context is " +
                        std::to_string(context) + " tokens");
}

int32_t resolve_max_tokens(std::optional<int64_t> asked, size_t prompt_tokens, const Model& model,
                           const ServerConfig& config, const std::string& field) {
  const int64_t context = model.config().context_length;
  const int64_t prompt = static_cast<int64_t>(prompt_tokens);
  if (!asked) return static_cast<int32_t>(std::min<int64_t>(config.default_max_tokens, context - prompt));
  const int64_t m = *asked;
  if (m < 1) invalid(field, "'" + field + "' must be at least 1");
  if (prompt + m > context)
    too_long(field, "'" + field + "' is " + std::to_string(m) + " but the prompt has " + std::to_string(prompt) +
                       " tokens and the context is " + std::to_string(context) + " tokens (at most " +
                       std::to_string(context - prompt) + " more)");
  if (m > config.max_tokens_limit)
    invalid(field, "'" + field + "' must be at most " + std::to_string(config.max_tokens_limit));
  return static_cast<int32_t>(m);
}

int32_t resolve_n(std::optional<int64_t> asked, const ServerConfig& config, const std::string& field) {
  if (!asked) return 1;
  if (*asked < 1 || *asked > config.max_n)
    invalid(field, "'" + field + "' must be between 1 and " + std::to_string(config.max_n) + ", got " +
                       std::to_string(*asked));
  return static_cast<int32_t>(*asked);
}

int32_t resolve_priority(std::optional<int64_t> asked, const ServerConfig& config, const std::string& field) {
  if (!asked) return 0;
  if (*asked < -kMaxClientPriority || *asked > kMaxClientPriority)
    invalid(field, "'" + field + "' must be an integer in [-1000000, 1000000]");
  return client_priority(*asked, config);
}

void add_stop_string(const std::string& stop, StopConditions& conditions, const std::string& field) {
  if (stop.empty()) invalid(field, "stop strings must not be empty");
  if (conditions.strings.size() >= kMaxStopStrings) invalid(field, "at most 4 stop strings are supported");
  conditions.strings.push_back(stop);
}

float check_sampling_number(std::string_view name, double value, const std::string& field) {
  for (const NumberRange& r : kSamplingRanges) {
    if (r.name != name) continue;
    if (!std::isfinite(value) || value < r.lo || value > r.hi || (r.lo_open && value == r.lo)) {
      char range[96];
      std::snprintf(range, sizeof range, "%s%g, %g]", r.lo_open ? "(" : "[", r.lo, r.hi);
      invalid(field, "'" + field + "' must be in " + range);
    }
    return static_cast<float>(value);
  }
  throw Error("no sampling range for '" + std::string(name) + "'");  // a programming error
}

SamplingParams default_sampling(const Model& model) {
  const SamplingDefaults& d = model.sampling_defaults();
  SamplingParams s;
  if (d.temperature) s.temperature = check_sampling_number("temperature", *d.temperature, "general.sampling.temp");
  if (d.top_p) s.top_p = check_sampling_number("top_p", *d.top_p, "general.sampling.top_p");
  if (d.min_p) s.min_p = check_sampling_number("min_p", *d.min_p, "general.sampling.min_p");
  if (d.repetition_penalty)
    s.repetition_penalty = check_sampling_number("repetition_penalty", *d.repetition_penalty, "general.sampling.penalty_repeat");
  if (d.top_k) {
    if (*d.top_k < 0 || *d.top_k > model.vocab()) invalid("general.sampling.top_k", "'general.sampling.top_k' must be in [0, vocab]");
    s.top_k = static_cast<int32_t>(*d.top_k);
  }
  return s;
}

}  // namespace fathom
