// Sampler: greedy, temperature, top-k / top-p / min-p support, penalties, bias, seeding,
// logprobs and validation. Expected sets and values are worked out by hand or in double.
#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <string>

#include "base/error.h"

namespace fathom {
namespace {

const std::vector<int32_t> kNone;

std::vector<float> random_logits(int32_t vocab, uint64_t seed, float scale = 4.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> x(vocab);
  for (auto& v : x) v = normal(rng);
  return x;
}

// Logits whose softmax is exactly `probs` (up to rounding).
std::vector<float> logits_from_probs(const std::vector<double>& probs) {
  std::vector<float> x;
  for (double p : probs) x.push_back(static_cast<float>(std::log(p)));
  return x;
}

// Ids drawn over `n` samples, with counts.
std::map<int32_t, int> draw(const SamplingParams& p, const std::vector<float>& logits, int n,
                            uint64_t seed = 1234) {
  Sampler s(p, seed);
  std::map<int32_t, int> counts;
  const auto vocab = int32_t(logits.size());
  for (int i = 0; i < n; ++i) ++counts[s.sample(logits.data(), vocab, kNone, kNone).id];
  return counts;
}

std::set<int32_t> support(const std::map<int32_t, int>& counts) {
  std::set<int32_t> ids;
  for (const auto& [id, c] : counts) ids.insert(id);
  return ids;
}

int32_t reference_argmax(const std::vector<float>& x) {
  return int32_t(std::max_element(x.begin(), x.end()) - x.begin());  // first maximum
}

TEST(Sampler, GreedyPicksArgmaxLowestIdOnTies) {
  SamplingParams p;
  p.temperature = 0.0f;
  for (int32_t vocab : {7, 83, 769, 5125}) {
    auto x = random_logits(vocab, vocab);
    Sampler s(p, 1);
    EXPECT_EQ(s.sample(x.data(), vocab, kNone, kNone).id, reference_argmax(x)) << vocab;
  }
  std::vector<float> tie = {0.0f, 2.0f, 1.0f, 2.0f};
  Sampler s(p, 1);
  EXPECT_EQ(s.sample(tie.data(), 4, kNone, kNone).id, 1);
}

TEST(Sampler, TinyTemperatureAndTopK1EqualGreedy) {
  for (int32_t vocab : {83, 5125}) {
    auto x = random_logits(vocab, 42 + vocab);
    const int32_t best = reference_argmax(x);
    SamplingParams tiny;
    tiny.temperature = 1e-6f;
    SamplingParams k1;
    k1.temperature = 5.0f;  // very flat, yet top_k = 1 leaves one candidate
    k1.top_k = 1;
    EXPECT_EQ(support(draw(tiny, x, 200)), std::set<int32_t>{best});
    EXPECT_EQ(support(draw(k1, x, 200)), std::set<int32_t>{best});
  }
}

TEST(Sampler, TopKRestrictsSupport) {
  const int32_t vocab = 1031;
  auto x = random_logits(vocab, 7, 0.5f);  // flat-ish, so the top 3 are not overwhelming
  std::vector<int32_t> order(vocab);
  for (int32_t i = 0; i < vocab; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return x[a] > x[b]; });
  SamplingParams p;
  p.top_k = 3;
  p.temperature = 2.0f;
  EXPECT_EQ(support(draw(p, x, 2000)), (std::set<int32_t>{order[0], order[1], order[2]}));
}

TEST(Sampler, TopPKeepsExactlyTheNucleus) {
  // probs 0.5, 0.3, 0.15, 0.05: cumulative 0.5, 0.8, 0.95, 1.0.
  auto x = logits_from_probs({0.5, 0.3, 0.15, 0.05});
  auto with_top_p = [&](float top_p) {
    SamplingParams p;
    p.top_p = top_p;
    return support(draw(p, x, 3000));
  };
  EXPECT_EQ(with_top_p(0.4f), std::set<int32_t>{0});        // 0.5 ≥ 0.4 already
  EXPECT_EQ(with_top_p(0.75f), (std::set<int32_t>{0, 1}));  // 0.8 ≥ 0.75
  EXPECT_EQ(with_top_p(0.8f), (std::set<int32_t>{0, 1}));   // exactly on the boundary
  EXPECT_EQ(with_top_p(0.81f), (std::set<int32_t>{0, 1, 2}));
  EXPECT_EQ(with_top_p(1.0f), (std::set<int32_t>{0, 1, 2, 3}));
}

TEST(Sampler, TopPIsOverTopKSurvivorsRenormalised) {
  // Top-2 of 0.4, 0.3, 0.2, 0.1 renormalises to 4/7, 3/7: top_p = 0.5 keeps only id 0,
  // whereas over the full distribution it would keep {0, 1}.
  auto x = logits_from_probs({0.4, 0.3, 0.2, 0.1});
  SamplingParams p;
  p.top_p = 0.5f;
  EXPECT_EQ(support(draw(p, x, 2000)), (std::set<int32_t>{0, 1}));
  p.top_k = 2;
  EXPECT_EQ(support(draw(p, x, 2000)), std::set<int32_t>{0});
}

TEST(Sampler, TopPOnAFlatLargeVocabulary) {
  // All equal: the nucleus for 0.5 is the first ceil(0.5 * V) ids (ties → lowest id), which
  // needs several rounds of the growing partial sort (256, 2048, V).
  const int32_t vocab = 5125;
  std::vector<float> x(vocab, 0.0f);
  SamplingParams p;
  p.top_p = 0.5f;
  auto ids = support(draw(p, x, 4000));
  EXPECT_LE(*ids.rbegin(), 2562);  // nothing past the nucleus
  EXPECT_GE(*ids.rbegin(), 2540);  // and it reaches (close to) its edge
  EXPECT_GT(ids.size(), 1800u);    // ~2020 distinct expected from 4000 uniform draws
}

TEST(Sampler, MinPDropsTokensBelowFractionOfMax) {
  auto x = logits_from_probs({0.5, 0.3, 0.15, 0.05});
  SamplingParams p;
  p.min_p = 0.2f;  // threshold 0.1: drops 0.05
  EXPECT_EQ(support(draw(p, x, 3000)), (std::set<int32_t>{0, 1, 2}));
  p.min_p = 0.5f;  // threshold 0.25
  EXPECT_EQ(support(draw(p, x, 3000)), (std::set<int32_t>{0, 1}));
  p.min_p = 1.0f;  // only the maximum
  EXPECT_EQ(support(draw(p, x, 3000)), std::set<int32_t>{0});
}

TEST(Sampler, FrequenciesMatchSoftmaxOverTemperature) {
  const std::vector<float> x = {1.0f, 0.5f, -0.3f, 2.0f, 0.0f, -1.5f};
  for (float temperature : {0.7f, 1.0f, 1.6f}) {
    SamplingParams p;
    p.temperature = temperature;
    const int n = 20000;
    auto counts = draw(p, x, n, 99);
    std::vector<double> prob(x.size());
    double z = 0.0;
    for (size_t i = 0; i < x.size(); ++i) z += prob[i] = std::exp(double(x[i]) / temperature);
    double chi2 = 0.0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double expected = n * prob[i] / z;
      const double d = counts[int32_t(i)] - expected;
      chi2 += d * d / expected;
    }
    // 5 degrees of freedom: P(chi2 > 25.7) ≈ 1e-4 for a correct sampler.
    EXPECT_LT(chi2, 25.7) << "temperature " << temperature;
  }
}

