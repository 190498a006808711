// The Scheduler's two parts alone, over the fake backend (tests/unit/fake_backend.h) and the real
// SmolLM2 tokenizer: KvPlacement (blocks: forks, tiers, cache-or-recompute) and OutputProcessor
// (tokens into events: stops, forks, failures). test_scheduler drives them together.
#include <gtest/gtest.h>

#include <chrono>
#include <climits>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine_metrics.h"
#include "engine/kv_placement.h"
#include "engine/model/model.h"
#include "engine/output_processor.h"
#include "engine/sequence.h"
#include "tests/unit/fake_backend.h"

namespace fathom {
namespace {

const std::string kModel = std::string(FATHOM_MODELS_DIR) + "/smollm2-135m-instruct-q4_1.gguf";
constexpr int32_t kBlock = 16;

struct Parts {
  static inline std::unique_ptr<Model> model;
  FakeBackend backend;
  MetricsRegistry registry;
  EngineMetrics metrics{registry};
  SchedulerConfig config;
  std::unique_ptr<KvPlacement> kv;
  std::unique_ptr<OutputProcessor> out;
  std::vector<std::unique_ptr<RequestState>> requests;

  Parts(int32_t device, int32_t host = 0, int32_t scratch = 0, SchedulerConfig c = {})
      : backend(*loaded(), device, host, kBlock, scratch), config(c) {
    if (host > 0) config.host_kv_bytes = static_cast<int64_t>(host) * 64;  // FakeBackend blocks are 64 bytes
    kv = std::make_unique<KvPlacement>(*model, backend, config, metrics);
    out = std::make_unique<OutputProcessor>(*model, backend, *kv, metrics);
  }
  static Model* loaded() {
    if (!model) model = Model::load(kModel);
    return model.get();
  }
  // A request whose first choice has its prompt computed into blocks (running, about to sample).
  Sequence& running(std::vector<int32_t> prompt, int32_t max_tokens = 8, int32_t n = 1, std::vector<std::string> stops = {}) {
    auto r = std::make_unique<RequestState>();
    r->request.prompt = std::move(prompt);
    r->request.max_tokens = max_tokens;
    r->request.n = n;
    r->request.sampling.temperature = 0;
    r->request.stop.strings = std::move(stops);
    r->handle = std::make_shared<RequestHandle>("r", n);
    r->arrival = r->admitted = Clock::now();
    out->start(*r);
    Sequence& s = *r->seqs[0];
    EXPECT_TRUE(kv->ensure_room(s, static_cast<int32_t>(s.tokens.size())));
    kv->computed(s, static_cast<int32_t>(s.tokens.size()), false);
    s.state = SeqState::kRunning;
    requests.push_back(std::move(r));
    return s;
  }
  std::vector<Sequence*> all() {
    std::vector<Sequence*> seqs;
    for (auto& r : requests)
      for (auto& s : r->seqs) seqs.push_back(s.get());
    return seqs;
  }
};

std::vector<StreamEvent> events(RequestHandle& h) {
  std::vector<StreamEvent> all;
  StreamEvent ev;
  while (h.next(ev, std::chrono::milliseconds(0))) all.push_back(ev);
  return all;
}

OutputProcessor::Draw drawn(int32_t token) {
  OutputProcessor::Draw d;
  d.drawn = true;
  d.token.id = token;
  return d;
}

TEST(KvPlacement, AForkSharesFullBlocksCopiesThePartialOneAndReleasesToZero) {
  SchedulerConfig c;
  c.prefix_caching = false;
  Parts p(16, 0, 0, c);
  Sequence& parent = p.running(std::vector<int32_t>(40, 300));  // 2 full blocks + 8 tokens
  Sequence child;
  child.request = parent.request;
  child.tokens = parent.tokens;
  p.kv->fork(parent, child);
  ASSERT_EQ(child.blocks.size(), 3u);
  EXPECT_EQ(child.blocks[0], parent.blocks[0]);
  EXPECT_EQ(child.blocks[1], parent.blocks[1]);
  EXPECT_NE(child.blocks[2], parent.blocks[2]) << "the partial block is copied, not shared";
  EXPECT_EQ(p.kv->allocator().ref_count(parent.blocks[0]), 2);
  EXPECT_EQ(p.backend.slot_copies, 1);
  EXPECT_EQ(child.n_computed, 40);
  EXPECT_EQ(p.kv->allocator().used_blocks(), 4);
  p.kv->release_blocks(child);
  p.kv->release_blocks(parent);
  EXPECT_EQ(p.kv->allocator().used_blocks(), 0);
}

TEST(KvPlacement, AStepsBlocksBecomeDeviceResidentByDemotingTheOldest) {
  Parts p(4, 8);  // 4 device blocks, 8 host blocks
  Sequence& a = p.running(std::vector<int32_t>(64, 300));  // 4 blocks, written first
  Sequence& b = p.running(std::vector<int32_t>(48, 301));  // 3 blocks: some land in the host tier
  ASSERT_EQ(p.kv->allocator().used_slots(KvTier::kHost), 3);
  b.tokens.push_back(5);  // b decodes one token: position 48 opens its fourth block
  ASSERT_TRUE(p.kv->ensure_room(b, 49));  // as the scheduler does before planning the step
  BatchPlan plan;
  plan.seqs.push_back(SeqStep{std::span<const int32_t>(b.tokens).subspan(48, 1), 48, &b.blocks, LogitsWanted::kLast});
  p.kv->begin_plan();
  p.kv->make_resident(plan, {&b}, {1});
  // Position 48 opens block 3 and reads block 2's running sums: both must be device slots.
  EXPECT_GE((*plan.seqs[0].blocks)[2], 0);
  EXPECT_GE((*plan.seqs[0].blocks)[3], 0);
  EXPECT_GE(p.registry.counter("fathom_kv_blocks_demoted_total", "").value(), 1.0);
  EXPECT_EQ(p.kv->allocator().used_blocks(), static_cast<int32_t>(a.blocks.size() + b.blocks.size()));
}

TEST(KvPlacement, ADroppedBlockIsRecomputedAndRestoredWhenRoomComesBack) {
  Parts p(16, 8, /*scratch=*/4);
  ASSERT_GT(p.kv->recompute_model().capacity_tokens, 0) << "the fake backend measured a recompute model";
  Sequence& s = p.running(std::vector<int32_t>(64, 300), /*max_tokens=*/16);
  s.tokens.push_back(7);  // decoding: one token pending
  const std::vector<Sequence*> seqs = p.all();
  const int32_t available = p.kv->available_blocks();
  ASSERT_TRUE(p.kv->drop_oldest_block(seqs, false, INT64_MAX));
  EXPECT_EQ(s.blocks[0], kDroppedBlock);
  EXPECT_EQ(s.dropped_blocks, 1);
  EXPECT_EQ(p.kv->dropped_tokens(), kBlock);
  EXPECT_EQ(p.kv->available_blocks(), available + 1) << "only the prefix cache holds it now: evictable";
  p.kv->restore_dropped(seqs);  // plenty of room now
  EXPECT_TRUE(s.restoring);
  EXPECT_GE(s.blocks[0], 0);
  p.kv->computed(s, 1, /*decoded=*/true);  // the step that recomputed it ran
  EXPECT_EQ(s.dropped_blocks, 0);
  EXPECT_FALSE(s.restoring);
  EXPECT_EQ(p.kv->dropped_tokens(), 0);
  EXPECT_EQ(p.registry.counter("fathom_kv_blocks_restored_total", "").value(), 1.0);
}

TEST(KvPlacement, APreemptedSequenceWaitsAndFindsItsFullBlocksInThePrefixCache) {
  Parts p(8);
  Sequence& s = p.running(std::vector<int32_t>(40, 300));  // 2 full blocks and a partial one
  ASSERT_EQ(s.blocks.size(), 3u);
  p.kv->preempt(s);
  EXPECT_EQ(s.state, SeqState::kWaiting);
  EXPECT_TRUE(s.blocks.empty());
  EXPECT_EQ(s.n_computed, 0);
  EXPECT_EQ(s.dropped, 40) << "the positions its next prefill computes again";
  EXPECT_EQ(p.kv->available_blocks(), 8) << "the full blocks stay only as evictable prefix cache";
  EXPECT_EQ(p.registry.counter("fathom_preemptions_total", "", {{"mode", "recompute"}}).value(), 1.0);
  p.kv->match_prefix(s, /*use_cache=*/true);
  EXPECT_EQ(s.n_computed, 2 * kBlock) << "readmitted, it starts from its cached full blocks";
}

TEST(OutputProcessor, AStopStringEndsTheChoiceHoldsItsTextBackAndFreesItsBlocks) {
  SchedulerConfig c;
  c.prefix_caching = false;
  Parts p(16, 0, 0, c);
  const Tokenizer& tok = p.model->tokenizer();
  const std::vector<int32_t> text = tok.encode("Hello there, world");
  Sequence& s = p.running(tok.encode("Say it"), 32, 1, {"there"});
  for (int32_t id : text) {
    if (s.state == SeqState::kFinished) break;
    p.out->hand_over(s, drawn(id), nullptr);
  }
  std::string seen;
  FinishReason finish = FinishReason::kNone;
  for (const StreamEvent& ev : events(*s.request->handle)) {
    seen += ev.text;
    if (ev.finish != FinishReason::kNone) finish = ev.finish;
  }
  EXPECT_EQ(finish, FinishReason::kStop);
  EXPECT_EQ(seen, "Hello ") << "text up to the stop string, the stop string itself never";
  EXPECT_EQ(s.state, SeqState::kFinished);
  EXPECT_EQ(p.kv->allocator().used_blocks(), 0);
}

TEST(OutputProcessor, TheFirstSampleForksEveryChoiceFromOneRow) {
  Parts p(16);
  Sequence& s = p.running(std::vector<int32_t>(20, 300), 4, /*n=*/3);
  std::vector<float> row(static_cast<size_t>(p.model->vocab()), 0.0f);
  row[123] = 10.0f;
  OutputProcessor::Draw not_drawn;  // the first sample of n > 1 choices is never drawn ahead
  p.out->hand_over(s, not_drawn, row.data());
  RequestState& r = *s.request;
  ASSERT_EQ(r.seqs.size(), 3u);
  for (const auto& c : r.seqs) {
    EXPECT_EQ(c->tokens.back(), 123) << "choice " << c->choice;
    EXPECT_EQ(c->state, SeqState::kRunning);
  }
  EXPECT_EQ(r.seqs[1]->blocks[0], s.blocks[0]) << "full prompt blocks are shared";
  int choices_seen = 0;
  for (const StreamEvent& ev : events(*r.handle)) choices_seen |= 1 << ev.choice;
  EXPECT_EQ(choices_seen, 0b111);
}

TEST(OutputProcessor, AFailureBeforeTheForkEndsEveryChoiceWithTheError) {
  SchedulerConfig c;
  c.prefix_caching = false;
  Parts p(16, 0, 0, c);
  Sequence& s = p.running(std::vector<int32_t>(20, 300), 4, /*n=*/2);
  RequestState& r = *s.request;
  EXPECT_FALSE(p.out->guarded(r, [] { throw Error("boom"); }));
  int errors = 0;
  for (const StreamEvent& ev : events(*r.handle))
    if (ev.finish == FinishReason::kError && ev.error == "boom") ++errors;
  EXPECT_EQ(errors, 2) << "the choice that never started ends too";
  EXPECT_EQ(r.unfinished, 0);
  EXPECT_EQ(p.kv->allocator().used_blocks(), 0) << "its blocks came back";
}

}  // namespace
}  // namespace fathom
