// The serving engine: streams equal batch generation (on the real SmolLM2 model), n > 1 forks,
// stop strings, cancellation frees blocks, prefix-cache hits, and KV pressure (sequences split
// over the device and host tiers, preemption by recompute) leaves every output unchanged. All but
// the first run on SmolLM2's small random-weight sibling (scripts/make_small_model.py: the same
// tokenizer, so the same token counts and tier sizes in blocks, ~15x less compute): they compare
// one configuration's tokens with another's, which any deterministic model of the architecture
// does as well.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <thread>

#include "engine/attention/policies/hip.h"
#include "base/error.h"
#include "engine/backend/backend.h"
#include "engine/backend/cpu/break_even.h"
#include "engine/engine.h"
#include "engine/kv/block_allocator.h"
#include "engine/kv/block_table.h"
#include "engine/model/model.h"
#include "engine/speculative/draft_model.h"

namespace fathom {
namespace {

const std::string kModel = std::string(FATHOM_MODELS_DIR) + "/smollm2-135m-instruct-q4_1.gguf";
const std::string kSmallModel = std::string(FATHOM_MODELS_DIR) + "/smollm2-vocab-small-random.gguf";

struct Loaded {
  std::unique_ptr<Model> model;
  std::unique_ptr<Backend> backend;
  const Model* operator->() const { return model.get(); }
  const Model& operator*() const { return *model; }
};

Loaded load(int64_t kv_bytes = 0, int32_t hot_rows_percent = 25, const std::string& file = kSmallModel) {
  ModelOptions o;
  o.threads = 2;
  o.kv_cache_bytes = kv_bytes;
  o.hot_rows_percent = hot_rows_percent;
  o.block_size = 16;
  Loaded l{Model::load(file), nullptr};
  l.backend = make_backend(*l.model, o);
  return l;
}

// Greedy tokens straight through the backend (one prefill pass, then one pass per token): what
// the engine must reproduce.
std::vector<int32_t> direct_greedy(Loaded& l, const std::vector<int32_t>& prompt, int32_t n) {
  BlockAllocator allocator(l.backend->kv_blocks(), l.backend->kv_layout().block_size);
  BlockTable table(allocator);
  std::vector<int32_t> tokens = prompt, out;
  std::vector<float> logits;
  for (int32_t i = 0; i < n; ++i) {
    const int32_t first = i == 0 ? 0 : static_cast<int32_t>(tokens.size()) - 1;
    EXPECT_TRUE(table.reserve(static_cast<int32_t>(tokens.size())));
    BatchPlan plan;
    plan.seqs.push_back(SeqStep{std::span<const int32_t>(tokens).subspan(first), first, &table.blocks(), LogitsWanted::kLast});
    l.backend->forward(plan, logits);
    const int32_t next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    if (l->tokenizer().is_end_of_generation(next)) break;
    tokens.push_back(next);
    out.push_back(next);
  }
  return out;
}

struct Collected {
  std::map<int32_t, std::vector<int32_t>> tokens;
  std::map<int32_t, std::string> text;
  std::map<int32_t, FinishReason> finish;
};

Collected collect(RequestHandle& h) {
  Collected c;
  StreamEvent ev;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(5);
  while (!h.done() && std::chrono::steady_clock::now() < deadline) {
    if (!h.next(ev, std::chrono::milliseconds(200))) continue;
    auto& t = c.tokens[ev.choice];
    t.insert(t.end(), ev.token_ids.begin(), ev.token_ids.end());
    c.text[ev.choice] += ev.text;
    if (ev.finish != FinishReason::kNone) c.finish[ev.choice] = ev.finish;
  }
  return c;
}

Request greedy(const Model& m, const std::string& prompt, int32_t max_tokens) {
  Request r;
  r.prompt = m.tokenizer().encode(prompt);
  r.sampling.temperature = 0;
  r.max_tokens = max_tokens;
  return r;
}

TEST(Engine, StreamMatchesBatchGeneration) {
  auto model = load(0, 25, kModel);
  const std::vector<int32_t> prompt = model->tokenizer().encode("The three primary colors are");
  const std::vector<int32_t> expected = direct_greedy(model, prompt, 12);
  MetricsRegistry metrics;
  Engine engine(*model, *model.backend, SchedulerConfig{}, metrics);
  auto handle = engine.submit(greedy(*model, "The three primary colors are", 12));
  const Collected c = collect(*handle);
  EXPECT_EQ(c.tokens.at(0), expected);
  EXPECT_EQ(c.text.at(0), model->tokenizer().decode(expected));
  EXPECT_EQ(handle->usage().completion_tokens, static_cast<int32_t>(expected.size()));
  EXPECT_EQ(handle->usage().prompt_tokens, static_cast<int32_t>(prompt.size()));
}

TEST(Engine, ForksNChoicesFromOnePrefillAndStopsOnStrings) {
  auto model = load();
  MetricsRegistry metrics;
  Engine engine(*model, *model.backend, SchedulerConfig{}, metrics);
  Request r = greedy(*model, "Count: 1, 2, 3,", 24);
  r.n = 3;
  r.sampling.temperature = 1.0f;
  r.sampling.seed = 11;
  auto h = engine.submit(r);
  const Collected c = collect(*h);
  ASSERT_EQ(c.finish.size(), 3u);
  for (int32_t i = 0; i < 3; ++i) EXPECT_FALSE(c.tokens.at(i).empty());
  // One prompt prefill for three choices: prompt tokens counted once.
  EXPECT_EQ(metrics.counter("fathom_prompt_tokens_total", "").value(), static_cast<double>(r.prompt.size()));

  // Stop string: take a piece of the unconstrained greedy text and stop on it.
  auto free_run = collect(*engine.submit(greedy(*model, "Count: 1, 2, 3,", 16)));
  const std::string full = free_run.text.at(0);
  ASSERT_GE(full.size(), 8u);
  Request s = greedy(*model, "Count: 1, 2, 3,", 16);
  s.stop.strings = {full.substr(4, 3)};
  const Collected stopped = collect(*engine.submit(s));
  EXPECT_EQ(stopped.finish.at(0), FinishReason::kStop);
  EXPECT_EQ(stopped.text.at(0), full.substr(0, 4)) << "text before the stop string, without it";
}

TEST(Engine, CancelFreesBlocksAndPrefixCacheHits) {
  auto model = load();
  MetricsRegistry metrics;
  Engine engine(*model, *model.backend, SchedulerConfig{}, metrics);
  std::string long_prompt;
  for (int i = 0; i < 12; ++i) long_prompt += "The quick brown fox jumps over the lazy dog. ";
  auto h = engine.submit(greedy(*model, long_prompt, 200));
  StreamEvent ev;
  while (!h->next(ev, std::chrono::milliseconds(100))) {
  }
  h->cancel();
  const Collected rest = collect(*h);
  EXPECT_EQ(rest.finish.at(0), FinishReason::kCancelled);
  // Only prefix-cached blocks remain referenced once the request is gone.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const double cached_only = metrics.gauge("fathom_kv_blocks_used", "", {{"tier", "device"}}).value();
  EXPECT_LE(cached_only, static_cast<double>(model->tokenizer().encode(long_prompt).size() + 200) / 16);

  const double hits_before = metrics.counter("fathom_prefix_cache_hits_total", "").value();
  collect(*engine.submit(greedy(*model, long_prompt, 2)));
  EXPECT_GE(metrics.counter("fathom_prefix_cache_hits_total", "").value() - hits_before, 16.0 * 6);
}

// max_queue bounds the requests beyond the max_num_seqs that run: with 2 slots and a queue of 1,
// three requests submitted back to back are all taken (however far the engine's loop has got),
// a fourth is refused, and once they are gone the engine takes requests again.
TEST(Engine, QueueBoundCountsRequestsBeyondTheSlots) {
  auto model = load();
  MetricsRegistry metrics;
  SchedulerConfig cfg;
  cfg.max_num_seqs = 2;
  cfg.max_queue = 1;
  Engine engine(*model, *model.backend, cfg, metrics);
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (int i = 0; i < 3; ++i) handles.push_back(engine.submit(greedy(*model, "Count slowly:", 400)));
  EXPECT_THROW(engine.submit(greedy(*model, "Count slowly:", 4)), EngineBusy);
  for (auto& h : handles) h->cancel();
  for (auto& h : handles) collect(*h);
  EXPECT_EQ(collect(*engine.submit(greedy(*model, "Count slowly:", 2))).finish.size(), 1u);
}

// The host tier (docs/tiered_kv.md): sequences whose blocks do not fit the device tier run from
// both tiers, attention staging the host blocks, and produce exactly the tokens they produce
// alone; with both tiers full, preemption by recompute keeps them too.
TEST(Engine, TieredKvAndRecomputeKeepOutputs) {
  std::vector<std::string> prompts;
  for (int i = 0; i < 6; ++i)
    prompts.push_back("Story " + std::to_string(i) + ": Once upon a time there was a little robot who");
  std::vector<std::vector<int32_t>> alone;
  {
    auto model = load();
    MetricsRegistry metrics;
    Engine engine(*model, *model.backend, SchedulerConfig{}, metrics);
    for (const auto& p : prompts) alone.push_back(collect(*engine.submit(greedy(*model, p, 40))).tokens.at(0));
  }
  // 6 sequences of ~56 tokens need ~24 blocks, 4 running at once ~16; the device tier gets 12,
  // one of them for the hot-row cache.
  const int64_t block_bytes = static_cast<int64_t>(load(0).backend->block_bytes());
  for (const int64_t host_blocks : {20, 2}) {  // both tiers hold them all; they do not (recompute)
    auto model = load(block_bytes * 12);
    ASSERT_EQ(model.backend->kv_blocks(), 12);
    MetricsRegistry metrics;
    SchedulerConfig cfg;
    cfg.host_kv_bytes = block_bytes * host_blocks;
    cfg.prefix_caching = false;
    cfg.max_batched_tokens = 32;  // a step writes at most 2 + 2·4 blocks: within the 11 device blocks
    cfg.max_num_seqs = 4;
    Engine engine(*model, *model.backend, cfg, metrics);
    std::vector<std::shared_ptr<RequestHandle>> handles;
    for (const auto& p : prompts) handles.push_back(engine.submit(greedy(*model, p, 40)));
    for (size_t i = 0; i < prompts.size(); ++i) {
      const Collected c = collect(*handles[i]);
      EXPECT_EQ(c.tokens.at(0), alone[i]) << "prompt " << i << ", host tier " << host_blocks;
    }
    const double recomputes = metrics.counter("fathom_preemptions_total", "", {{"mode", "recompute"}}).value();
    const double recomputed = metrics.counter("fathom_recomputed_tokens_total", "").value();
    const double staged_in = metrics.counter("fathom_swap_bytes_total", "", {{"direction", "in"}}).value();
    EXPECT_GT(staged_in, 0);
    EXPECT_GT(metrics.counter("fathom_kv_blocks_demoted_total", "").value(), 0);
    if (host_blocks == 20) {
      EXPECT_EQ(recomputes, 0);
      EXPECT_EQ(recomputed, 0);
    } else {
      EXPECT_GT(recomputes, 0);
      EXPECT_GT(recomputed, 0);  // no prefix cache here: every dropped token is computed again
    }
    std::printf("host tier %lld blocks: %.0f recomputes, %.0f tokens recomputed, %.0f bytes host->device\n",
                static_cast<long long>(host_blocks), recomputes, recomputed, staged_in);
  }
}

// Cache-or-recompute: two greedy requests outgrow both tiers (47 blocks) together in the last ~30
// tokens of the first. Dropping the later one's oldest blocks until the first ends recomputes fewer
// tokens than preempting it (its ~600 computed tokens), so they are dropped, every step
// recomputes them into the scratch, and when the first request ends they come back (recomputed into
// new blocks). Both outputs equal the all-resident run's, token for token. With recompute off the
// same load preempts; with recompute preferred to the host tier, blocks go before the host tier.
TEST(Engine, DroppedBlocksAreRecomputedWithTheResidentOutput) {
  auto model = load();
  std::string long_text;
  for (int i = 0; i < 60; ++i) long_text += "Item " + std::to_string(i) + " is a gear. ";
  std::vector<Request> requests = {greedy(*model,
                                          "Once upon a time there was a little robot who lived in a workshop"
                                          " full of clocks, springs and old radios. One day",
                                          150),
                                   greedy(*model, long_text, 150)};
  for (Request& r : requests) r.stop.ignore_eos = true;
  ASSERT_GT(requests[1].prompt.size(), 380u);
  // Both tiers together hold `total_blocks` (0: all resident); the device tier's budget is 24.
  auto run = [&](int32_t total_blocks, SchedulerConfig::Recompute recompute, MetricsRegistry& m) {
    const int64_t block_bytes = static_cast<int64_t>(load(0).backend->block_bytes());
    SchedulerConfig cfg;
    cfg.max_batched_tokens = 128;  // a scratch of 64 tokens
    cfg.max_num_seqs = 2;
    cfg.recompute = recompute;
    int32_t device = 0;  // what the page table gets of the budget (the caches take their share)
    if (total_blocks > 0) {
      auto probe = load(block_bytes * 24);
      cfg.host_kv_bytes = block_bytes * 8;
      MetricsRegistry unused;
      device = Engine(*probe, *probe.backend, cfg, unused).kv_capacity().device_blocks;
      cfg.host_kv_bytes = block_bytes * (total_blocks - device);
    }
    auto l = load(total_blocks > 0 ? block_bytes * 24 : 0);
    Engine engine(*l, *l.backend, cfg, m);
    if (total_blocks > 0) {
      EXPECT_EQ(engine.kv_capacity().device_blocks + engine.kv_capacity().host_blocks, total_blocks);
    }
    std::vector<std::shared_ptr<RequestHandle>> handles;
    for (const Request& r : requests) handles.push_back(engine.submit(r));
    std::vector<std::vector<int32_t>> out;
    for (auto& h : handles) out.push_back(collect(*h).tokens.at(0));
    return out;
  };
  MetricsRegistry m_resident, m_dropped, m_off;
  const auto resident = run(0, SchedulerConfig::Recompute::kAuto, m_resident);
  const auto dropped = run(47, SchedulerConfig::Recompute::kAuto, m_dropped);
  ASSERT_EQ(resident.size(), 2u);
  EXPECT_EQ(resident[0].size(), 150u);
  EXPECT_EQ(resident[1].size(), 150u);
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(dropped[i], resident[i]) << "request " << i;
  auto counter = [](MetricsRegistry& m, const char* name) { return m.counter(name, "").value(); };
  const double preempted = m_dropped.counter("fathom_preemptions_total", "", {{"mode", "recompute"}}).value();
  EXPECT_EQ(preempted, 0);
  EXPECT_GT(counter(m_dropped, "fathom_kv_blocks_dropped_total"), 0);
  EXPECT_GT(counter(m_dropped, "fathom_kv_dropped_tokens_recomputed_total"), 0);
  EXPECT_GT(counter(m_dropped, "fathom_kv_blocks_restored_total"), 0) << "the blocks come back after request 0 ends";
  EXPECT_EQ(m_dropped.gauge("fathom_kv_dropped_tokens", "").value(), 0);
  EXPECT_GT(m_dropped.gauge("fathom_kv_recompute_seconds_per_token", "").value(), 0);
  EXPECT_GT(m_dropped.gauge("fathom_kv_transfer_seconds_per_token", "").value(), 0);
  std::printf("cache-or-recompute: %.0f blocks dropped, %.0f tokens recomputed, %.0f blocks restored\n",
              counter(m_dropped, "fathom_kv_blocks_dropped_total"),
              counter(m_dropped, "fathom_kv_dropped_tokens_recomputed_total"),
              counter(m_dropped, "fathom_kv_blocks_restored_total"));
  const auto off = run(47, SchedulerConfig::Recompute::kOff, m_off);
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(off[i], resident[i]) << "request " << i;
  EXPECT_GT(m_off.counter("fathom_preemptions_total", "", {{"mode", "recompute"}}).value(), 0);
  EXPECT_EQ(counter(m_off, "fathom_kv_blocks_dropped_total"), 0);
  // Recompute preferred to the host tier (what the cost model picks where recomputing a token is
  // cheaper than moving it): blocks that went to a roomy host tier are dropped, none preempted.
  MetricsRegistry m_always;
  const auto always = run(96, SchedulerConfig::Recompute::kAlways, m_always);
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(always[i], resident[i]) << "request " << i;
  EXPECT_GT(counter(m_always, "fathom_kv_blocks_dropped_total"), 0);
  EXPECT_EQ(counter(m_always, "fathom_kv_blocks_restored_total"), 0);
  EXPECT_EQ(m_always.counter("fathom_preemptions_total", "", {{"mode", "recompute"}}).value(), 0);
}

// Admission counts what cache-or-recompute may drop: a request up to both tiers plus the scratch's
// tokens (64 here) runs alone to the resident output, dropping its own oldest blocks (preempting
// itself would only come back to the same wall); one block more is refused at submission, and so
// is a prompt the tiers cannot hold whole.
TEST(Engine, ARequestLargerThanBothTiersIsServedByRecompute) {
  auto model = load();
  std::string text;
  for (int i = 0; i < 30; ++i) text += "Item " + std::to_string(i) + " is a gear. ";
  Request r = greedy(*model, text, 8);
  r.stop.ignore_eos = true;
  const int64_t block_bytes = static_cast<int64_t>(load(0).backend->block_bytes());
  SchedulerConfig cfg;
  cfg.max_batched_tokens = 128;  // a scratch of 64 tokens
  cfg.max_num_seqs = 2;
  cfg.host_kv_bytes = block_bytes * 8;
  auto l = load(block_bytes * 24);
  MetricsRegistry m;
  Engine engine(*l, *l.backend, cfg, m);
  const Engine::KvCapacity kv = engine.kv_capacity();
  ASSERT_EQ(kv.recompute.capacity_tokens, 64);
  const int32_t tiers = (kv.device_blocks + kv.host_blocks) * 16;
  r.max_tokens = tiers + 64 - static_cast<int32_t>(r.prompt.size());  // exactly what may be served
  ASSERT_GT(r.max_tokens, 64);
  Request one_more = r;
  one_more.max_tokens += 16;
  try {
    engine.submit(one_more);
    ADD_FAILURE() << "a request past both tiers and the scratch was admitted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("recomputes up to 4"), std::string::npos) << e.what();
  }
  Request huge_prompt = greedy(*model, text + text + text + text + text + text + text + text, 4);
  EXPECT_THROW(engine.submit(huge_prompt), Error);
  const std::vector<int32_t> served = collect(*engine.submit(r)).tokens.at(0);
  EXPECT_EQ(served.size(), static_cast<size_t>(r.max_tokens));
  EXPECT_EQ(m.counter("fathom_preemptions_total", "", {{"mode", "recompute"}}).value(), 0);
  EXPECT_EQ(m.counter("fathom_kv_blocks_dropped_total", "").value(), 4);
  MetricsRegistry m_resident;
  auto big = load();
  Engine resident(*big, *big.backend, cfg, m_resident);
  EXPECT_EQ(collect(*resident.submit(r)).tokens.at(0), served);
}

// A prompt ten key chunks long (~2,000 tokens), run with `device_blocks` device blocks (0: all
// resident) and `host_blocks` in the host tier; returns each choice's tokens.
std::string long_prompt() {
  std::string text;
  for (int i = 0; i < 160; ++i) text += "Line " + std::to_string(i) + ": the robot counted gears. ";
  return text;
}

std::map<int32_t, std::vector<int32_t>> run_tiered(Request r, int32_t device_blocks, int32_t host_blocks,
                                                   MetricsRegistry& metrics, int32_t hot_rows_percent = 25,
                                                   bool bifurcated = false, bool adaptive_drafts = true) {
  const int64_t block_bytes = static_cast<int64_t>(load(0).backend->block_bytes());
  auto model = load(block_bytes * device_blocks, hot_rows_percent);
  SchedulerConfig cfg;
  cfg.host_kv_bytes = block_bytes * host_blocks;
  cfg.max_batched_tokens = 256;
  cfg.max_num_seqs = 8;
  cfg.bifurcated = bifurcated;  // a different kernel (its own rounding): both runs of a comparison alike
  cfg.adaptive_drafts = adaptive_drafts;
  Engine engine(*model, *model.backend, cfg, metrics);
  return collect(*engine.submit(r)).tokens;
}

// Four seeded choices of long_prompt() under temperature sampling (forks share the prompt's blocks).
Request four_samples(const Model& model, int32_t max_tokens) {
  Request r = greedy(model, long_prompt(), max_tokens);
  r.n = 4;
  r.sampling.temperature = 0.7f;
  r.sampling.seed = 7;
  return r;
}

// Dense attention reads most of the prompt from the host tier in several staging passes, and
// every choice (forks share the prompt's blocks) matches the all-resident run token for token,
// under temperature sampling.
TEST(Engine, LongPromptFromTheHostTierMatchesResident) {
  auto model = load();
  const Request r = four_samples(*model, 24);
  MetricsRegistry m_resident, m_tiered;
  const auto resident = run_tiered(r, 0, 0, m_resident);
  const auto tiered = run_tiered(r, 40, 200, m_tiered);
  ASSERT_EQ(resident.size(), 4u);
  for (int32_t c = 0; c < 4; ++c) EXPECT_EQ(tiered.at(c), resident.at(c)) << "choice " << c;
  const double moved_in = m_tiered.counter("fathom_swap_bytes_total", "", {{"direction", "in"}}).value();
  const double block_bytes = static_cast<double>(model.backend->block_bytes());
  EXPECT_GT(moved_in, 24 * 40 * block_bytes) << "decode steps read the prompt through the staging area";
  EXPECT_EQ(m_tiered.counter("fathom_preemptions_total", "", {{"mode", "recompute"}}).value(), 0);
}

// n = 4 samples of a long prompt read mostly from the host tier decode as one bifurcated group: the
// shared prompt is staged once per layer step for the whole group (not once per sample), and the
// choices equal the resident group's (the same kernel over staged chunks, bitwise).
TEST(Engine, SampleGroupOverTheHostTierMatchesResident) {
  auto model = load();
  const Request r = four_samples(*model, 16);
  MetricsRegistry m_resident, m_tiered;
  const auto resident = run_tiered(r, 0, 0, m_resident, 25, /*bifurcated=*/true);
  const auto tiered = run_tiered(r, 40, 200, m_tiered, 25, /*bifurcated=*/true);
  ASSERT_EQ(resident.size(), 4u);
  for (int32_t c = 0; c < 4; ++c) EXPECT_EQ(tiered.at(c), resident.at(c)) << "choice " << c;
  // The same groups ran: the same KV bytes read (a group counts its shared prompt once).
  auto kv_read = [](MetricsRegistry& m) { return m.counter("fathom_kv_read_bytes_total", "", {{"policy", "dense"}}).value(); };
  EXPECT_EQ(kv_read(m_tiered), kv_read(m_resident));
  // Staged once per step: well under what staging the prompt for each of the 4 samples would move.
  const double moved_in = m_tiered.counter("fathom_swap_bytes_total", "", {{"direction", "in"}}).value();
  const double block_bytes = static_cast<double>(model.backend->block_bytes());
  const double prompt_blocks = static_cast<double>(r.prompt.size()) / 16, steps = r.max_tokens - 1;
  EXPECT_GT(moved_in, 0.5 * steps * prompt_blocks * block_bytes);
  EXPECT_LT(moved_in, 2.0 * steps * prompt_blocks * block_bytes);
  std::printf("group over the host tier: %.0f bytes host->device (%.1f prompt stagings a step)\n", moved_in,
              moved_in / (steps * prompt_blocks * block_bytes));
}

// HiP, SparQ and SWA gather host-tier rows through the hot-row cache (SparQ's step 1 reads the r
// selected dimension rows of each host block's transposed K from the host tier). They read the
// same rows in the same key chunks as when resident, so their tokens equal the all-resident run's,
// and none falls back to dense. SWA's first decode step attends every position (it seeds the
// attention mass), more rows than the cache holds: its key chunks run in batches the cache holds.
TEST(Engine, SparsePoliciesOverTheHostTierMatchResident) {
  auto model = load();
  for (PolicyKind kind : {policy_kind("hip"), policy_kind("sparq"), policy_kind("alisa")}) {
    Request r = greedy(*model, long_prompt(), 24);
    r.attention.kind = kind;
    r.attention.kv_read_ratio = 0.125;
    r.attention.min_keys = 0;  // sparse at this length even where dense would be faster
    MetricsRegistry m_resident, m_tiered;
    const auto resident = run_tiered(r, 0, 0, m_resident);
    const auto tiered = run_tiered(r, 96, 200, m_tiered, 100);  // 64 of the 96 blocks hold hot rows: 1,024 a head
    const std::string policy = policy_name(kind);
    EXPECT_EQ(tiered.at(0), resident.at(0)) << policy;
    EXPECT_EQ(tiered.at(0).size(), 24u) << policy;
    const double hits = m_tiered.counter("fathom_kv_hot_rows_total", "", {{"policy", policy}, {"result", "hit"}}).value();
    const double misses = m_tiered.counter("fathom_kv_hot_rows_total", "", {{"policy", policy}, {"result", "miss"}}).value();
    EXPECT_GT(misses, 0) << policy;
    EXPECT_GT(hits, 0) << policy;
    if (kind == policy_kind("hip")) {
      EXPECT_GT(hits, misses) << policy;  // the mask is cached for 4 steps: its rows are reused
    }
    const double fallbacks = m_tiered.counter("fathom_kv_hot_row_fallbacks_total", "").value();
    EXPECT_EQ(fallbacks, 0) << policy;
    std::printf("%s over the host tier: %.0f hot-row hits, %.0f misses\n", policy.c_str(), hits, misses);
  }
}

// Sparse drafting (docs/speculative.md): rounds of sparse draft steps over the same KV cache, each
// verified by one dense step, emit exactly the dense output for every sparse policy: greedy, from
// the device tier alone and over both tiers (draft steps read host blocks; verify steps write the
// drafts' positions again and put back the running planes), and seeded n = 4 (forks). Drafts are
// really made and kept (the metrics), so the rollback of rejected ones is exercised too.
TEST(Engine, SparseDraftsEmitTheDenseOutputForEveryPolicyAndTier) {
  auto model = load();
  MetricsRegistry m_dense;
  const Request dense = greedy(*model, long_prompt(), 40);
  const auto want = run_tiered(dense, 0, 0, m_dense);
  Request sampled = four_samples(*model, 20);
  const auto want_sampled = run_tiered(sampled, 0, 0, m_dense);
  struct Case {
    const char* policy;
    int32_t device_blocks, host_blocks;
    bool sampled;
  };
  double kept_anywhere = 0;
  for (const Case& c : {Case{"sparq", 0, 0, false}, Case{"hip", 0, 0, false}, Case{"alisa", 0, 0, false},
                        Case{"sparq", 96, 200, false}, Case{"alisa", 0, 0, true}}) {
    Request r = c.sampled ? sampled : dense;
    r.speculative = Speculation::kSparse;
    r.attention.kind = policy_kind(c.policy);
    r.attention.min_keys = 0;  // sparse drafts at this length
    MetricsRegistry m;  // fixed k: the cost rule would not draft at this length
    const auto got = run_tiered(r, c.device_blocks, c.host_blocks, m, 100, false, /*adaptive_drafts=*/false);
    const std::string what = std::string(c.policy) + (c.host_blocks > 0 ? " over both tiers" : "") + (c.sampled ? " sampled" : "");
    EXPECT_EQ(got, c.sampled ? want_sampled : want) << what;
    const auto counter = [&](const char* name) { return m.counter(name, "", {{"drafter", "sparse"}}).value(); };
    const double drafted = counter("fathom_spec_decode_draft_tokens_total");
    const double kept = counter("fathom_spec_decode_accepted_tokens_total");
    EXPECT_GT(counter("fathom_spec_decode_verify_steps_total"), 4) << what;
    EXPECT_GT(drafted, 20) << what;
    EXPECT_GE(drafted, kept) << what;
    kept_anywhere += kept;
    std::printf("sparse drafts, %s: %.0f drafted, %.0f kept\n", what.c_str(), drafted, kept);
  }
  // Random weights: sparse attention's argmax rarely matches dense's, so most drafts are rolled
  // back; some are kept (the real model keeps most: bench/speculative.py).
  EXPECT_GT(kept_anywhere, 0);
}

// The draft model (Speculation::kModel, docs/speculative.md) proposes, the dense verify step keeps
// the output: greedy and seeded n = 4 emit exactly the plain output with a draft model that agrees
// with the model (the same weights: every greedy draft is kept, across the draft's catch-up of a
// prompt 64 tokens a step and its cache reused between rounds) and with one that mostly does not
// (the real SmolLM2 drafting for its random-weight sibling). Without a draft model the engine
// refuses such requests, and a draft model with another vocabulary is refused at load.
TEST(Engine, DraftModelKeepsTheOutput) {
  auto model = load();
  Request greedy_r = greedy(*model, long_prompt(), 40), sampled_r = four_samples(*model, 20);
  greedy_r.prompt.resize(300);  // caught up by the draft model in 5 steps
  sampled_r.prompt.resize(300);
  SchedulerConfig cfg;
  cfg.max_batched_tokens = 256;
  cfg.adaptive_drafts = false;  // k = 4 every step: the most drafts to check
  cfg.bifurcated = false;  // plain steps of the 4 forks would use its kernel (its own rounding), verify steps not
  MetricsRegistry m_plain;
  std::map<int32_t, std::vector<int32_t>> want_greedy, want_sampled;
  {
    Engine engine(*model, *model.backend, cfg, m_plain);
    want_greedy = collect(*engine.submit(greedy_r)).tokens;
    want_sampled = collect(*engine.submit(sampled_r)).tokens;
    Request r = greedy_r;
    r.speculative = Speculation::kModel;
    EXPECT_THROW(engine.submit(r), Error) << "no draft model";
  }
  for (const bool same : {true, false}) {
    auto draft_loaded = load(0, 25, same ? kSmallModel : kModel);
    DraftModel draft(*draft_loaded, *draft_loaded.backend, /*max_chunk=*/64);
    MetricsRegistry m;
    auto engine = std::make_unique<Engine>(*model, *model.backend, cfg, m, &draft);
    for (const bool sampled : {false, true}) {
      Request r = sampled ? sampled_r : greedy_r;
      r.speculative = Speculation::kModel;
      EXPECT_EQ(collect(*engine->submit(r)).tokens, sampled ? want_sampled : want_greedy)
          << (same ? "same model" : "other model") << (sampled ? ", sampled" : ", greedy");
      if (sampled) continue;
      const auto counter = [&](const char* name) { return m.counter(name, "", {{"drafter", "model"}}).value(); };
      const double drafted = counter("fathom_spec_decode_draft_tokens_total");
      const double kept = counter("fathom_spec_decode_accepted_tokens_total");
      std::printf("draft model (%s): %.0f drafted, %.0f kept\n", same ? "same" : "other", drafted, kept);
      EXPECT_GT(drafted, 20);
      if (same) EXPECT_EQ(kept, drafted) << "the model's own greedy tokens";
      else EXPECT_LT(kept, drafted);
    }
    engine.reset();  // its last step done
    EXPECT_EQ(draft.cached_sequences(), 0) << "finished sequences' caches go";
  }
  {  // concurrent sequences: their rounds run together (passes of several rows), the same output
    Request base = greedy(*model, long_prompt(), 24);
    base.stop.ignore_eos = true;
    std::vector<Request> rs;
    for (size_t i = 0; i < 3; ++i) {
      Request r = base;
      r.prompt.assign(base.prompt.begin() + static_cast<std::ptrdiff_t>(40 * i), base.prompt.begin() + static_cast<std::ptrdiff_t>(40 * i + 50));
      rs.push_back(r);
    }
    const auto run_all = [&](Engine& engine) {
      std::vector<std::shared_ptr<RequestHandle>> handles;
      for (const Request& r : rs) handles.push_back(engine.submit(r));
      std::vector<std::map<int32_t, std::vector<int32_t>>> out;
      for (auto& h : handles) out.push_back(collect(*h).tokens);
      return out;
    };
    MetricsRegistry m_plain_all, m;
    Engine plain(*model, *model.backend, cfg, m_plain_all);
    const auto want = run_all(plain);
    auto draft_loaded = load(0, 25, kSmallModel);
    DraftModel draft(*draft_loaded, *draft_loaded.backend, /*max_chunk=*/64);
    Engine engine(*model, *model.backend, cfg, m, &draft);
    for (Request& r : rs) r.speculative = Speculation::kModel;
    EXPECT_EQ(run_all(engine), want);
    EXPECT_GT(draft.pass_rows(), draft.passes()) << "no draft pass advanced two sequences";
  }
  {  // auto: prompt lookup where it proposes, else the draft model, else sparse; still the output
    auto draft_loaded = load(0, 25, kSmallModel);
    DraftModel draft(*draft_loaded, *draft_loaded.backend, /*max_chunk=*/64);
    MetricsRegistry m;
    Engine engine(*model, *model.backend, cfg, m, &draft);
    Request r = greedy_r;
    r.speculative = Speculation::kAuto;
    EXPECT_EQ(collect(*engine.submit(r)).tokens, want_greedy) << "auto";
    double drafted = 0;
    for (const Speculation d : kDrafters)
      drafted += m.counter("fathom_spec_decode_draft_tokens_total", "", {{"drafter", speculation_name(d)}}).value();
    EXPECT_GT(drafted, 8) << "auto drafts (the draft model only once the engine's step costs are fitted)";
  }
  const auto gemma = Model::load(std::string(FATHOM_MODELS_DIR) + "/gemma-3-270m-q4_k_m.gguf");
  EXPECT_THROW(DraftModel::check_vocabulary(*model, *gemma), Error);
}

// One decode pass over many sequences runs their attention side by side, a step per thread
// (CpuBackend::attend_decodes; the long dense step alone over the pool): every sequence's logits,
// several steps on (HiP's mask refreshed, SWA's mass folded), and the bytes are bitwise those of the
// same sequences decoded one at a time.
TEST(Engine, DecodeStepsSideBySideMatchOneByOne) {
  auto l = load();
  std::vector<int32_t> prompt = l->tokenizer().encode(long_prompt());
  prompt.resize(std::min<size_t>(prompt.size(), 600));  // past every policy's k floor, short to prefill
  AttentionPolicy sparq, hip, swa, auto_policy, dense;
  sparq.kind = policy_kind("sparq");
  hip.kind = policy_kind("hip");
  swa.kind = policy_kind("alisa");
  auto_policy.kind = policy_kind("auto");
  for (AttentionPolicy* p : {&sparq, &hip, &swa, &auto_policy}) {
    p->kv_read_ratio = 0.125;
    p->min_keys = 0;
  }
  const std::vector<const AttentionPolicy*> policies = {&sparq, &hip, &swa, &auto_policy, &dense, &swa};
  const int32_t n = static_cast<int32_t>(policies.size()), steps = 6;
  BlockAllocator allocator(l.backend->kv_blocks(), l.backend->kv_layout().block_size);
  struct Seq {
    std::vector<int32_t> tokens;
    std::unique_ptr<BlockTable> table;
    SeqPolicyState state;
  };
  // [run][sequence]: run 0 decodes all together, run 1 one at a time; sequence i is the prompt
  // less its last 45·i tokens.
  std::vector<std::vector<Seq>> runs(2);
  ASSERT_GE(l.backend->kv_blocks() * l.backend->kv_layout().block_size, 2 * n * (600 + steps + 16));
  std::vector<float> logits;
  for (auto& run : runs)
    for (int32_t i = 0; i < n; ++i) {
      Seq s;
      s.tokens.assign(prompt.begin(), prompt.end() - 45 * i);
      s.table = std::make_unique<BlockTable>(allocator);
      ASSERT_TRUE(s.table->reserve(static_cast<int32_t>(s.tokens.size()) + steps));
      BatchPlan plan;
      plan.seqs.push_back(SeqStep{s.tokens, 0, &s.table->blocks(), LogitsWanted::kLast});
      l.backend->forward(plan, logits);
      s.tokens.push_back(static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
      run.push_back(std::move(s));
    }
  const int32_t vocab = l->vocab();
  auto step_of = [&](Seq& s, int32_t i) {
    const int32_t pos = static_cast<int32_t>(s.tokens.size()) - 1;
    return SeqStep{std::span<const int32_t>(&s.tokens[pos], 1), pos, &s.table->blocks(), LogitsWanted::kLast,
                   policies[i], &s.state};
  };
  StepStats decoded;  // every decode pass's
  for (int32_t step = 0; step < steps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    BatchPlan together;
    for (int32_t i = 0; i < n; ++i) together.seqs.push_back(step_of(runs[0][i], i));
    const StepStats together_stats = l.backend->forward(together, logits);
    const KvReadBytes& together_bytes = together_stats.kv_read;
    decoded += together_stats;
    ASSERT_EQ(logits.size(), static_cast<size_t>(n) * vocab);
    KvReadBytes alone_bytes{};
    std::vector<float> alone;
    for (int32_t i = 0; i < n; ++i) {
      BatchPlan plan;
      plan.seqs.push_back(step_of(runs[1][i], i));
      const StepStats alone_stats = l.backend->forward(plan, alone);
      decoded += alone_stats;
      const KvReadBytes& b = alone_stats.kv_read;
      for (size_t k = 0; k < b.size(); ++k) alone_bytes[k] += b[k];
      ASSERT_TRUE(std::equal(alone.begin(), alone.end(), logits.begin() + static_cast<int64_t>(i) * vocab))
          << "sequence " << i << " (" << policy_name(policies[i]->kind) << ")";
      const int32_t next = static_cast<int32_t>(std::max_element(alone.begin(), alone.end()) - alone.begin());
      runs[0][i].tokens.push_back(next);
      runs[1][i].tokens.push_back(next);
    }
    EXPECT_EQ(together_bytes, alone_bytes);
  }
  // Every policy ran its own kernel on every layer it covers (HiP's leading layers are dense; none
  // fell back to dense at these lengths), so a layer's six steps took every path: the dense ones
  // alone over the pool (over an even share), four side by side, the smallest of five alone.
  const AttentionSteps& ran = decoded.attention_steps;
  const int32_t layers = l->config().n_layers, passes = 2 * steps;
  const int kSparq = policy_kind("sparq"), kHip = policy_kind("hip"),
                kSwa = policy_kind("alisa"), kAuto = policy_kind("auto");
  EXPECT_EQ(ran[kSparq][kSparq], passes * layers);
  EXPECT_EQ(ran[kHip][kHip], passes * (layers - hip.integer(hip::kDenseLayers)));
  EXPECT_EQ(ran[kSwa][kSwa], 2 * passes * layers);
  EXPECT_EQ(ran[kAuto][kSwa], passes * layers);
}

// A decode step shorter than the policy's min_keys runs the dense kernel: the same logits as
// dense, bitwise, and dense's bytes; at min_keys 0 the same step is sparse (fewer bytes). auto
// is SWA or dense by the same rule.
TEST(Engine, ASparseStepBelowItsMinKeysIsDenseAndAutoChoosesByIt) {
  auto l = load();
  const std::vector<int32_t> prompt = l->tokenizer().encode(long_prompt());
  const int32_t P = static_cast<int32_t>(prompt.size());
  BlockAllocator allocator(l.backend->kv_blocks(), l.backend->kv_layout().block_size);
  BlockTable table(allocator);
  ASSERT_TRUE(table.reserve(P + 1));
  std::vector<float> logits;
  BatchPlan prefill;
  prefill.seqs.push_back(SeqStep{prompt, 0, &table.blocks(), LogitsWanted::kLast});
  l.backend->forward(prefill, logits);
  const int32_t next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  StepStats last;  // the last decode's
  auto decode = [&](const AttentionPolicy& p, std::vector<float>& out) {
    SeqPolicyState state;
    BatchPlan plan;
    plan.seqs.push_back(SeqStep{std::span<const int32_t>(&next, 1), P, &table.blocks(), LogitsWanted::kLast, &p, &state});
    last = l.backend->forward(plan, out);
    return last.kv_read[static_cast<int>(p.kind)];
  };
  AttentionPolicy dense, below, sparse;
  below.kind = sparse.kind = policy_kind("sparq");
  below.min_keys = P + 2;
  sparse.min_keys = 0;
  std::vector<float> dense_logits, below_logits, sparse_logits;
  const int64_t dense_bytes = decode(dense, dense_logits);
  EXPECT_EQ(decode(below, below_logits), dense_bytes);
  EXPECT_EQ(below_logits, dense_logits);
  EXPECT_LT(decode(sparse, sparse_logits), dense_bytes / 2);
  EXPECT_NE(sparse_logits, dense_logits);

  // auto is SWA above its break-even and dense below, charged to "auto", its choice counted.
  AttentionPolicy swa, auto_above, auto_below;
  swa.kind = policy_kind("alisa");
  auto_above.kind = auto_below.kind = policy_kind("auto");
  swa.min_keys = auto_above.min_keys = 0;
  auto_below.min_keys = P + 2;
  std::vector<float> swa_logits, above_logits, auto_dense_logits;
  const int64_t swa_bytes = decode(swa, swa_logits);
  EXPECT_EQ(decode(auto_above, above_logits), swa_bytes);
  EXPECT_EQ(above_logits, swa_logits);
  const int32_t layers = l->config().n_layers;
  const int kAuto = policy_kind("auto"), kSwa = policy_kind("alisa");
  EXPECT_EQ(last.attention_steps[kAuto][kSwa], layers);
  EXPECT_EQ(decode(auto_below, auto_dense_logits), dense_bytes);
  EXPECT_EQ(auto_dense_logits, dense_logits);
  EXPECT_EQ(last.attention_steps[kAuto][kDensePolicy], layers);
  EXPECT_EQ(last.attention_steps[kAuto][kSwa], 0);
}

// The measured break-even is the shortest measured length from which the policy's own timings
// are faster than dense at every longer one.
TEST(Engine, MeasuredBreakEvenFollowsItsTimings) {
  auto l = load();
  const ModelConfig& c = l->config();
  ThreadPool pool(2);
  for (PolicyKind kind : {policy_kind("sparq"), policy_kind("hip"), policy_kind("alisa")}) {
    AttentionPolicy p;
    p.kind = kind;
    const BreakEven be = measure_break_even(pool, l.backend->kv_layout(), c.n_heads, c.attn_scale, p, c.context_length);
    ASSERT_EQ(be.times.size(), 6u);  // 256 ... 8,192: SmolLM2's context
    EXPECT_EQ(be.times.back().keys, c.context_length);
    bool slower_seen = false;
    for (size_t i = be.times.size(); i-- > 0;) {
      const BreakEvenTimes& t = be.times[i];
      EXPECT_GT(t.dense_us, 0) << t.keys;
      EXPECT_GT(t.sparse_us, 0) << t.keys;
      if (t.keys >= be.min_keys) {
        EXPECT_LT(t.sparse_us, t.dense_us) << policy_name(kind) << " at " << t.keys;
      }
      slower_seen |= t.sparse_us >= t.dense_us;
      if (t.keys < be.min_keys && !slower_seen) ADD_FAILURE() << policy_name(kind) << ": break-even too late at " << t.keys;
    }
    std::printf("%s: break-even %d keys\n", policy_name(kind), be.min_keys);
  }
}

TEST(Engine, RejectsInvalidRequests) {
  auto model = load();
  MetricsRegistry metrics;
  Engine engine(*model, *model.backend, SchedulerConfig{}, metrics);
  Request empty;
  EXPECT_THROW(engine.submit(empty), Error);
  Request too_long = greedy(*model, "hi", model->config().context_length);
  EXPECT_THROW(engine.submit(too_long), Error);
  Request bad_token = greedy(*model, "hi", 4);
  bad_token.prompt.push_back(model->vocab());
  EXPECT_THROW(engine.submit(bad_token), Error);
  Request policy = greedy(*model, "hi", 4);
  policy.attention.kind = policy_kind("sparq");
  policy.attention.kv_read_ratio = 0.0;  // out of (0, 1]
  EXPECT_THROW(engine.submit(policy), Error);
}

TEST(Engine, HostParallelForRunsEveryIndexAndRethrowsOnTheCaller) {
  // The CPU backend lends its pool's threads (sampling, prompt scoring): every index runs once,
  // and an exception thrown on a worker reaches the caller instead of ending the process.
  auto model = load();
  std::vector<int> ran(64, 0);
  model.backend->host_parallel_for(64, [&](int64_t i) { ++ran[static_cast<size_t>(i)]; });
  EXPECT_EQ(std::count(ran.begin(), ran.end(), 1), 64);
  std::fill(ran.begin(), ran.end(), 0);
  EXPECT_THROW(model.backend->host_parallel_for(64,
                                                [&](int64_t i) {
                                                  ++ran[static_cast<size_t>(i)];
                                                  if (i % 7 == 3) throw Error("index " + std::to_string(i));
                                                }),
               Error);
  EXPECT_EQ(std::count(ran.begin(), ran.end(), 1), 64);  // the other indices still ran
}

}  // namespace
}  // namespace fathom
