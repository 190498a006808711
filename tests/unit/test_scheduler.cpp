// The scheduler's plan -> run -> update step and its error boundary, driven synchronously over a
// fake backend (no model compute: logits are a function of each row's position), with the real
// SmolLM2 tokenizer for detokenization. Fast: no forward pass runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "base/error.h"
#include "base/failpoints.h"
#include "engine/backend/backend.h"
#include "engine/engine.h"
#include "engine/model/model.h"
#include "engine/scheduler.h"
#include "engine/sequence.h"
#include "tests/unit/fake_backend.h"

namespace fathom {
namespace {

const std::string kModel = std::string(FATHOM_MODELS_DIR) + "/smollm2-135m-instruct-q4_1.gguf";

struct Harness {
  std::unique_ptr<Model> model = Model::load(kModel);
  FakeBackend backend;
  MetricsRegistry metrics;
  Scheduler scheduler;
  uint64_t order = 0;

  explicit Harness(int32_t blocks = 64, SchedulerConfig config = {}, int32_t host_blocks = 0, int32_t scratch = 0)
      : backend(*model, blocks, host_blocks, 16, scratch), scheduler(*model, backend, config, metrics) {}

  std::shared_ptr<RequestHandle> add(int32_t prompt_tokens, int32_t max_tokens, int32_t n = 1,
                                     Pooling embedding = Pooling::kNone, ThinkingSpan thinking = {},
                                     Speculation speculative = Speculation::kOff, std::vector<int32_t> tail = {}) {
    auto r = std::make_unique<RequestState>();
    r->request.speculative = speculative;
    r->request.thinking = thinking;
    r->request.prompt.assign(prompt_tokens, 300);
    std::copy(tail.begin(), tail.end(), r->request.prompt.end() - static_cast<std::ptrdiff_t>(tail.size()));
    r->request.max_tokens = max_tokens;
    r->request.embedding = embedding;
    r->request.n = n;
    r->request.sampling.temperature = 0;
    r->handle = std::make_shared<RequestHandle>("r" + std::to_string(order), n);
    r->order = order++;
    r->arrival = Clock::now();
    auto h = r->handle;
    scheduler.add(std::move(r));
    return h;
  }
  void run(int max_steps = 1000) {
    for (int i = 0; i < max_steps && scheduler.has_work(); ++i) scheduler.step();
    ASSERT_FALSE(scheduler.has_work()) << "the scheduler did not finish within " << max_steps << " steps";
  }
};

struct Outcome {
  std::vector<int32_t> tokens;
  FinishReason finish = FinishReason::kNone;
  std::string error;
  std::vector<float> embedding;
  int events = 0;
};

Outcome drain(RequestHandle& h) {
  Outcome o;
  StreamEvent ev;
  while (h.next(ev, std::chrono::milliseconds(0))) {
    ++o.events;
    o.tokens.insert(o.tokens.end(), ev.token_ids.begin(), ev.token_ids.end());
    if (!ev.embedding.empty()) o.embedding = ev.embedding;
    if (ev.finish != FinishReason::kNone) {
      o.finish = ev.finish;
      o.error = ev.error;
    }
  }
  return o;
}

TEST(Scheduler, RunsRequestsToTheirLengthAndFreesEveryBlock) {
  Harness h;
  auto a = h.add(40, 5), b = h.add(3, 9, 3);
  h.run();
  const Outcome oa = drain(*a);
  EXPECT_EQ(oa.finish, FinishReason::kLength);
  ASSERT_EQ(oa.tokens.size(), 5u);
  EXPECT_EQ(oa.tokens[0], 100 + 39 % 50) << "the logits of the prompt's last position";
  EXPECT_EQ(drain(*b).tokens.size(), 27u) << "3 choices of 9 tokens";
  // Only the prefix cache still holds blocks; it gives them back when evicted.
  EXPECT_EQ(h.scheduler.allocator().used_blocks(),
            h.metrics.gauge("fathom_kv_blocks_used", "", {{"tier", "device"}}).value());
}

// Embedding requests prefill (in chunks, beside generation) and end with one event carrying the
// pooled final hidden state. The fake backend's hidden state of a row is its position in every
// dimension: mean pooling over n positions gives (n - 1) / 2, CLS 0, last n - 1.
TEST(Scheduler, EmbeddingsPoolTheirPromptsHiddenStatesAcrossChunks) {
  SchedulerConfig config;
  config.max_batched_tokens = 64;  // 1000-token prompts take many chunks
  Harness h(256, config);
  auto gen = h.add(30, 4);
  auto mean = h.add(1000, 0, 1, Pooling::kMean), cls = h.add(1000, 0, 1, Pooling::kCls),
       last = h.add(1000, 0, 1, Pooling::kLast), one = h.add(1, 0, 1, Pooling::kMean);
  h.run();
  const int32_t dim = h.model->config().dim;
  const struct {
    std::shared_ptr<RequestHandle>& handle;
    float want;
  } cases[] = {{mean, 999.0f / 2}, {cls, 0.0f}, {last, 999.0f}, {one, 0.0f}};
  for (const auto& c : cases) {
    const Outcome o = drain(*c.handle);
    EXPECT_EQ(o.finish, FinishReason::kStop);
    EXPECT_EQ(o.events, 1) << "one event: the result";
    EXPECT_TRUE(o.tokens.empty()) << "nothing is generated";
    ASSERT_EQ(static_cast<int32_t>(o.embedding.size()), dim);
    EXPECT_FLOAT_EQ(o.embedding[0], c.want);
    EXPECT_FLOAT_EQ(o.embedding[dim - 1], c.want);
  }
  EXPECT_EQ(drain(*gen).tokens.size(), 4u) << "generation beside them is unaffected";
  EXPECT_EQ(mean->usage().prompt_tokens, 1000);
  EXPECT_EQ(mean->usage().completion_tokens, 0);
}

// An embedding preempted in the middle of its prefill (a generating sequence needed its blocks)
// pools its positions again from the start when it comes back: the mean is not counted twice.
TEST(Scheduler, APreemptedEmbeddingPoolsAgainFromTheStart) {
  SchedulerConfig config;
  config.max_batched_tokens = 16;  // the 1000-token prefill takes ~63 steps
  config.recompute = SchedulerConfig::Recompute::kOff;
  Harness h(66, config);  // 66 blocks of 16: 30 + 1000 tokens fit, the generation's growth does not
  auto gen = h.add(30, 100);
  auto mean = h.add(1000, 0, 1, Pooling::kMean);
  h.run();
  EXPECT_GE(h.metrics.counter("fathom_preemptions_total", "", {{"mode", "recompute"}}).value(), 1.0);
  const Outcome o = drain(*mean);
  EXPECT_EQ(o.finish, FinishReason::kStop);
  ASSERT_FALSE(o.embedding.empty());
  EXPECT_FLOAT_EQ(o.embedding[0], 999.0f / 2);
  EXPECT_EQ(drain(*gen).tokens.size(), 100u);
}

// Reasoning tokens: those from an opening <think> (or from the start, when the prompt left it open)
// through </think>. The fake backend's greedy token at position p is 100 + p % 50: a 30-token
// prompt's output is 129, 130, 131, ...
TEST(Scheduler, ReasoningTokensAreTheThinkingSpansOwn) {
  Harness h;
  auto opened = h.add(30, 8, 1, Pooling::kNone, ThinkingSpan{129, 133, false, {}, {}});   // 129..133 think
  auto open = h.add(30, 8, 1, Pooling::kNone, ThinkingSpan{-1, 131, true, {}, {}});       // 129..131 think
  auto never = h.add(30, 8, 1, Pooling::kNone, ThinkingSpan{999, 131, false, {}, {}});    // no opening token
  auto unclosed = h.add(30, 8, 2, Pooling::kNone, ThinkingSpan{-1, 999, true, {}, {}});   // all 8, both choices
  h.run();
  EXPECT_EQ(opened->usage().reasoning_tokens, 5);
  EXPECT_EQ(open->usage().reasoning_tokens, 3);
  EXPECT_EQ(never->usage().reasoning_tokens, 0);
  EXPECT_EQ(unclosed->usage().reasoning_tokens, 16);
  EXPECT_EQ(unclosed->usage().completion_tokens, 16);
}

// A short prompt behind a long one is not starved: prefill chunks share the step's budget
// (water-filling), so it gets its first token in the first step; alone, a long prompt takes the
// whole budget per step, in chunks that shrink as attention over earlier positions costs more.
TEST(Scheduler, AShortPromptBehindALongOneStartsInTheFirstStep) {
  Harness h(256);
  auto long_one = h.add(2000, 2), short_one = h.add(10, 2);
  h.scheduler.step();
  EXPECT_EQ(drain(*short_one).tokens.size(), 1u) << "the short prompt waited for the long prefill";
  EXPECT_TRUE(drain(*long_one).tokens.empty());
  h.run();
  EXPECT_EQ(drain(*long_one).tokens.size(), 2u);

  Harness alone(256);
  auto solo = alone.add(2000, 1);
  int steps = 0;
  while (alone.scheduler.has_work()) {
    alone.scheduler.step();
    ++steps;
  }
  // SmolLM2: E = 3072 positions (test_prefill_budget). Chunk k starting at p costs
  // 1 + (p + 256) / 3072 per token: 472 at 0, 413 at 472, 373 at 885, 342 at 1258, 319 at 1600,
  // then the last 81 — six steps (four if cost were flat).
  EXPECT_EQ(steps, 6) << "2000 prompt tokens in cost-budgeted chunks";
  EXPECT_EQ(drain(*solo).tokens.size(), 1u);
}

TEST(Scheduler, AForwardFailureFailsTheRequestsInTheStepAndNothingElse) {
  SchedulerConfig cfg;
  cfg.prefix_caching = false;
  Harness h(64, cfg);
  auto a = h.add(20, 6), b = h.add(20, 6);
  h.scheduler.step();  // both prefill in one step
  h.backend.fail = [](const BatchPlan& p) { return p.seqs.size() == 2; };  // the next joint step fails
  h.scheduler.step();
  h.backend.fail = nullptr;
  auto c = h.add(10, 4);
  h.run();
  for (auto* handle : {a.get(), b.get()}) {
    const Outcome o = drain(*handle);
    EXPECT_EQ(o.finish, FinishReason::kError);
    EXPECT_NE(o.error.find("injected device failure"), std::string::npos) << o.error;
    EXPECT_EQ(o.tokens.size(), 1u) << "the token sampled before the failing step was delivered";
  }
  const Outcome oc = drain(*c);
  EXPECT_EQ(oc.finish, FinishReason::kLength);
  EXPECT_EQ(oc.tokens.size(), 4u);
  EXPECT_EQ(h.scheduler.allocator().used_blocks(), 0) << "the failed requests' blocks came back";
  EXPECT_EQ(h.metrics.counter("fathom_request_finished_total", "", {{"reason", "error"}}).value(), 2.0);
}

TEST(Scheduler, FailpointsInAllocationAndDetokenizationFailOneRequestEach) {
  SchedulerConfig cfg;
  cfg.prefix_caching = false;
  Harness h(64, cfg);
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (int i = 0; i < 6; ++i) handles.push_back(h.add(30 + i, 20));
  failpoints::configure("kv_alloc:throw@5,detokenize:throw@23");
  h.run();
  failpoints::configure("");
  int errors = 0, complete = 0;
  for (auto& handle : handles) {
    const Outcome o = drain(*handle);
    if (o.finish == FinishReason::kError) {
      ++errors;
      EXPECT_NE(o.error.find("failpoint"), std::string::npos) << o.error;
    } else {
      EXPECT_EQ(o.finish, FinishReason::kLength);
      EXPECT_EQ(o.tokens.size(), 20u);
      ++complete;
    }
  }
  EXPECT_GE(errors, 2) << "at least one allocation and one detokenization failed";
  EXPECT_GE(complete, 1);
  EXPECT_EQ(h.scheduler.allocator().used_blocks(), 0);
}

// Host tier (docs/tiered_kv.md): two sequences of 5 blocks each over 8 device blocks and 8 host
// blocks. Neither is preempted; blocks the steps write move into the device tier, demoting others.
SchedulerConfig small_steps() {
  SchedulerConfig cfg;
  cfg.prefix_caching = false;
  cfg.max_batched_tokens = 32;  // a step writes at most 2 + 2·2 blocks: the device tier holds them
  cfg.max_num_seqs = 2;
  cfg.host_kv_bytes = 64 * 8;   // FakeBackend blocks are 64 bytes
  return cfg;
}

TEST(Scheduler, SequencesLargerThanTheDeviceTierRunFromBothTiers) {
  Harness h(8, small_steps(), 8);
  ASSERT_EQ(h.scheduler.allocator().host_blocks(), 8);
  auto a = h.add(40, 30), b = h.add(40, 30);
  h.run();
  for (auto* handle : {a.get(), b.get()}) {
    const Outcome o = drain(*handle);
    ASSERT_EQ(o.finish, FinishReason::kLength) << o.error;
    ASSERT_EQ(o.tokens.size(), 30u);
    for (size_t i = 0; i < o.tokens.size(); ++i) EXPECT_EQ(o.tokens[i], 100 + static_cast<int32_t>(39 + i) % 50);  // logits of position 39 + i
  }
  EXPECT_EQ(h.metrics.counter("fathom_preemptions_total", "", {{"mode", "recompute"}}).value(), 0);
  EXPECT_GT(h.metrics.counter("fathom_kv_blocks_demoted_total", "").value(), 0);
  EXPECT_GT(h.metrics.counter("fathom_swap_bytes_total", "", {{"direction", "out"}}).value(), 0);
  EXPECT_EQ(h.scheduler.allocator().used_blocks(), 0);
}

// Speculative decoding over both tiers and beside plain requests: the fake's logits give token
// 100 + position % 50 whatever the input, so prompt lookup's drafts are kept once the output has
// gone round its 50-token cycle, and rejected where the prompt continues "121 122" otherwise. Every sequence's
// output is what plain decoding gives, verify steps roll back exactly the rows not kept (each step
// a sequence verifies keeps at least its first row), and every block comes back.
TEST(Scheduler, SpeculatingSequencesEmitThePlainOutputAndGiveEveryBlockBack) {
  SchedulerConfig cfg = small_steps();
  cfg.prefix_caching = true;
  Harness h(8, cfg, 8);
  h.backend.rollback = true;
  int verify_steps = 0, verify_rows = 0;
  h.backend.fail = [&](const BatchPlan& p) {
    for (const SeqStep& s : p.seqs)
      if (s.verify) {
        ++verify_steps;
        verify_rows += static_cast<int>(s.tokens.size());
        EXPECT_EQ(s.logits, LogitsWanted::kAll);
        EXPECT_GE(s.tokens.size(), 2u);
        EXPECT_LE(s.tokens.size(), 5u) << "1 + max_draft_tokens";
      }
    return false;
  };
  auto a = h.add(40, 120, 1, Pooling::kNone, {}, Speculation::kNgram), b = h.add(40, 30),
       c = h.add(20, 100, 1, Pooling::kNone, {}, Speculation::kNgram, {121, 122, 7, 8, 9});
  h.run();
  const Outcome oa = drain(*a), ob = drain(*b), oc = drain(*c);
  for (const auto& [o, prompt, n] : {std::tuple{&oa, 40, 120}, std::tuple{&ob, 40, 30}, std::tuple{&oc, 20, 100}}) {
    ASSERT_EQ(o->finish, FinishReason::kLength) << o->error;
    ASSERT_EQ(o->tokens.size(), static_cast<size_t>(n));
    for (size_t i = 0; i < o->tokens.size(); ++i) EXPECT_EQ(o->tokens[i], 100 + static_cast<int32_t>(prompt - 1 + i) % 50);
  }
  const double drafted = h.metrics.counter("fathom_spec_decode_draft_tokens_total", "", {{"drafter", "ngram"}}).value();
  const double kept = h.metrics.counter("fathom_spec_decode_accepted_tokens_total", "", {{"drafter", "ngram"}}).value();
  const double verifies = h.metrics.counter("fathom_spec_decode_verify_steps_total", "", {{"drafter", "ngram"}}).value();
  EXPECT_EQ(verifies, verify_steps);
  EXPECT_EQ(drafted, verify_rows - verify_steps);
  EXPECT_GT(kept, 60) << "the second round of the cycle is drafted and kept";
  EXPECT_LT(kept, drafted) << "\"121 122\" drafts the prompt's 7 8 9, rejected";
  // A rollback for every verify step that dropped rows (none for a step that kept every row or
  // ended its sequence), never of the first row.
  EXPECT_GT(h.backend.rollbacks.size(), 0u);
  for (const auto& [seq, kept_rows] : h.backend.rollbacks) EXPECT_GE(kept_rows, 1);
  EXPECT_EQ(h.scheduler.allocator().used_blocks(),
            h.metrics.gauge("fathom_kv_blocks_used", "", {{"tier", "device"}}).value() +
                h.metrics.gauge("fathom_kv_blocks_used", "", {{"tier", "host"}}).value());
  h.scheduler.cancel_all();
}

// Cache-or-recompute: a sequence larger than both tiers (22 blocks; 16 + 4 hold 20) runs alone, so it
// drops its own oldest blocks (preempting itself would not help), and each of its steps carries a
// recompute of them — positions [0, dropped) whose table names the same scratch entries as its
// decode step's. A failure in such a step fails that request only and every block comes back;
// the next request runs.
TEST(Scheduler, RecomputeStepsCarryTheDroppedPrefixAndAFailureFreesEverything) {
  SchedulerConfig cfg = small_steps();
  cfg.max_batched_tokens = 128;  // a scratch of 64 tokens
  cfg.host_kv_bytes = 64 * 4;
  Harness h(16, cfg, 4, /*scratch=*/4);
  ASSERT_EQ(h.scheduler.recompute_model().capacity_tokens, 64);
  int recompute_steps = 0;
  int32_t most_dropped = 0;
  h.backend.fail = [&](const BatchPlan& p) {
    if (p.seqs.size() != 2 || p.seqs[1].pos0 != 0 || p.seqs[1].logits != LogitsWanted::kNone) return false;
    const SeqStep &decode = p.seqs[0], &recompute = p.seqs[1];
    EXPECT_EQ(decode.tokens.size(), 1u);
    EXPECT_EQ(recompute.tokens.size() % 16, 0u);
    const int32_t dropped = static_cast<int32_t>(recompute.tokens.size()) / 16;
    most_dropped = std::max(most_dropped, dropped);
    for (int32_t b = 0; b < dropped; ++b) {
      EXPECT_EQ((*decode.blocks)[b], (*recompute.blocks)[b]);
      EXPECT_GE((*decode.blocks)[b], h.backend.kv_blocks()) << "a scratch entry";
    }
    return ++recompute_steps == 20;  // the 20th such step fails
  };
  auto a = h.add(200, 150);
  h.run();
  const Outcome oa = drain(*a);
  EXPECT_EQ(oa.finish, FinishReason::kError);
  EXPECT_NE(oa.error.find("injected device failure"), std::string::npos) << oa.error;
  EXPECT_EQ(recompute_steps, 20);
  EXPECT_GE(most_dropped, 1);
  EXPECT_EQ(h.metrics.counter("fathom_preemptions_total", "", {{"mode", "recompute"}}).value(), 0);
  EXPECT_EQ(h.scheduler.allocator().used_blocks(), 0) << "every block came back";
  EXPECT_EQ(h.metrics.gauge("fathom_kv_dropped_tokens", "").value(), 0);
  h.backend.fail = nullptr;
  auto b = h.add(200, 150);
  h.run();
  const Outcome ob = drain(*b);
  ASSERT_EQ(ob.finish, FinishReason::kLength) << ob.error;
  EXPECT_EQ(ob.tokens.size(), 150u);
  for (size_t i = 0; i < ob.tokens.size(); ++i) EXPECT_EQ(ob.tokens[i], 100 + static_cast<int32_t>(199 + i) % 50);
  // 350 tokens need 22 blocks, the tiers hold 20: the second request dropped 2.
  EXPECT_EQ(h.metrics.counter("fathom_kv_blocks_dropped_total", "").value(), most_dropped + 2);
}

TEST(Scheduler, ADeviceTierSmallerThanOneStepGetsSmallerSteps) {
  SchedulerConfig cfg = small_steps();
  cfg.max_batched_tokens = 512;  // 32 blocks of writes, the device tier holds 8
  Harness h(8, cfg, 8);
  const SchedulerConfig& used = h.scheduler.config();
  EXPECT_EQ(used.max_num_seqs, 1);  // 8 / 6
  EXPECT_EQ(used.max_batched_tokens, (8 - 2 * 1) * 16);
  auto a = h.add(40, 30), b = h.add(40, 30);
  h.run();
  EXPECT_EQ(drain(*a).finish, FinishReason::kLength);
  EXPECT_EQ(drain(*b).finish, FinishReason::kLength);
}

TEST(Scheduler, ATierMoveFailureFailsItsStepOnly) {
  Harness h(8, small_steps(), 8);
  auto a = h.add(40, 30), b = h.add(40, 30);
  failpoints::configure("kv_copy:throw@1");
  h.run();
  failpoints::configure("");
  const Outcome oa = drain(*a), ob = drain(*b);
  int failed = 0;
  for (const Outcome* o : {&oa, &ob}) {
    if (o->finish == FinishReason::kError) {
      ++failed;
      EXPECT_NE(o->error.find("failpoint kv_copy"), std::string::npos) << o->error;
    } else {
      EXPECT_EQ(o->finish, FinishReason::kLength);
    }
  }
  EXPECT_GE(failed, 1);
  EXPECT_EQ(h.scheduler.allocator().used_blocks(), 0);
  auto c = h.add(40, 30);  // the scheduler keeps serving
  h.run();
  EXPECT_EQ(drain(*c).finish, FinishReason::kLength);
}

TEST(Engine, RejectsAPolicyTheBackendDoesNotImplement) {
  std::unique_ptr<Model> model = Model::load(kModel);
  FakeBackend backend(*model, 16);
  MetricsRegistry metrics;
  Engine engine(*model, backend, SchedulerConfig{}, metrics);
  Request r;
  r.prompt = {1, 2, 3};
  r.max_tokens = 2;
  r.attention.kind = policy_kind("sparq");
  try {
    engine.submit(r);
    FAIL() << "sparq on a dense-only backend was accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "attention policy 'sparq' is not implemented by the fake backend (available: dense)");
  }
  r.attention.kind = kDensePolicy;
  EXPECT_NO_THROW(engine.submit(r));
}

TEST(Failpoints, ParseAndFireEveryNthHit) {
  failpoints::configure("forward:throw@3, kv_alloc:throw");
  EXPECT_EQ(failpoints::describe(), "forward:throw@3,kv_alloc:throw@1");
  int thrown = 0;
  for (int i = 0; i < 9; ++i) {
    try {
      failpoints::hit("forward");
    } catch (const Error&) {
      ++thrown;
    }
  }
  EXPECT_EQ(thrown, 3);
  EXPECT_THROW(failpoints::hit("kv_alloc"), Error);
  EXPECT_NO_THROW(failpoints::hit("detokenize"));
  for (const char* bad : {"forward", "x:throw", "forward:boom", "forward:throw@0", "forward:throw@-1", "forward:throw@",
                          "forward:throw,forward:throw@2", "forward:throw@99999999999999999999"})
    EXPECT_THROW(failpoints::configure(bad), Error) << bad;
  failpoints::configure("");
  EXPECT_EQ(failpoints::describe(), "");
  EXPECT_NO_THROW(failpoints::hit("kv_alloc"));
}

}  // namespace
}  // namespace fathom