TEST(Sampler, PenaltiesFollowTheFormulas) {
  std::vector<float> x = {2.0f, -2.0f, 1.0f, 0.5f, -1.0f, 3.0f};
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  p.logit_bias = {{5, -1.0f}};
  const std::vector<int32_t> prompt = {0, 1, 1};
  const std::vector<int32_t> generated = {2, 2, 3, 1};
  apply_penalties_and_bias(x.data(), 6, p, prompt, generated);
  // bias: id 5 → 2. repetition on {0,1,2,3}: 2/2, -2*2, 1/2, 0.5/2.
  // generated counts {2:2, 3:1, 1:1}: -(0.5 + 0.25 * count).
  const std::vector<float> expected = {1.0f,          -4.0f - 0.75f, 0.5f - 1.0f,
                                       0.25f - 0.75f, -1.0f,         2.0f};
  for (size_t i = 0; i < x.size(); ++i) EXPECT_FLOAT_EQ(x[i], expected[i]) << i;

  // A negative presence penalty encourages repeats; prompt-only tokens are untouched by it.
  std::vector<float> y = {0.0f, 0.0f};
  SamplingParams q;
  q.presence_penalty = -1.5f;
  apply_penalties_and_bias(y.data(), 2, q, {0}, {1, 1});
  EXPECT_FLOAT_EQ(y[0], 0.0f);
  EXPECT_FLOAT_EQ(y[1], 1.5f);
}

