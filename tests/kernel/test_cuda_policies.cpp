// Greedy decode on the CUDA backend (run on the CPU through kernels/cuda/emu) equals the CPU
// backend's, token for token, for every policy the CUDA backend implements, and bifurcated
// groups (CUDA) equal ungrouped attention (CPU).
//
// One batched run per model: the prompt (~400 tokens, long enough that SparQ and HiP at
// kv_read_ratio 1/8 select a part of the keys) is prefilled once on the CPU and its blocks are
// copied into the CUDA backend's storage (the two backends' block images are the same bytes), so
// both decode from the same cache. Then 5 sequences decode kSteps (5) steps in one plan per step on each
// backend: dense, sparq, hip, swa, and a second dense one; sequence i starts from the i-th best
// first token, so all diverge. All 5 share the prompt's full blocks; each has its own copy of the
// partial last block (copy-on-write, as a fork). On the CUDA side the 2 dense sequences form a
// bifurcated group (the shared prompt read once for both); the CPU side runs no groups.
// Every sequence feeds back the CPU's greedy token (so one different pick does not compound); a
// step passes when both backends pick the same token for every sequence, except HiP after a step
// whose masks differ by a near-tie (below), where the CUDA pick must be the CPU's second.
// Precision: CPU f32 activations (Precision::kF32), f16 KV on both sides; the CUDA backend rounds
// GEMM inputs to f16, so logits differ by NMSE ~1e-6 (test_cuda_forward) — far below the margins
// of greedy picks on these prompts, checked by printing each step's smallest top-2 margin. The
// sparse policies' selections can flip where two candidates score within that rounding (SmolLM2
// here: SparQ up to NMSE 5e-4 at a step, dense-only steps 1.5e-5), so the NMSE is printed, not
// bounded; the picks are what must agree.
#include "engine/attention/policies/alisa.h"
#include "engine/attention/policies/hip.h"
#include "tests/kernel/cuda_backend_headers.h"
#include "tests/kernel/shared_prefill.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <span>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "engine/attention/groups.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/engine.h"
#include "engine/kv/block_allocator.h"
#include "engine/metrics.h"
#include "engine/model/model.h"

