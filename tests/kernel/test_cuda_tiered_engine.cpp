// The CUDA backend's host KV tier, end to end: the engine (scheduler, page table, block moves)
// over the CUDA backend run on the CPU through kernels/cuda/emu, with a device tier far smaller
// than the sequences' KV. The host tier is page-locked host memory the kernels read in place
// (negative block table entries); moves between the tiers are async copies on a non-blocking copy
// stream, which the emulator defers until something waits for them — so a pass that did not
// wait for a promotion would read stale bytes here, as it would on a GPU.
//
// One request per policy (dense, SparQ, HiP, SWA at kv_read_ratio 1/8, min_keys 0), one after
// the other in one engine, over prompts that share a ~190-token prefix (the prefix cache's blocks,
// in either tier, are reused by the later ones) and end in their own ~20 tokens: every request's
// greedy tokens with 10 device blocks (a prompt needs ~14) equal the all-resident run's. Requests
// run alone, so both runs make the same passes (the CUDA backend's matmul path depends on a pass's
// rows) and the kernels read the same bytes: bitwise equal logits. The emulated prefill is what
// costs (~10 s for the prefix), then ~0.6 s a decode step.
#include "tests/kernel/cuda_backend_sources.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/metrics.h"
#include "engine/model.h"

namespace fathom {
namespace {

constexpr PolicyKind kPolicies[] = {PolicyKind::kDense, PolicyKind::kSparq, PolicyKind::kHip, PolicyKind::kSwa};

struct EngineRun {
  std::map<PolicyKind, std::vector<int32_t>> tokens;
  double moved_in = 0, moved_out = 0, demoted = 0, preempted = 0;
};

EngineRun run_engine(const Model& model, int64_t device_blocks, int64_t host_blocks) {
  ModelOptions o;
  o.threads = 2;
  o.block_size = 16;
  const ModelConfig& c = model.config();
  const KvLayout layout{c.n_layers, c.n_kv_heads, c.head_dim, o.block_size, o.kv_dtype, o.kv_transposed_k};
  o.kv_cache_bytes = static_cast<int64_t>(layout.block_bytes()) * device_blocks;
  std::unique_ptr<Backend> backend = make_cuda_backend(model, o);
  MetricsRegistry metrics;
  SchedulerConfig cfg;
  cfg.host_kv_bytes = static_cast<int64_t>(layout.block_bytes()) * host_blocks;
  cfg.max_batched_tokens = 64;  // a step writes at most 4 + 2 blocks
  cfg.max_num_seqs = 1;
  Engine engine(model, *backend, cfg, metrics);
  EXPECT_EQ(engine.kv_capacity().host_blocks, host_blocks);

  std::string prefix;
  for (int i = 0; i < 16; ++i) prefix += "Line " + std::to_string(i) + ": the robot counted gears. ";
  EngineRun out;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(10);
  for (PolicyKind kind : kPolicies) {
    Request r;
    r.prompt = model.tokenizer().encode(prefix + "Question about " + policy_name(kind) +
                                        ": how many gears did the robot count on line seven, and why?");
    r.sampling.temperature = 0;
    r.max_tokens = 5;  // a HiP mask estimated (refresh 4), reused, estimated again
    r.stop.ignore_eos = true;
    r.attention.kind = kind;
    r.attention.kv_read_ratio = 0.125;
    r.attention.min_keys = 0;
    if (kind == PolicyKind::kSwa) r.attention.swa_ratio = 0.25;  // below its 256-key floor
    const std::shared_ptr<RequestHandle> h = engine.submit(r);
    StreamEvent ev;
    while (!h->done() && std::chrono::steady_clock::now() < deadline) {
      if (!h->next(ev, std::chrono::milliseconds(200))) continue;
      out.tokens[kind].insert(out.tokens[kind].end(), ev.token_ids.begin(), ev.token_ids.end());
    }
  }
  out.moved_in = metrics.counter("fathom_swap_bytes_total", "", {{"direction", "in"}}).value();
  out.moved_out = metrics.counter("fathom_swap_bytes_total", "", {{"direction", "out"}}).value();
  out.demoted = metrics.counter("fathom_kv_blocks_demoted_total", "").value();
  out.preempted = metrics.counter("fathom_preemptions_total", "", {{"mode", "recompute"}}).value();
  return out;
}

TEST(CudaTieredEngine, PoliciesOverTheHostTierMatchResident) {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<Model> model = Model::load(std::string(FATHOM_MODELS_DIR) + "/smollm2-135m-instruct-q4_1.gguf");
  const EngineRun resident = run_engine(*model, 200, 0);
  const EngineRun tiered = run_engine(*model, 10, 120);
  for (PolicyKind kind : kPolicies) {
    ASSERT_EQ(resident.tokens.at(kind).size(), 5u) << policy_name(kind);
    EXPECT_EQ(tiered.tokens.at(kind), resident.tokens.at(kind)) << policy_name(kind);
  }
  EXPECT_EQ(resident.moved_in, 0);
  EXPECT_GT(tiered.demoted, 0);
  EXPECT_GT(tiered.moved_out, 0);
  // Promotions of written blocks, plus every decode step's reads of host blocks in place.
  EXPECT_GT(tiered.moved_in, tiered.moved_out);
  EXPECT_EQ(tiered.preempted, 0);
  std::printf("tiered: %.0f blocks demoted, %.0f bytes device->host, %.0f bytes host->device (%.1f s)\n",
              tiered.demoted, tiered.moved_out, tiered.moved_in,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

}  // namespace
}  // namespace fathom
