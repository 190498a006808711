#include "engine/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "base/error.h"
#include "kernels/cpu/ops.h"

// Cost per token for a vocabulary of V (262144 for Gemma-class models), n = prompt + generated:
//   copy + bias + penalties O(V + n): penalties count into a [V] array reset in O(n), no sort;
//   greedy: one O(V) argmax pass, nothing else;
//   temperature only (no top-k / top-p / min-p): one vector exp pass and one draw scan, O(V);
//   otherwise: O(V) to build 64-bit (value, id) keys and O(C) exps for C candidates;
//   top-k: one nth_element, O(V); only k candidates go on;
//   top-p: nth_element of blocks growing ×8 from 256 until they hold the nucleus, O(C) per
//     round, then a sort of the last block only: about O(C) for a peaked distribution and
//     O(C log C) only as it approaches flat (never a full O(V log V) sort up front);
//   min-p, draw: O(C);  logprobs: O(V) log-sum-exp plus one pass keeping the best n ≤ 20.

namespace fathom {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Temperatures this small are greedy in effect (vLLM uses the same 1e-5 cut-off).
constexpr float kGreedyTemperature = 1e-5f;

// Relative slack on the top-p target so that a nucleus whose exact mass equals top_p
// (e.g. 0.5 + 0.3 with top_p = 0.8) is not widened by one token through float rounding.
constexpr double kTopPSlack = 1e-6;

// NaN would break the strict weak ordering of the sorts below; a NaN logit is never chosen.
inline float sanitize(float x) { return std::isnan(x) ? kNegInf : x; }

// Candidate sort key: (order-preserving bits of the value << 32) | (UINT32_MAX - id).
// Keys in descending order are values descending, lowest id first on ties, so top-k and the
// nucleus are deterministic, and the sorts compare integers instead of loading x[id].
inline uint64_t make_key(float v, int32_t id) {
  uint32_t b = std::bit_cast<uint32_t>(v);
  b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);  // negatives reversed, below positives
  return (uint64_t{b} << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(id));
}
inline int32_t key_id(uint64_t key) {
  return static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(key));
}

// Max of x[0, n) over 8 independent lanes: one running max is a loop-carried dependency
// that made greedy ~10× slower at V = 262144. No NaN here (sanitized), so max is exact.
float max_value(const float* x, int32_t n) {
  float lane[8];
  std::fill(lane, lane + 8, kNegInf);
  int32_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) lane[j] = std::max(lane[j], x[i + j]);
  for (; i < n; ++i) lane[0] = std::max(lane[0], x[i]);
  return *std::max_element(lane, lane + 8);
}

// First index holding the maximum, so ties go to the lowest id.
int32_t argmax(const float* x, int32_t n) {
  const float m = max_value(x, n);
  return static_cast<int32_t>(std::find(x, x + n, m) - x);
}

// `counts` is [vocab], all zero on entry and on exit (only touched entries are reset, so a
// long prompt costs O(n) rather than a fresh O(V) clear).
void apply_penalties_impl(float* logits, int32_t vocab, const SamplingParams& p,
                          const std::vector<int32_t>& prompt, const std::vector<int32_t>& generated,
                          std::vector<int32_t>& counts) {
  for (const auto& [id, bias] : p.logit_bias) {
    FATHOM_CHECK(id >= 0 && id < vocab, "logit_bias id " + std::to_string(id));
    logits[id] += bias;
  }
  const bool repetition = p.repetition_penalty != 1.0f;
  if (!repetition && p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f) return;

  counts.resize(vocab, 0);
  for (int32_t t : generated) {
    FATHOM_CHECK(t >= 0 && t < vocab, "generated id " + std::to_string(t));
    ++counts[t];
  }
  auto repeat = [&](int32_t t) {
    float& x = logits[t];
    x = x > 0.0f ? x / p.repetition_penalty : x * p.repetition_penalty;
  };
  // counts[t] = -1 marks a token already penalised, so duplicates are handled once.
  for (int32_t t : generated) {
    if (counts[t] <= 0) continue;
    if (repetition) repeat(t);
    logits[t] -= p.presence_penalty + p.frequency_penalty * static_cast<float>(counts[t]);
    counts[t] = -1;
  }
  if (repetition) {
    for (int32_t t : prompt) {
      FATHOM_CHECK(t >= 0 && t < vocab, "prompt id " + std::to_string(t));
      if (counts[t] != 0) continue;
      repeat(t);
      counts[t] = -1;
    }
    for (int32_t t : prompt) counts[t] = 0;
  }
  for (int32_t t : generated) counts[t] = 0;
}

