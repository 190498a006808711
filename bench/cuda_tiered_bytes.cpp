// Bytes one decode step moves from the host KV tier to the GPU on the CUDA backend, per policy,
// with the device tier holding the newest 1/8 of a sequence's blocks and the host tier the rest
// (page-locked host memory the kernels read in place over PCIe; docs/tiered_kv.md). Run on the
// CPU through kernels/cuda/emu: the host bytes are the kernels' own device counter (every row
// they read from the host tier), not a formula. Next to them: the KV bytes the step reads in all
// (the launchers' byte models), and dense's host bytes for scale.
//
// Per model: one CPU prefill of a --tokens prompt (f16 KV); its blocks are copied into the CUDA
// backend, the oldest 7/8 into the host tier; then each policy (kv_read_ratio 1/8, min_keys 0)
// decodes --steps greedy tokens from the same cache (the written block restored between policies).
// Then HiP again on a backend whose device tier also holds a row cache (kv_cache.hot_rows_percent)
// as large as the device's share of blocks: its selected host rows are copied in when the mask is
// estimated and read from the device until the next estimation.
//
//   cuda_tiered_bytes [--models models] [--tokens 2048] [--steps 8] [--device-fraction 0.125] [--out FILE]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "engine/backend/cpu/cpu_backend.h"
#include "engine/kv/block_allocator.h"
#include "engine/model/model.h"
#include "tests/kernel/cuda_backend_headers.h"

namespace fathom {
namespace {

const PolicyKind kKinds[] = {kDensePolicy, policy_kind("sparq"), policy_kind("hip"), policy_kind("alisa")};

struct PolicyBytes {
  PolicyKind kind;
  double host_mean = 0, host_max = 0;  // bytes read from the host tier per step
  double kv_mean = 0;                  // KV bytes read per step, both tiers (byte model)
};

struct ModelRun {
  std::string model;
  int32_t P = 0, device_blocks = 0, host_blocks = 0, cache_rows = 0;
  double seconds = 0;
  std::vector<PolicyBytes> policies;
};

ModelRun run_model(const std::string& dir, const std::string& file, int32_t tokens, int32_t steps, double device_fraction) {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<Model> model = Model::load(dir + "/" + file);
  ModelOptions o;
  o.threads = 2;
  o.kv_dtype = KvDtype::kF16;
  o.block_size = 16;
  const ModelConfig& c = model->config();
  const int32_t bs = o.block_size;
  std::string text;
  while (static_cast<int32_t>(model->tokenizer().encode(text).size()) < tokens)
    text += "The lighthouse keeper climbed the narrow stairs every evening and wrote down the weather. ";
  std::vector<int32_t> prompt = model->tokenizer().encode(text);
  prompt.resize(tokens);
  const int32_t P = tokens, full = P / bs;
  const int32_t blocks_needed = (P + steps) / bs + 2;
  const KvLayout layout{c.n_layers, c.n_kv_heads, c.head_dim, bs, o.kv_dtype, o.kv_transposed_k};
  o.kv_cache_bytes = static_cast<int64_t>(layout.block_bytes()) * (blocks_needed + 2);
  CpuBackend cpu(*model, o);

  // Prefill on the CPU; logical block i goes to host slot i when older than the device share.
  BlockAllocator blocks(cpu.kv_blocks(), bs);
  std::vector<int32_t> cpu_table;
  for (int32_t b = 0; b <= full; ++b) cpu_table.push_back(blocks.allocate());
  std::vector<float> logits;
  BatchPlan prefill;
  prefill.seqs.push_back(SeqStep{prompt, 0, &cpu_table, LogitsWanted::kLast});
  cpu.forward(prefill, logits);
  const int32_t vocab = model->vocab();
  const int32_t first = static_cast<int32_t>(std::max_element(logits.begin(), logits.begin() + vocab) - logits.begin());
  const int32_t device_share = std::max<int32_t>(1, static_cast<int32_t>(std::ceil((full + 1) * device_fraction)));
  const int32_t n_host = full + 1 - device_share;
  std::vector<std::byte> image(cpu.block_bytes()), last_image(cpu.block_bytes());
  ModelRun run{file, P, device_share, n_host, device_share * bs, 0, {}};
  // A CUDA backend holding the prefilled cache, with `cache_slots` more device blocks as its row cache.
  std::vector<int32_t> table;  // physical: device slots, host slots -(slot + 1)
  auto make = [&](int32_t cache_slots) {
    ModelOptions oc = o;
    // The budget also pays for the device copy of the cache's map (hot_rows_map_blocks).
    const int32_t map = cache_slots > 0 ? hot_rows_map_blocks(layout, blocks_needed) : 0;
    const int32_t keep = blocks_needed + 2, budget = keep + cache_slots + map;
    oc.kv_cache_bytes = static_cast<int64_t>(layout.block_bytes()) * budget;
    const int32_t spare = std::max(budget - keep, budget / 4);  // hot_rows_slots' rule, inverted
    oc.hot_rows_percent = ((cache_slots + map) * 100 + spare - 1) / spare;
    FATHOM_CHECK(hot_rows_slots(budget, keep, oc.hot_rows_percent) == cache_slots + map);
    std::unique_ptr<Backend> cuda = make_cuda_backend(*model, oc);
    if (cuda->reserve_host_tier(blocks_needed, keep) != blocks_needed) throw Error("no host tier");
    table.clear();
    int32_t next_device = 0;
    for (int32_t b = 0; b <= full; ++b) {
      cpu.read_block(cpu_table[b], image.data());
      if (b < n_host) {
        cuda->write_block(0, image.data());  // through device slot 0, then moved
        cuda->copy_slot(KvTier::kDevice, 0, KvTier::kHost, b);
        table.push_back(-b - 1);
      } else {
        cuda->write_block(++next_device, image.data());
        table.push_back(next_device);
      }
    }
    while (static_cast<int32_t>(table.size()) * bs < P + steps + 1) table.push_back(++next_device);
    cpu.read_block(cpu_table[full], last_image.data());
    return cuda;
  };

  auto measure = [&](Backend* cuda, PolicyKind kind) {
    cuda->write_block(table[full], last_image.data());  // the written block as the prefill left it
    AttentionPolicy policy;
    policy.kind = kind;
    policy.kv_read_ratio = 0.125;
    policy.min_keys = 0;
    SeqPolicyState state;
    int32_t token = first;
    PolicyBytes pb{kind};
    for (int32_t step = 0; step < steps; ++step) {
      BatchPlan plan;
      plan.seqs.push_back(SeqStep{std::span<const int32_t>(&token, 1), P + step, &table, LogitsWanted::kLast, &policy, &state});
      const StepStats stats = cuda->forward(plan, logits);
      token = static_cast<int32_t>(std::max_element(logits.begin(), logits.begin() + vocab) - logits.begin());
      const double host = static_cast<double>(stats.staged_bytes);
      pb.host_mean += host / steps;
      pb.host_max = std::max(pb.host_max, host);
      pb.kv_mean += static_cast<double>(stats.kv_read[static_cast<int>(kind)]) / steps;
    }
    std::fprintf(stderr, "%s %s: %.2f MB/step from the host tier\n", file.c_str(), policy_name(kind), pb.host_mean / 1e6);
    run.policies.push_back(pb);
  };
  {
    std::unique_ptr<Backend> cuda = make(0);
    for (PolicyKind kind : kKinds) measure(cuda.get(), kind);
  }
  measure(make(device_share).get(), policy_kind("hip"));
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return run;
}

}  // namespace
}  // namespace fathom