namespace fathom {
namespace {

// A request that could never finish (its KV, run alone, exceeds the whole cache) is refused at
// submission; one that just fits finishes even while another request competes for the blocks.
TEST(Engine, RefusesARequestLargerThanTheCacheAndFinishesOneThatFits) {
  std::unique_ptr<Model> model = Model::load(kModel);
  FakeBackend backend(*model, 8);  // 8 blocks of 16 tokens = 128 token slots
  MetricsRegistry metrics;
  SchedulerConfig cfg;
  cfg.prefix_caching = false;
  Engine engine(*model, backend, cfg, metrics);
  Request big;
  big.prompt.assign(40, 300);
  big.max_tokens = 100;  // 140 tokens: 9 blocks
  try {
    engine.submit(big);
    FAIL() << "a request larger than the cache was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs up to 9 KV cache blocks"), std::string::npos) << e.what();
  }
  Request forks = big;
  forks.max_tokens = 20;
  forks.n = 4;  // 4 blocks for the prompt + 20 tokens, then 3 × 3 more
  EXPECT_THROW(engine.submit(forks), Error);

  Request fits = big;
  fits.max_tokens = 88;  // 128 tokens: all 8 blocks
  fits.stop.ignore_eos = true;
  Request other = fits;
  other.max_tokens = 40;
  auto a = engine.submit(fits);
  auto b = engine.submit(other);
  for (auto* h : {a.get(), b.get()}) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    StreamEvent ev;
    while (!h->done() && std::chrono::steady_clock::now() < deadline) h->next(ev, std::chrono::milliseconds(50));
    ASSERT_TRUE(h->done()) << "a request that fits the cache alone never finished";
  }
  EXPECT_EQ(a->usage().completion_tokens, 88);
  EXPECT_EQ(b->usage().completion_tokens, 40);
}

}  // namespace
}  // namespace fathom