// Uniform in [0, 1) from the top 53 bits: std::uniform_real_distribution differs between
// standard libraries, and a seed must give the same tokens on every build.
inline double uniform01(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * 0x1.0p-53;
}

// Draws from x[0, vocab) after temperature, top-k, top-p, min-p; x is overwritten with weights.
// Precondition: temperature ≥ kGreedyTemperature.
int32_t sample_filtered(float* x, int32_t vocab, const SamplingParams& p,
                        std::vector<uint64_t>& keys, std::mt19937_64& rng) {
  if (!(p.top_k > 0 && p.top_k < vocab) && p.top_p >= 1.0f && p.min_p <= 0.0f) {
    // Temperature only (the OpenAI API's knobs): every token is a candidate, in id order, which
    // is also the order the keys below would have. The exps go 16 at a time (cpu::ops).
    const float max_logit = max_value(x, vocab);
    if (!std::isfinite(max_logit)) return argmax(x, vocab);
    const double total = cpu::exp_scaled_inplace(x, vocab, max_logit, 1.0f / p.temperature);
    const double r = uniform01(rng) * total;
    double cum = 0.0;
    int32_t last = 0;  // the last candidate with weight, if rounding leaves r just past the scan
    for (int32_t i = 0; i < vocab; ++i) {
      if (x[i] <= 0.0f) continue;
      cum += x[i];
      last = i;
      if (r < cum) return i;
    }
    return last;
  }
  keys.resize(vocab);
  for (int32_t i = 0; i < vocab; ++i) keys[i] = make_key(x[i], i);
  const std::greater<uint64_t> desc;
  if (p.top_k > 0 && p.top_k < vocab) {
    std::nth_element(keys.begin(), keys.begin() + (p.top_k - 1), keys.end(), desc);
    keys.resize(p.top_k);
  }
  const float max_logit = max_value(x, vocab);  // the top-1 always survives top-k
  // All -inf (every token masked) or a +inf logit: no distribution to draw from.
  if (!std::isfinite(max_logit)) return argmax(x, vocab);

  // Softmax(x / T) up to its normaliser: the best candidate gets exactly 1.
  const float inv_t = 1.0f / p.temperature;
  double total = 0.0;
  for (uint64_t k : keys) {
    float& w = x[key_id(k)];
    w = std::exp((w - max_logit) * inv_t);
    total += w;
  }

  if (p.top_p < 1.0f) {
    // Grow a block of the best candidates ×8 (nth_element, O(remaining) each) until its mass
    // reaches the target, then sort only the last block to find the exact cut.
    const double target = static_cast<double>(p.top_p) * total * (1.0 - kTopPSlack);
    const size_t n = keys.size();
    size_t begin = 0, end = std::min<size_t>(n, 256), keep = n;
    double cum = 0.0;
    for (;;) {
      if (end < n) std::nth_element(keys.begin() + begin, keys.begin() + end, keys.end(), desc);
      double block = 0.0;
      for (size_t i = begin; i < end; ++i) block += x[key_id(keys[i])];
      if (cum + block >= target || end == n) {
        std::sort(keys.begin() + begin, keys.begin() + end, desc);
        keep = end;  // if rounding keeps the scan just short of the target
        for (size_t i = begin; i < end; ++i) {
          cum += x[key_id(keys[i])];
          if (cum >= target) {
            keep = i + 1;
            break;
          }
        }
        break;
      }
      cum += block;
      begin = end;
      end = std::min(n, end * 8);
    }
    keys.resize(keep);
    total = 0.0;
    for (uint64_t k : keys) total += x[key_id(k)];
  }
  if (p.min_p > 0.0f) {
    // The best candidate has weight 1, so prob < min_p * max prob is weight < min_p.
    std::erase_if(keys, [&](uint64_t k) { return x[key_id(k)] < p.min_p; });
    total = 0.0;
    for (uint64_t k : keys) total += x[key_id(k)];
  }

  const double r = uniform01(rng) * total;
  double cum = 0.0;
  for (uint64_t k : keys) {
    cum += x[key_id(k)];
    if (r < cum) return key_id(k);
  }
  return key_id(keys.front());  // unreachable: total was summed in this same order
}

}  // namespace