TEST(Sampler, PenaltiesFlipGreedy) {
  const std::vector<float> x = {1.0f, 0.9f, -5.0f};
  SamplingParams p;
  p.temperature = 0.0f;
  Sampler plain(p, 1);
  EXPECT_EQ(plain.sample(x.data(), 3, {0}, kNone).id, 0);
  p.repetition_penalty = 1.5f;  // 1.0 / 1.5 < 0.9, and it applies to prompt tokens
  Sampler rep(p, 1);
  EXPECT_EQ(rep.sample(x.data(), 3, {0}, kNone).id, 1);
  p.repetition_penalty = 1.0f;
  p.frequency_penalty = 0.1f;  // 1.0 - 0.1 * 3 = 0.7 < 0.9 - 0.1 * 1 = 0.8
  Sampler freq(p, 1);
  EXPECT_EQ(freq.sample(x.data(), 3, kNone, {0, 1, 0, 0}).id, 1);
}

TEST(Sampler, LogitBiasBansAndForces) {
  const std::vector<float> x = {0.0f, 1.0f, -3.0f, 10.0f};
  SamplingParams p;
  p.logit_bias = {{3, -100.0f}};
  EXPECT_EQ(support(draw(p, x, 2000)).count(3), 0u);
  p.logit_bias = {{2, 100.0f}};
  p.temperature = 1.5f;
  EXPECT_EQ(support(draw(p, x, 2000)), std::set<int32_t>{2});
}

TEST(Sampler, SeedDeterminesTheSequence) {
  auto x = random_logits(769, 3, 1.0f);
  auto sequence = [&](std::optional<uint64_t> seed, uint64_t fallback) {
    SamplingParams p;
    p.seed = seed;
    p.top_p = 0.95f;
    Sampler s(p, fallback);
    std::vector<int32_t> ids;
    for (int i = 0; i < 64; ++i) ids.push_back(s.sample(x.data(), 769, kNone, ids).id);
    return ids;
  };
  EXPECT_EQ(sequence(11, 1), sequence(11, 2));       // the request seed wins
  EXPECT_NE(sequence(11, 1), sequence(12, 1));       // different seeds differ
  EXPECT_EQ(sequence(std::nullopt, 11), sequence(11, 5));  // unset: the fallback seeds
}

TEST(Sampler, LogprobsAreRawLogSoftmax) {
  const int32_t vocab = 769;
  auto x = random_logits(vocab, 5, 6.0f);
  for (auto& v : x) v += 300.0f;  // large offset: a naive exp would overflow
  double max = -std::numeric_limits<double>::infinity();
  for (float v : x) max = std::max<double>(max, v);
  double sum = 0.0;
  for (float v : x) sum += std::exp(double(v) - max);
  auto ref = [&](int32_t id) { return double(x[id]) - max - std::log(sum); };

  SamplingParams p;
  p.logprobs = 5;
  p.temperature = 0.3f;          // neither temperature...
  p.repetition_penalty = 3.0f;   // ...nor penalties change the reported logprobs
  p.logit_bias = {{17, 50.0f}};  // forces id 17 in practice
  Sampler s(p, 1);
  const std::vector<int32_t> prompt = {1, 2, 3};
  for (int i = 0; i < 10; ++i) {
    SampledToken t = s.sample(x.data(), vocab, prompt, kNone);
    EXPECT_EQ(t.id, 17);
    EXPECT_NEAR(t.logprob, ref(t.id), 1e-4);
    ASSERT_EQ(t.top.size(), 5u);
    std::vector<int32_t> order(vocab);
    for (int32_t j = 0; j < vocab; ++j) order[j] = j;
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return x[a] > x[b]; });
    for (size_t k = 0; k < 5; ++k) {
      EXPECT_EQ(t.top[k].first, order[k]) << k;
      EXPECT_NEAR(t.top[k].second, ref(order[k]), 1e-4) << k;
      if (k > 0) {
        EXPECT_GE(t.top[k - 1].second, t.top[k].second);
      }
    }
  }
  p.logprobs = 0;  // chosen token only
  EXPECT_TRUE(Sampler(p, 1).sample(x.data(), vocab, kNone, kNone).top.empty());
}