namespace fathom {
namespace {

constexpr int kSeqs = 5;
constexpr int kSteps = 5;  // every HiP layer estimated twice (R = 4, staggered); ~2 s a step under the emulator
// The engine runs and the host-wait count below compare the CUDA backend with itself (tiers,
// recompute, waits), not with the CPU: they run on SmolLM2's small random-weight sibling
// (scripts/make_small_model.py: the same tokenizer and token counts, ~15x less to emulate).
const std::string kSmallModel = std::string(FATHOM_MODELS_DIR) + "/smollm2-vocab-small-random.gguf";

std::vector<int32_t> ranked(const float* row, int32_t n, int32_t top) {
  std::vector<int32_t> ids(n);
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + top, ids.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
  ids.resize(top);
  return ids;
}

void compare_policies(const std::string& file, int steps) {
  const auto t0 = std::chrono::steady_clock::now();
  ModelOptions o;
  o.threads = 2;
  o.precision = cpu::Precision::kF32;
  o.kv_dtype = KvDtype::kF16;
  o.block_size = 16;
  std::unique_ptr<Model> model = Model::load(std::string(FATHOM_MODELS_DIR) + "/" + file);
  const ModelConfig& c = model->config();
  const KvLayout layout{c.n_layers, c.n_kv_heads, c.head_dim, o.block_size, o.kv_dtype, o.kv_transposed_k};
  o.kv_cache_bytes = static_cast<int64_t>(layout.block_bytes()) * 64;
  CpuBackend cpu(*model, o);
  std::unique_ptr<Backend> cuda = make_cuda_backend(*model, o);
  ASSERT_EQ(cpu.block_bytes(), cuda->block_bytes()) << "the block images must be the same bytes";
  for (PolicyKind k : {kDensePolicy, policy_kind("sparq"), policy_kind("hip"), policy_kind("alisa")})
    EXPECT_TRUE(cuda->implements(k)) << policy_name(k);  // auto resolves to one of these before the backend
  BlockAllocator blocks(cpu.kv_blocks(), o.block_size);
  const int32_t vocab = model->vocab(), bs = o.block_size;

  std::string text;
  while (model->tokenizer().encode(text).size() < 400)
    text += "The lighthouse keeper climbed the narrow stairs every evening, carried a can of oil and a notebook, "
            "and wrote down the weather, the ships that passed and the birds that nested on the rocks below. ";
  std::vector<int32_t> prompt = model->tokenizer().encode(text);
  prompt.resize(405);  // 25 full blocks and a partial one
  const int32_t P = static_cast<int32_t>(prompt.size()), full = P / bs;

  // Prefill on the CPU; the prompt's blocks are then copied into the CUDA storage.
  std::vector<float> logits;
  const std::vector<int32_t> prompt_table = testing::prefill_and_copy(cpu, *cuda, blocks, prompt, logits);
  const std::vector<int32_t> first = ranked(logits.data(), vocab, kSeqs);

  // Sequences: the full prompt blocks shared, the partial one copied, room for `steps` more.
  AttentionPolicy dense, sparq, hip, swa;
  sparq.kind = policy_kind("sparq");
  hip.kind = policy_kind("hip");
  swa.kind = policy_kind("alisa");
  for (AttentionPolicy* p : {&dense, &sparq, &hip, &swa}) p->min_keys = 0;  // sparse at 405 keys on both backends
  const AttentionPolicy* policy[kSeqs] = {&dense, &sparq, &hip, &swa, &dense};
  std::vector<std::vector<int32_t>> tables(kSeqs);
  for (int i = 0; i < kSeqs; ++i) {
    tables[i].assign(prompt_table.begin(), prompt_table.begin() + full);
    tables[i].push_back(blocks.allocate());
    cpu.copy_block(prompt_table[full], tables[i].back());
    cuda->copy_block(prompt_table[full], tables[i].back());
    while (static_cast<int32_t>(tables[i].size()) * bs < P + steps + 1) tables[i].push_back(blocks.allocate());
  }
  std::vector<SeqPolicyState> cpu_state(kSeqs), cuda_state(kSeqs);
  std::vector<int32_t> token(first);  // both backends' current token per sequence (equal while they agree)
  std::vector<std::vector<int32_t>> generated(kSeqs);
  int grouped_steps = 0, hip_tokens_differing = 0;
  size_t hip_blocks = 0, hip_blocks_differing = 0;
  double worst_nmse = 0, worst_hip_nmse = 0, smallest_margin = 1e30;  // HiP after masks differ: apart
  StepStats cpu_stats, cuda_stats;  // summed over the decode steps
  for (int step = 0; step < steps; ++step) {
    BatchPlan plan;
    for (int i = 0; i < kSeqs; ++i)
      plan.seqs.push_back(SeqStep{std::span<const int32_t>(&token[i], 1), P + step, &tables[i], LogitsWanted::kLast,
                                  policy[i], &cpu_state[i]});
    std::vector<float> cpu_logits, cuda_logits;
    cpu_stats += cpu.forward(plan, cpu_logits);
    for (int i = 0; i < kSeqs; ++i) plan.seqs[i].policy_state = &cuda_state[i];
    plan.groups = find_attention_groups(plan, bs, GroupRule{2, 16});
    grouped_steps += !plan.groups.empty();
    cuda_stats += cuda->forward(plan, cuda_logits);
    // HiP's masks: every layer estimated at the same positions on both backends (the refresh
    // schedule), over the same blocks up to near-ties. The backends' q and K differ by rounding, and
    // the estimate ranks halves whose scores can be closer than that (SmolLM2 here: the 18th and
    // 19th best of 36 halves 8e-5 apart, relative), so a block may differ; that changes the next
    // layers' q, and their masks differ more (up to 36 of 162 blocks in a layer), and a token may
    // differ. Counted over the run, bounded at the end.
    // The layers take turns to refresh (decode_attention.h): after the first step, which estimates
    // every HiP layer, no step estimates more than ⌈n / R⌉ of them.
    bool masks_differ = false;
    for (int i = 0; i < kSeqs; ++i) {
      if (policy[i]->kind != policy_kind("hip")) continue;
      int32_t hip_layers = 0, estimated_now = 0;
      for (size_t l = 0; l < cpu_state[i].layers.size(); ++l) {
        using cuda_backend_detail::hip_cuda::HipDeviceMask;
        const auto* got = dynamic_cast<const HipDeviceMask*>(cuda_state[i].layers[l].backend.get());
        const auto* cpu_hip = find_layer_state<hip::LayerState>(cpu_state[i].layers[l]);
        const auto* cuda_hip = find_layer_state<hip::LayerState>(cuda_state[i].layers[l]);
        if (got == nullptr) {  // a layer HiP leaves dense, on both backends
          EXPECT_EQ(cpu_hip, nullptr) << "layer " << l;
          continue;
        }
        ASSERT_NE(cpu_hip, nullptr);
        ASSERT_NE(cuda_hip, nullptr);
        const ref::HipMask& want = cpu_hip->mask;
        ++hip_layers;
        estimated_now += want.pos == P + step;
        ASSERT_EQ(cuda_hip->mask.pos, want.pos) << "layer " << l << " step " << step;
        if (want.dense) continue;
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        std::vector<int32_t> starts(got->n);
        ASSERT_EQ(cudaMemcpy(starts.data(), got->starts.get(), starts.size() * sizeof(int32_t), cudaMemcpyDeviceToHost),
                  cudaSuccess);
        const size_t keep = want.block_starts[0].size();
        ASSERT_EQ(starts.size(), want.block_starts.size() * keep);
        size_t differ = 0;
        for (size_t h = 0; h < want.block_starts.size(); ++h)
          for (size_t x = 0; x < keep; ++x) {
            if (x > 0) {
              EXPECT_LT(starts[h * keep + x - 1], starts[h * keep + x]) << "layer " << l << ": distinct, ascending";
            }
            const std::vector<int32_t>& cpu_blocks = want.block_starts[h];
            differ += !std::binary_search(cpu_blocks.begin(), cpu_blocks.end(), starts[h * keep + x]);
          }
        masks_differ = masks_differ || differ > 0;
        hip_blocks_differing += differ;
        hip_blocks += starts.size();
      }
      const int32_t R = policy[i]->integer(hip::kRefresh);
      if (step == 0) EXPECT_EQ(estimated_now, hip_layers) << "the first step estimates every HiP layer";
      else EXPECT_LE(estimated_now, (hip_layers + R - 1) / R) << "step " << step << ": the layers take turns";
    }
    ASSERT_EQ(cpu_logits.size(), cuda_logits.size());
    for (int i = 0; i < kSeqs; ++i) {
      const float* a = &cpu_logits[static_cast<size_t>(i) * vocab];
      const float* b = &cuda_logits[static_cast<size_t>(i) * vocab];
      double num = 0, den = 0;
      for (int32_t k = 0; k < vocab; ++k) {
        num += (a[k] - b[k]) * static_cast<double>(a[k] - b[k]);
        den += a[k] * static_cast<double>(a[k]);
      }
      const bool near_tie = policy[i]->kind == policy_kind("hip") && masks_differ;
      (near_tie ? worst_hip_nmse : worst_nmse) = std::max(near_tie ? worst_hip_nmse : worst_nmse, num / den);
    }
    for (int i = 0; i < kSeqs; ++i) {
      const float* a = &cpu_logits[static_cast<size_t>(i) * vocab];
      const std::vector<int32_t> top = ranked(a, vocab, 2);
      const int32_t mine = ranked(&cuda_logits[static_cast<size_t>(i) * vocab], vocab, 1)[0];
      smallest_margin = std::min<double>(smallest_margin, a[top[0]] - a[top[1]]);
      if (policy[i]->kind == policy_kind("hip") && masks_differ && mine != top[0]) {  // a near-tie's block, above
        EXPECT_EQ(mine, top[1]) << "step " << step << ": HiP's token is the CPU's second";
        ++hip_tokens_differing;
        token[i] = top[0];
        generated[i].push_back(top[0]);
        continue;
      }
      ASSERT_EQ(mine, top[0]) << file << " sequence " << i << " (" << policy[i]->name() << ") step " << step
                              << ": CPU top-2 margin " << a[top[0]] - a[top[1]];
      token[i] = top[0];
      generated[i].push_back(top[0]);
    }
  }
  EXPECT_EQ(grouped_steps, steps) << "every CUDA step ran the dense sequences as a bifurcated group";
  EXPECT_GT(cpu_stats.kv_read[policy_kind("sparq")], 0);
  const KvReadBytes& cuda_read = cuda_stats.kv_read;
  for (PolicyKind k : {policy_kind("sparq"), policy_kind("hip"), policy_kind("alisa")})
    EXPECT_GT(cuda_read[static_cast<int>(k)], 0) << policy_name(k) << " ran on the CUDA backend";
  for (int i = 0; i < kSeqs; ++i)
    std::printf("%s %s: %s\n", file.c_str(), policy[i]->name().c_str(),
                model->tokenizer().decode(generated[i]).c_str());
  EXPECT_LE(hip_blocks_differing * 16, hip_blocks) << "HiP's masks differ beyond near-ties";
  EXPECT_LE(hip_tokens_differing * 4, steps) << "HiP's tokens differ beyond its masks' near-ties";
  std::printf("%s: %d steps x %d sequences, HiP %d tokens different (%zu of %zu mask blocks); worst logits NMSE "
              "%.2e (HiP after a near-tie %.2e), smallest CPU top-2 margin %.3f; %.1f s\n",
              file.c_str(), steps, kSeqs, hip_tokens_differing, hip_blocks_differing, hip_blocks, worst_nmse,
              worst_hip_nmse, smallest_margin,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

TEST(CudaPolicies, SmolLM2GreedyEqualsCpuForEveryPolicyAndGroups) {
  compare_policies("smollm2-135m-instruct-q4_1.gguf", kSteps);
}

TEST(CudaPolicies, Gemma3GreedyEqualsCpuForEveryPolicyAndGroups) {
  compare_policies("gemma-3-270m-q4_k_m.gguf", kSteps);
}


// A fork copies a sequence's policy state: the device-resident parts are copied too (their own
// buffers, the same bytes), and later steps of either sequence leave the other's alone.
TEST(CudaPolicies, ForkedStateOwnsACopyOfTheDeviceMass) {
  using cuda_backend_detail::alisa_cuda::SwaDeviceMass;
  LayerPolicyState a;
  SwaDeviceMass& mass = state_of<SwaDeviceMass>(a.backend);
  mass.grow_to(3000, nullptr);  // past the first capacity: a grown buffer
  std::vector<float> values(3000);
  std::iota(values.begin(), values.end(), 1.0f);
  ASSERT_EQ(cudaMemcpy(mass.get(), values.data(), values.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  LayerPolicyState b = a;  // the fork
  auto* copy = dynamic_cast<SwaDeviceMass*>(b.backend.get());
  ASSERT_NE(copy, nullptr);
  ASSERT_NE(copy->get(), mass.get());
  EXPECT_EQ(copy->n, 3000);
  ASSERT_EQ(cuda::swa_fold(mass.get(), 3000, 0.5f, nullptr, nullptr, 0, nullptr), cudaSuccess);  // a step of a
  std::vector<float> got_a(3000), got_b(3000);
  cudaMemcpy(got_a.data(), mass.get(), got_a.size() * sizeof(float), cudaMemcpyDeviceToHost);
  cudaMemcpy(got_b.data(), copy->get(), got_b.size() * sizeof(float), cudaMemcpyDeviceToHost);
  EXPECT_EQ(got_b, values);
  EXPECT_EQ(got_a[10], values[10] * 0.5f);
  b.backend = {};  // b finishes: a's mass is still there
  cudaMemcpy(got_a.data(), mass.get(), sizeof(float), cudaMemcpyDeviceToHost);
  EXPECT_EQ(got_a[0], 0.5f);
}

// SWA keeps its mass and HiP its mask on the device (kernels/cuda/swa_mass.h, HipDeviceMask), and
// SparQ selects there: a decode step of a sparse sequence makes the host wait for the device
// exactly as often as a dense one (the step's uploads and its logits' copy), not once more per layer for SWA's kept
// weights or HiP's mask. Counted by the emulator (fathom_emu::host_waits) over the 3 steps after
// the first (SWA's seeding step; HiP estimates at the first and the fourth), one sequence at a
// time, the same prompt.
TEST(CudaPolicies, SparseStepsWaitOnTheDeviceNoMoreThanDense) {
  ModelOptions o;
  o.threads = 2;
  o.precision = cpu::Precision::kF32;
  o.kv_dtype = KvDtype::kF16;
  o.block_size = 16;
  std::unique_ptr<Model> model = Model::load(kSmallModel);
  const ModelConfig& c = model->config();
  const KvLayout layout{c.n_layers, c.n_kv_heads, c.head_dim, o.block_size, o.kv_dtype, o.kv_transposed_k};
  o.kv_cache_bytes = static_cast<int64_t>(layout.block_bytes()) * 32;
  CpuBackend cpu(*model, o);
  std::unique_ptr<Backend> cuda = make_cuda_backend(*model, o);
  BlockAllocator blocks(cpu.kv_blocks(), o.block_size);
  std::vector<int32_t> prompt = model->tokenizer().encode(
      "The lighthouse keeper climbed the narrow stairs every evening and wrote down the weather, the ships "
      "that passed and the birds that nested on the rocks below. One night the lamp went out.");
  while (prompt.size() < 300) prompt.insert(prompt.end(), prompt.begin(), prompt.begin() + 20);
  prompt.resize(300);
  std::vector<float> logits;
  const std::vector<int32_t> prompt_table = testing::prefill_and_copy(cpu, *cuda, blocks, prompt, logits);
  AttentionPolicy dense, sparq, hip, swa;
  sparq.kind = policy_kind("sparq");
  hip.kind = policy_kind("hip");
  swa.kind = policy_kind("alisa");
  sparq.min_keys = hip.min_keys = swa.min_keys = 0;
  std::map<std::string, uint64_t> waits;
  StepStats read_stats;
  for (const AttentionPolicy* policy : {&dense, &sparq, &hip, &swa}) {
    std::vector<int32_t> table(prompt_table.begin(), prompt_table.end() - 1);
    table.push_back(blocks.allocate());
    cuda->copy_block(prompt_table.back(), table.back());
    table.push_back(blocks.allocate());
    SeqPolicyState state;
    int32_t token = 42;
    for (int step = 0; step < 4; ++step) {
      BatchPlan plan;
      plan.seqs.push_back(SeqStep{std::span<const int32_t>(&token, 1), static_cast<int32_t>(prompt.size()) + step, &table,
                                  LogitsWanted::kLast, policy, &state});
      const uint64_t before = fathom_emu::host_waits().load();
      std::vector<float> out;
      read_stats += cuda->forward(plan, out);
      if (step > 0) waits[policy->name()] += fathom_emu::host_waits().load() - before;  // step 0 seeds SWA's mass
    }
    for (size_t b = prompt_table.size() - 1; b < table.size(); ++b) blocks.release(table[b]);
  }
  const KvReadBytes& read = read_stats.kv_read;
  EXPECT_GT(waits["dense"], 0u) << "a step copies its logits to the host";
  for (PolicyKind k : {policy_kind("sparq"), policy_kind("hip"), policy_kind("alisa")}) {
    EXPECT_GT(read[static_cast<int>(k)], 0) << policy_name(k) << " ran its sparse kernels";
    EXPECT_EQ(waits[policy_name(k)], waits["dense"]) << policy_name(k);
    std::printf("host waits over 3 decode steps: dense %llu, %s %llu\n", static_cast<unsigned long long>(waits["dense"]),
                policy_name(k), static_cast<unsigned long long>(waits[policy_name(k)]));
  }
}

// ---- The host KV tier end to end ------------------------------------------------------------
// The CUDA backend's host KV tier, end to end: the engine (scheduler, page table, block moves)
// over the CUDA backend run on the CPU through kernels/cuda/emu, with a device tier far smaller
// than the sequences' KV. The host tier is page-locked host memory the kernels read in place
// (negative block table entries); moves between the tiers are async copies on a non-blocking copy
// stream, which the emulator defers until something waits for them — so a pass that did not
// wait for a promotion would read stale bytes here, as it would on a GPU.
//
// One request per policy (dense, SparQ, HiP, SWA at kv_read_ratio 1/8, min_keys 0), one after
// the other in one engine, over prompts that share a ~140-token prefix (the prefix cache's blocks,
// in either tier, are reused by the later ones) and end in their own ~20 tokens: every request's
// greedy tokens with 6 device blocks for the page table (a prompt needs ~11) and 4 more as a row
// cache (HiP's and SWA's selected host rows) equal the all-resident run's. Requests
// run alone, so both runs make the same passes (the CUDA backend's matmul path depends on a pass's
// rows) and the kernels read the same bytes: bitwise equal logits. The emulated prefill is what
// costs, then ~0.6 s a decode step. (In this file to share its compilation of the backend: ctest
// runs it as test_cuda_tiered_engine.)

const PolicyKind kPolicies[] = {kDensePolicy, policy_kind("sparq"), policy_kind("hip"), policy_kind("alisa")};

struct EngineRun {
  std::map<PolicyKind, std::vector<int32_t>> tokens;
  double moved_in = 0, moved_out = 0, demoted = 0, preempted = 0, hip_hits = 0, hip_misses = 0, swa_hits = 0;
  double dropped = 0, recomputed = 0;
};

EngineRun run_engine(const Model& model, int64_t device_blocks, int64_t host_blocks, int32_t hot_rows_percent = 0,
                     std::span<const PolicyKind> kinds = kPolicies,
                     SchedulerConfig::Recompute recompute = SchedulerConfig::Recompute::kAuto) {
  ModelOptions o;
  o.threads = 2;
  o.block_size = 16;
  o.hot_rows_percent = hot_rows_percent;
  const ModelConfig& c = model.config();
  const KvLayout layout{c.n_layers, c.n_kv_heads, c.head_dim, o.block_size, o.kv_dtype, o.kv_transposed_k};
  o.kv_cache_bytes = static_cast<int64_t>(layout.block_bytes()) * device_blocks;
  std::unique_ptr<Backend> backend = make_cuda_backend(model, o);
  MetricsRegistry metrics;
  SchedulerConfig cfg;
  cfg.host_kv_bytes = static_cast<int64_t>(layout.block_bytes()) * host_blocks;
  cfg.max_batched_tokens = 32;  // a step writes at most 2 + 2 blocks
  cfg.max_num_seqs = 1;
  cfg.recompute = recompute;
  Engine engine(model, *backend, cfg, metrics);
  EXPECT_EQ(engine.kv_capacity().host_blocks, host_blocks);

  std::string prefix;
  for (int i = 0; i < 12; ++i) prefix += "Line " + std::to_string(i) + ": the robot counted gears. ";
  EngineRun out;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(10);
  for (PolicyKind kind : kinds) {
    Request r;
    r.prompt = model.tokenizer().encode(prefix + "Question about " + policy_name(kind) +
                                        ": how many gears did the robot count on line seven, and why?");
    r.sampling.temperature = 0;
    r.max_tokens = 5;  // a HiP mask estimated (refresh 4), reused, estimated again
    r.stop.ignore_eos = true;
    r.attention.kind = kind;
    r.attention.kv_read_ratio = 0.125;
    r.attention.min_keys = 0;
    if (kind == policy_kind("alisa")) r.attention.set(alisa::kRatio, 0.25);  // below its 256-key floor
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
  out.hip_hits = metrics.counter("fathom_kv_hot_rows_total", "", {{"policy", "hip"}, {"result", "hit"}}).value();
  out.hip_misses = metrics.counter("fathom_kv_hot_rows_total", "", {{"policy", "hip"}, {"result", "miss"}}).value();
  out.swa_hits = metrics.counter("fathom_kv_hot_rows_total", "", {{"policy", "alisa"}, {"result", "hit"}}).value();
  out.dropped = metrics.counter("fathom_kv_blocks_dropped_total", "").value();
  out.recomputed = metrics.counter("fathom_kv_dropped_tokens_recomputed_total", "").value();
  return out;
}

TEST(CudaTieredEngine, PoliciesOverTheHostTierMatchResident) {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<Model> model = Model::load(kSmallModel);
  const EngineRun resident = run_engine(*model, 200, 0);
  // 12 device blocks: 6 for the page table, 4 (64 rows per layer and kv head) for the hot-row cache and
  // 2 for the device copy of its map.
  const EngineRun tiered = run_engine(*model, 12, 120, /*hot_rows_percent=*/75);
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
  // HiP's rows: copied into the hot-row cache when its mask is estimated, hits on the steps that reuse it.
  EXPECT_GT(tiered.hip_misses, 0);
  EXPECT_GT(tiered.hip_hits, tiered.hip_misses);
  EXPECT_GT(tiered.swa_hits, 0);  // its kept set after the seeding step (which keeps all, read in place)
  std::printf("tiered: %.0f blocks demoted, %.0f bytes device->host, %.0f bytes host->device, HiP rows %.0f hits "
              "%.0f misses, SWA %.0f hits (%.1f s)\n",
              tiered.demoted, tiered.moved_out, tiered.moved_in, tiered.hip_hits, tiered.hip_misses, tiered.swa_hits,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

// Cache-or-recompute on the CUDA backend: blocks in the host tier are dropped (recompute preferred
// to the host tier, as the cost model picks where recomputing is cheaper) and every step computes
// them again into the scratch, which each layer's kernels find through their own translation of
// the block tables. Dense and HiP give the resident run's tokens.
TEST(CudaTieredEngine, DroppedBlocksRecomputeToTheResidentTokens) {
  std::unique_ptr<Model> model = Model::load(kSmallModel);
  const PolicyKind kinds[] = {kDensePolicy, policy_kind("hip")};
  const EngineRun resident = run_engine(*model, 200, 0, 0, kinds);
  const EngineRun dropped = run_engine(*model, 8, 120, 0, kinds, SchedulerConfig::Recompute::kAlways);
  for (PolicyKind kind : kinds) {
    ASSERT_EQ(resident.tokens.at(kind).size(), 5u) << policy_name(kind);
    EXPECT_EQ(dropped.tokens.at(kind), resident.tokens.at(kind)) << policy_name(kind);
  }
  EXPECT_GT(dropped.dropped, 0);
  EXPECT_GT(dropped.recomputed, 0);
  EXPECT_EQ(dropped.preempted, 0);
  std::printf("cuda cache-or-recompute: %.0f blocks dropped, %.0f tokens recomputed\n", dropped.dropped,
              dropped.recomputed);
}

}  // namespace
}  // namespace fathom