void apply_penalties_and_bias(float* logits, int32_t vocab, const SamplingParams& params,
                              const std::vector<int32_t>& prompt,
                              const std::vector<int32_t>& generated) {
  std::vector<int32_t> counts;
  apply_penalties_impl(logits, vocab, params, prompt, generated, counts);
}

SampledToken score_token(const float* logits, int32_t vocab, int32_t id, int32_t top_n, std::vector<float>& scratch) {
  // log_softmax of the raw logits, as vLLM reports by default: what the model believed,
  // independent of a request's penalties and temperature.
  // Max-subtracted float exps (each ≤ 1, relative error ~1e-7) summed in double.
  FATHOM_CHECK(id >= 0 && id < vocab && top_n >= 0);
  SampledToken out;
  out.id = id;
  scratch.assign(logits, logits + vocab);
  for (float& v : scratch) v = sanitize(v);
  const float max_raw = max_value(scratch.data(), vocab);
  const double log_z = max_raw + std::log(cpu::sum_exp(scratch.data(), vocab, max_raw));
  out.logprob = static_cast<float>(scratch[id] - log_z);

  // Best n by raw logit, lowest id first on ties (ids are visited in increasing order and
  // an equal value never displaces or jumps ahead of an earlier one).
  const size_t n = static_cast<size_t>(top_n);
  auto& top = out.top;
  top.reserve(n + 1);
  for (int32_t i = 0; i < vocab && n > 0; ++i) {
    const float v = scratch[i];
    if (top.size() == n && !(v > top.back().second)) continue;
    auto pos = std::find_if(top.begin(), top.end(), [&](const auto& e) { return e.second < v; });
    top.insert(pos, {i, v});
    if (top.size() > n) top.pop_back();
  }
  for (auto& e : top) e.second = static_cast<float>(e.second - log_z);
  return out;
}

Sampler::Sampler(const SamplingParams& params, uint64_t fallback_seed)
    : params_(params), rng_(params.seed.value_or(fallback_seed)) {}

SampledToken Sampler::sample(const float* logits, int32_t vocab, const std::vector<int32_t>& prompt,
                             const std::vector<int32_t>& generated) {
  FATHOM_CHECK(vocab > 0);
  const SamplingParams& p = params_;
  SampledToken out;

  scratch_.resize(vocab);
  float* x = scratch_.data();  // [vocab] processed logits, later unnormalised probabilities
  for (int32_t i = 0; i < vocab; ++i) x[i] = sanitize(logits[i]);
  apply_penalties_impl(x, vocab, p, prompt, generated, count_scratch_);  // finite terms: no NaN

  out.id = p.temperature < kGreedyTemperature || p.top_k == 1
               ? argmax(x, vocab)
               : sample_filtered(x, vocab, p, key_scratch_, rng_);

  if (p.logprobs >= 0) {
    const int32_t id = out.id;
    out = score_token(logits, vocab, id, p.logprobs, scratch_);
  }
  return out;
}

}  // namespace fathom