int main(int argc, char** argv) {
  using namespace fathom;
  int32_t tokens = 2048, steps = 8;
  double device_fraction = 0.125;
  std::string out_path, dir = "models";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--tokens" && i + 1 < argc) tokens = std::atoi(argv[++i]);
    else if (a == "--steps" && i + 1 < argc) steps = std::atoi(argv[++i]);
    else if (a == "--device-fraction" && i + 1 < argc) device_fraction = std::atof(argv[++i]);
    else if (a == "--out" && i + 1 < argc) out_path = argv[++i];
    else if (a == "--models" && i + 1 < argc) dir = argv[++i];
    else {
      std::fprintf(stderr, "usage: cuda_tiered_bytes [--models DIR] [--tokens N] [--steps N] [--device-fraction F] [--out FILE]\n");
      return 2;
    }
  }
  try {
    std::ostringstream md;
    md << "# Host-tier bytes per decode step on the CUDA backend (emulated)\n\n"
       << "Generated by `build/cuda_tiered_bytes --tokens " << tokens << " --steps " << steps << " --device-fraction "
       << device_fraction << "` (bench/cuda_tiered_bytes.cpp) on the CPU through kernels/cuda/emu. One sequence of "
       << tokens << " prompt tokens (f16 KV, block 16); the device tier holds its newest " << device_fraction
       << " of blocks, the host tier (mapped pinned memory, read in place by the kernels) the rest. Each policy at "
       << "kv_read_ratio 1/8, min_keys 0, decodes " << steps << " greedy tokens from the same cache. *Host bytes*: "
       << "what the kernels' device counter saw read from the host tier (the PCIe traffic on a GPU); *KV bytes*: "
       << "the step's KV reads over both tiers (the launchers' byte models). HiP re-estimates its mask every 4th "
       << "step (the max column). *PCIe ms* is derived: host bytes at 25 GB/s (PCIe 4.0 x16 in practice). The last "
       << "row: HiP again with a device row cache as large as the device's share of blocks (rows per layer and kv "
       << "head): the rows its mask selects are copied in when it is estimated (counted as host bytes) and read "
       << "from the device until the next estimation.\n\n";
    for (const char* file : {"smollm2-135m-instruct-q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"}) {
      const ModelRun r = run_model(dir, file, tokens, steps, device_fraction);
      md << "## " << r.model << "\n\n" << r.device_blocks << " device blocks, " << r.host_blocks
         << " host blocks; the run took " << static_cast<int>(r.seconds) << " s under the emulator.\n\n"
         << "| policy | host bytes / step (mean) | max | vs dense | KV bytes / step | PCIe ms / step (derived) |\n"
         << "|---|---|---|---|---|---|\n";
      const double dense = r.policies.front().host_mean;
      for (size_t i = 0; i < r.policies.size(); ++i) {
        const PolicyBytes& p = r.policies[i];
        const std::string name = i < std::size(kKinds) ? policy_name(p.kind)
                                                       : "hip, row cache of " + std::to_string(r.cache_rows) + " rows";
        char line[256];
        std::snprintf(line, sizeof(line), "| %s | %.2f MB | %.2f MB | %.3f | %.2f MB | %.3f |\n", name.c_str(),
                      p.host_mean / 1e6, p.host_max / 1e6, dense > 0 ? p.host_mean / dense : 0.0, p.kv_mean / 1e6,
                      p.host_mean / 25e9 * 1e3);
        md << line;
      }
      md << "\n";
    }
    std::printf("%s", md.str().c_str());
    if (!out_path.empty()) std::ofstream(out_path) << md.str();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_tiered_bytes: %s\n", e.what());
    return 1;
  }
  return 0;
}
