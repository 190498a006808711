// Speculative decoding's parts (docs/speculative.md): prompt-lookup drafts, and on the real CPU
// backend (SmolLM2-135M) a verify step and its rollback. A verify step's kept rows give bitwise the
// logits one-token steps give; after Backend::rollback_kv the running planes (V sums, K moments)
// equal the one-token steps' bitwise, so a later SparQ step — which reads them — is bitwise the same;
// without the rollback it is not (the check can fail).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/kv/block_allocator.h"
#include "engine/kv/block_table.h"
#include "engine/model/model.h"
#include "engine/speculative/drafter.h"
#include "engine/speculative/speculator.h"

namespace fathom {
namespace {

TEST(NgramDraft, ProposesWhatFollowedTheLatestEarlierOccurrenceOfTheLongestSuffix) {
  const std::vector<int32_t> t = {1, 2, 3, 9, 8, 1, 2, 3, 7, 6, 5, 2, 3};
  // Suffix {2, 3} (no longer suffix recurs): latest earlier occurrence at 6, followed by 7, 6, 5, ...
  EXPECT_EQ(ngram_draft(t, 3), (std::vector<int32_t>{7, 6, 5}));
  EXPECT_EQ(ngram_draft(t, 10), (std::vector<int32_t>{7, 6, 5, 2, 3}));  // up to the end
  const std::vector<int32_t> longer = {4, 5, 6, 1, 1, 5, 6, 2, 4, 5, 6};
  EXPECT_EQ(ngram_draft(longer, 2), (std::vector<int32_t>{1, 1})) << "{4, 5, 6} beats the later {5, 6}";
  EXPECT_TRUE(ngram_draft(std::vector<int32_t>{1, 2, 3, 4}, 4).empty()) << "nothing recurs";
  EXPECT_TRUE(ngram_draft(std::vector<int32_t>{1, 2, 1, 2}, 0).empty());
  EXPECT_TRUE(ngram_draft(std::vector<int32_t>{}, 4).empty());
  EXPECT_EQ(ngram_draft(std::vector<int32_t>{5, 5, 5, 5}, 3), (std::vector<int32_t>{5})) << "overlapping match";
  EXPECT_TRUE(ngram_draft(std::vector<int32_t>{1, 2, 3, 1}, 4).empty()) << "n_min 2: one token is no match";
  EXPECT_EQ(ngram_draft(std::vector<int32_t>{1, 2, 3, 1}, 4, 4, 1), (std::vector<int32_t>{2, 3, 1}));
}

// The cost rule's round size, in units of a plain step (dense 1): draft steps at 0.3 with verify
// rows at 0.1 pay at a good record; at a poor one they do not, and then only every 16th token
// probes with one draft; draft steps as dear as plain ones never pay, so no probe either.
TEST(Speculation, RoundsPayOrProbeOnlyWhereAKeptDraftCouldPay) {
  EXPECT_EQ(best_round(0.9, 4, 1.0, 0.3, 0.1), 4);
  EXPECT_EQ(best_round(0.3, 4, 1.0, 0.3, 0.1), 0);
  // Round of 1 at α: (1 + α) / (1 + 0.3 + 0.1) beats 1 from α = 0.4 on.
  EXPECT_EQ(best_round(0.45, 1, 1.0, 0.3, 0.1), 1);
  EXPECT_EQ(best_round(0.35, 1, 1.0, 0.3, 0.1), 0);
  EXPECT_EQ(round_or_probe(0.9, 4, 1.0, 0.3, 0.1, 5), 4);
  EXPECT_EQ(round_or_probe(0.3, 4, 1.0, 0.3, 0.1, 5), 0);
  EXPECT_EQ(round_or_probe(0.3, 4, 1.0, 0.3, 0.1, 32), 1) << "the 16th-token probe";
  // Draft steps costing 0.95 of a plain step and verify rows 0.1: even all kept, a round of j gives
  // (j + 1) / (1 + 1.05 j) < 1.
  EXPECT_EQ(best_round(1.0, 4, 1.0, 0.95, 0.1), 0);
  EXPECT_EQ(round_or_probe(0.3, 4, 1.0, 0.95, 0.1, 32), 0) << "no probe where nothing could pay";
}

TEST(Speculation, ParsesItsModes) {
  EXPECT_EQ(parse_speculation("ngram"), Speculation::kNgram);
  EXPECT_EQ(parse_speculation("off"), Speculation::kOff);
  EXPECT_EQ(parse_speculation("sparse"), Speculation::kSparse);
  for (const Speculation d : kDrafters) EXPECT_EQ(parse_speculation(speculation_name(d)), d);
  EXPECT_FALSE(parse_speculation("NGRAM"));
  EXPECT_FALSE(parse_speculation(""));
}

const std::string kModel = std::string(FATHOM_MODELS_DIR) + "/smollm2-135m-instruct-q4_1.gguf";

// One sequence's block table over a backend.
struct SeqRun {
  Backend* backend;
  BlockAllocator allocator;
  BlockTable table;
  explicit SeqRun(Backend& b)
      : backend(&b), allocator(b.kv_blocks(), b.kv_layout().block_size), table(allocator) {
    EXPECT_TRUE(table.reserve(320));
  }
  // Logits of `tokens` at pos0.. (every row); `verify` marks a verify step; `policy` decodes a one-token step.
  std::vector<float> step(const std::vector<int32_t>& tokens, int32_t pos0, bool verify = false,
                          const AttentionPolicy* policy = nullptr, SeqPolicyState* state = nullptr) {
    BatchPlan plan;
    plan.seqs.push_back(SeqStep{tokens, pos0, &table.blocks(), LogitsWanted::kAll, policy, state});
    plan.seqs.back().verify = verify;
    std::vector<float> logits;
    backend->forward(plan, logits);
    return logits;
  }
  // Every layer's V sum and K moments of block `b`.
  std::vector<float> running(int32_t b) {
    CpuKvStorage& kv = static_cast<CpuBackend&>(*backend).kv_storage();
    const KvLayout& L = kv.layout();
    std::vector<float> out;
    for (int32_t l = 0; l < L.n_layers; ++l) {
      const PagedKvView v = kv.view(l, table.blocks().data());
      const size_t n = static_cast<size_t>(L.n_kv_heads) * L.head_dim;
      const int32_t block = table.blocks()[b];
      out.insert(out.end(), v.v_sum + block * n, v.v_sum + (block + 1) * n);
      out.insert(out.end(), v.k_moments + block * 2 * n, v.k_moments + (block + 1) * 2 * n);
    }
    return out;
  }
};

bool same_bits(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

class VerifyStep : public ::testing::TestWithParam<KvDtype> {};
constexpr int32_t kP = 300;  // prompt tokens: position 300 is slot 12 of a 16-token block

TEST_P(VerifyStep, KeptRowsAndRolledBackPlanesAreTheOneTokenSteps) {
  const auto model = Model::load(kModel);
  const int32_t V = model->vocab();
  std::string text;
  for (int i = 0; i < 40; ++i) text += "The lighthouse keeper climbed the stairs every evening and trimmed the wick. ";
  std::vector<int32_t> prompt = model->tokenizer().encode(text);
  ASSERT_GE(prompt.size(), static_cast<size_t>(kP));
  prompt.resize(kP);  // SparQ selects a part of 300 keys; the verify rows cross from block 18 into 19
  const std::vector<int32_t> rows = {411, 2137, 260, 1035, 7213, 30};  // the last token, then 5 drafts
  AttentionPolicy sparq = AttentionPolicy::named("sparq", 0.25);
  sparq.min_keys = 0;  // sparse at these short lengths too
  // Three backends (their own KV storage): one-token steps, a verify step rolled back, and a
  // verify step not rolled back.
  std::unique_ptr<Backend> backends[3];
  for (auto& b : backends) {
    ModelOptions o;
    o.threads = 2;
    o.kv_dtype = GetParam();
    o.kv_cache_bytes = 16 << 20;
    b = make_backend(*model, o);
  }
  // Each case writes positions from kP on: after the first, only the prompt's last block (288 on,
  // and its running planes) is computed again (each case's fresh allocator hands out the same blocks).
  const std::vector<int32_t> last_block_tokens(prompt.begin() + kP / 16 * 16, prompt.end());
  for (const int32_t kept : {1, 4, 5}) {
    SCOPED_TRACE("kept " + std::to_string(kept));
    SeqRun one(*backends[0]), spec(*backends[1]), unrolled(*backends[2]);
    for (SeqRun* r : {&one, &spec, &unrolled})
      kept == 1 ? r->step(prompt, 0) : r->step(last_block_tokens, kP / 16 * 16);
    // One-token steps over the kept rows' inputs.
    std::vector<std::vector<float>> expected;
    for (int32_t i = 0; i < kept; ++i) expected.push_back(one.step({rows[i]}, kP + i));
    const std::vector<float> verified = spec.step(rows, kP, true);
    unrolled.step(rows, kP, true);
    ASSERT_EQ(verified.size(), rows.size() * static_cast<size_t>(V));
    for (int32_t i = 0; i < kept; ++i)
      EXPECT_TRUE(same_bits(verified.data() + i * V, expected[i].data(), V)) << "row " << i;
    spec.backend->rollback_kv(0, kept);
    const int32_t last_block = (kP + kept - 1) / 16;
    EXPECT_EQ(spec.running(last_block), one.running(last_block));
    // The next token decodes through SparQ (its step 1 weighs by the K moments, its mean V is the
    // V sum): bitwise the one-token steps' after the rollback, not without it.
    SeqPolicyState s1, s2, s3;
    const AttentionPolicy* p = &sparq;
    const std::vector<float> a = one.step({rows[kept]}, kP + kept, false, p, &s1);
    const std::vector<float> b = spec.step({rows[kept]}, kP + kept, false, p, &s2);
    const std::vector<float> c = unrolled.step({rows[kept]}, kP + kept, false, p, &s3);
    EXPECT_TRUE(same_bits(a.data(), b.data(), V));
    // (A rejected row in the kept row's block: a block opened by the next token starts from the
    // block before it, which the rejected rows did not touch.)
    if ((kP + kept) % 16 != 0) {
      EXPECT_FALSE(same_bits(a.data(), c.data(), V)) << "rejected rows left in the running planes change nothing?";
    }
  }
}

// A sparse drafting round (Speculator, Speculation::kSparse): draft steps through SparQ append K/V
// at the drafts' positions and change the running planes of the block they write; the round's
// first step keeps those planes (Backend::read_running), the verify step puts them back
// (write_running) before writing every drafted position again. Its rows are then bitwise the
// one-token dense steps', and so are the running planes and a later SparQ step, which without
// the put-back they are not.
TEST(SparseRound, LeavesWhatOneTokenStepsLeave) {
  const auto model = Model::load(kModel);
  const int32_t V = model->vocab();
  std::string text;
  for (int i = 0; i < 40; ++i) text += "The lighthouse keeper climbed the stairs every evening and trimmed the wick. ";
  std::vector<int32_t> prompt = model->tokenizer().encode(text);
  prompt.resize(kP);
  const std::vector<int32_t> own = {411, 2137, 260, 30};  // the last token, two kept drafts, the next token
  const std::vector<int32_t> drafted = {411, 1035, 7213};  // what the draft steps computed (wrong drafts)
  AttentionPolicy sparq = AttentionPolicy::named("sparq", 0.25);
  sparq.min_keys = 0;
  std::unique_ptr<Backend> backends[3];
  for (auto& b : backends) {
    ModelOptions o;
    o.threads = 2;
    o.kv_dtype = KvDtype::kF16;
    o.kv_cache_bytes = 16 << 20;
    b = make_backend(*model, o);
  }
  SeqRun one(*backends[0]), round(*backends[1]), unrestored(*backends[2]);
  std::vector<std::vector<float>> expected;  // (f16 KV; the rollback test above covers INT8's planes too)
  one.step(prompt, 0);
  for (int32_t i = 0; i < 3; ++i) expected.push_back(one.step({own[i]}, kP + i));
  const int32_t block = kP / 16, slot = round.table.blocks()[block];
  std::vector<float> kept;
  for (SeqRun* r : {&round, &unrestored}) {
    r->step(prompt, 0);
    if (r == &round) r->backend->read_running(slot, kept);
    SeqPolicyState draft_state;
    for (int32_t i = 0; i < 3; ++i) r->step({drafted[i]}, kP + i, false, &sparq, &draft_state);
    if (r == &round) r->backend->write_running(slot, kept);
  }
  const std::vector<float> verified = round.step({own[0], own[1], own[2]}, kP, true);
  unrestored.step({own[0], own[1], own[2]}, kP, true);
  for (int32_t i = 0; i < 3; ++i) EXPECT_TRUE(same_bits(verified.data() + i * V, expected[i].data(), V)) << "row " << i;
  EXPECT_EQ(round.running(block), one.running(block));
  EXPECT_NE(unrestored.running(block), one.running(block));
  SeqPolicyState s1, s2, s3;
  const std::vector<float> a = one.step({own[3]}, kP + 3, false, &sparq, &s1);
  const std::vector<float> b = round.step({own[3]}, kP + 3, false, &sparq, &s2);
  const std::vector<float> c = unrestored.step({own[3]}, kP + 3, false, &sparq, &s3);
  EXPECT_TRUE(same_bits(a.data(), b.data(), V));
  EXPECT_FALSE(same_bits(a.data(), c.data(), V)) << "the draft steps' running planes change nothing?";
}

INSTANTIATE_TEST_SUITE_P(KvDtypes, VerifyStep, ::testing::Values(KvDtype::kF16, KvDtype::kI8),
                         [](const ::testing::TestParamInfo<KvDtype>& i) { return i.param == KvDtype::kF16 ? "f16" : "int8"; });

}  // namespace
}  // namespace fathom