TEST(Sampler, LargeVocabularyTopKTopP) {
  const int32_t vocab = 262144;
  auto x = random_logits(vocab, 8, 3.0f);
  SamplingParams p;
  p.top_k = 40;
  p.top_p = 0.9f;
  p.min_p = 0.05f;
  std::vector<int32_t> order(vocab);
  for (int32_t j = 0; j < vocab; ++j) order[j] = j;
  std::partial_sort(order.begin(), order.begin() + 40, order.end(),
                    [&](int32_t a, int32_t b) { return x[a] > x[b]; });
  std::set<int32_t> top40(order.begin(), order.begin() + 40);
  for (int32_t id : support(draw(p, x, 100))) EXPECT_TRUE(top40.count(id)) << id;
  p.top_k = 0;  // top-p alone over the whole vocabulary
  EXPECT_FALSE(draw(p, x, 20).empty());
}

void expect_invalid(const SamplingParams& p, const std::string& field) {
  try {
    validate(p, 100);
    ADD_FAILURE() << "no error for " << field;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
  }
}

TEST(Sampler, ValidateRejectsOutOfRange) {
  SamplingParams ok;
  ok.temperature = 0.0f;
  ok.top_k = 100;
  ok.min_p = 1.0f;
  ok.presence_penalty = -2.0f;
  ok.frequency_penalty = 2.0f;
  ok.logit_bias = {{0, -100.0f}, {99, 100.0f}};
  ok.logprobs = 20;
  EXPECT_NO_THROW(validate(ok, 100));
  EXPECT_NO_THROW(validate(SamplingParams{}, 100));

  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto with = [](auto edit) {
    SamplingParams p;
    edit(p);
    return p;
  };
  expect_invalid(with([](auto& p) { p.temperature = -0.1f; }), "temperature");
  expect_invalid(with([&](auto& p) { p.temperature = nan; }), "temperature");
  expect_invalid(with([](auto& p) { p.top_p = 0.0f; }), "top_p");
  expect_invalid(with([](auto& p) { p.top_p = 1.01f; }), "top_p");
  expect_invalid(with([](auto& p) { p.top_k = -1; }), "top_k");
  expect_invalid(with([](auto& p) { p.min_p = -0.01f; }), "min_p");
  expect_invalid(with([](auto& p) { p.min_p = 1.5f; }), "min_p");
  expect_invalid(with([](auto& p) { p.repetition_penalty = 0.0f; }), "repetition_penalty");
  expect_invalid(with([](auto& p) { p.presence_penalty = 2.5f; }), "presence_penalty");
  expect_invalid(with([](auto& p) { p.frequency_penalty = -2.5f; }), "frequency_penalty");
  expect_invalid(with([](auto& p) { p.logit_bias = {{100, 1.0f}}; }), "logit_bias");
  expect_invalid(with([](auto& p) { p.logit_bias = {{-1, 1.0f}}; }), "logit_bias");
  expect_invalid(with([](auto& p) { p.logit_bias = {{3, 101.0f}}; }), "logit_bias");
  expect_invalid(with([](auto& p) { p.logprobs = 21; }), "logprobs");
}

}  // namespace
}  // namespace fathom
