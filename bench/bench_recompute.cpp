// What cache-or-recompute costs on the CPU backend (docs/tiered_kv.md, "Cache or recompute"):
//  1. one greedy request whose KV outgrows both tiers by D tokens: its decode steps each
//     recompute D tokens; the time per token over its last tokens (D dropped throughout) against
//     the same request all-resident, and against the start-up cost model's prediction;
//  2. two requests that together outgrow both tiers: wall time and the later request's end-to-end
//     time with recompute (auto) against preemption (off), alternating rounds.
//
//   bench_recompute [--threads 2] [--rounds 2] [--out bench/results/recompute.md] MODEL.gguf
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "engine/backend/backend.h"
#include "engine/engine.h"
#include "engine/metrics.h"
#include "engine/model/model.h"

namespace fathom {
namespace {

using Clock = std::chrono::steady_clock;

struct Run {
  std::vector<std::vector<double>> token_times;  // per request: seconds since submission, per token
  double wall = 0;
  double dropped_blocks = 0, preemptions = 0, restored = 0;
  RecomputeModel model;
};

// Runs `requests` on a fresh engine whose KV holds `capacity_blocks` blocks over both tiers (0: all
// resident), the device tier `device_blocks` of them.
Run run(const Model& model, int threads, const std::vector<Request>& requests, int32_t device_blocks,
        int32_t capacity_blocks, SchedulerConfig::Recompute recompute) {
  ModelOptions o;
  o.threads = threads;
  o.block_size = 16;
  const KvLayout layout{model.config().n_layers, model.config().n_kv_heads, model.config().head_dim, 16, o.kv_dtype,
                        o.kv_transposed_k};
  const int64_t block_bytes = static_cast<int64_t>(layout.block_bytes());
  SchedulerConfig cfg;
  cfg.max_batched_tokens = 512;
  cfg.max_num_seqs = 4;
  cfg.recompute = recompute;
  int32_t host = 0;
  if (capacity_blocks > 0) {  // the device tier loses blocks to its caches: size the host tier after
    o.kv_cache_bytes = block_bytes * device_blocks;
    for (int pass = 0; pass < 2; ++pass) {
      cfg.host_kv_bytes = block_bytes * std::max(host, 1);
      std::unique_ptr<Backend> probe = make_backend(model, o);
      MetricsRegistry m;
      Engine e(model, *probe, cfg, m);
      host = capacity_blocks - e.kv_capacity().device_blocks;
    }
    if (host < 1) throw Error("the device tier alone holds the capacity asked for");
    cfg.host_kv_bytes = block_bytes * host;
  }
  std::unique_ptr<Backend> backend = make_backend(model, o);
  MetricsRegistry metrics;
  Engine engine(model, *backend, cfg, metrics);
  if (capacity_blocks > 0) {
    const Engine::KvCapacity kv = engine.kv_capacity();
    if (kv.device_blocks + kv.host_blocks != capacity_blocks) throw Error("capacity not as asked");
  }
  Run r;
  r.model = engine.kv_capacity().recompute;
  const auto t0 = Clock::now();
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (const Request& q : requests) handles.push_back(engine.submit(q));
  r.token_times.resize(requests.size());
  for (size_t i = 0; i < handles.size(); ++i) {
    StreamEvent ev;
    while (!handles[i]->done()) {
      if (!handles[i]->next(ev, std::chrono::milliseconds(200))) continue;
      if (!ev.error.empty()) throw Error("request failed: " + ev.error);
      for (size_t t = 0; t < ev.token_ids.size(); ++t)
        r.token_times[i].push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
  }
  r.wall = std::chrono::duration<double>(Clock::now() - t0).count();
  r.dropped_blocks = metrics.counter("fathom_kv_blocks_dropped_total", "").value();
  r.restored = metrics.counter("fathom_kv_blocks_restored_total", "").value();
  r.preemptions = metrics.counter("fathom_preemptions_total", "", {{"mode", "recompute"}}).value();
  return r;
}

// Mean seconds per token over the last `n` tokens of one request (events of a request arrive as
// its tokens are made; the collector drains them in request order, so only the last request's
// times are exact: single-request runs use this).
double tail_seconds_per_token(const std::vector<double>& times, size_t n) {
  n = std::min(n, times.size() - 1);
  return (times.back() - times[times.size() - 1 - n]) / static_cast<double>(n);
}

Request greedy(const Model& m, const std::string& text, int32_t max_tokens) {
  Request r;
  r.prompt = m.tokenizer().encode(text);
  r.sampling.temperature = 0;
  r.max_tokens = max_tokens;
  r.stop.ignore_eos = true;
  return r;
}

std::string words(int n, const std::string& what) {
  std::string s;
  for (int i = 0; i < n; ++i) s += what + " " + std::to_string(i) + " turns a wheel. ";
  return s;
}

}  // namespace
}  // namespace fathom

int main(int argc, char** argv) {
  using namespace fathom;
  int threads = 2, rounds = 2;
  std::string out = "bench/results/recompute.md", path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) threads = std::atoi(argv[++i]);
    else if (a == "--rounds" && i + 1 < argc) rounds = std::atoi(argv[++i]);
    else if (a == "--out" && i + 1 < argc) out = argv[++i];
    else path = a;
  }
  if (path.empty()) {
    std::fprintf(stderr, "usage: bench_recompute [--threads 2] [--rounds 2] [--out FILE] MODEL.gguf\n");
    return 2;
  }
  try {
    const std::unique_ptr<Model> model = Model::load(path);
    std::ostringstream md;
    md << "# Cache-or-recompute on the CPU backend\n\n`build/bench_recompute --threads " << threads << " --rounds "
       << rounds << " " << path << "` (docs/tiered_kv.md). f16 KV, blocks of 16, max_batched_tokens 512 (a "
       << "scratch of 256 tokens), " << threads << " threads; greedy, ignore_eos.\n";

    // 1. One request over a cache D tokens short of it.
    const Request one = greedy(*model, words(200, "Gear"), 320);
    const int32_t need = static_cast<int32_t>((one.prompt.size() + 320 + 15) / 16);
    md << "\n## One request, D tokens past both tiers\n\nPrompt " << one.prompt.size()
       << " tokens + 320 generated (" << need << " blocks); device tier 64 blocks, host tier the rest of "
       << "`need - D/16` blocks. Time per token over the last 64 tokens (D dropped all along them), median of "
       << rounds << " alternating rounds:\n\n| D (tokens recomputed per step) | ms / token | vs resident | "
       << "marginal µs per recomputed token | cost model (start-up) µs / token |\n|---|---|---|---|---|\n";
    const std::vector<int32_t> drops = {0, 64, 128, 256};
    std::vector<std::vector<double>> per_token(drops.size());
    std::vector<Run> last(drops.size());
    for (int round = 0; round < rounds; ++round)
      for (size_t k = 0; k < drops.size(); ++k) {
        const int32_t cap = drops[k] == 0 ? 0 : need - drops[k] / 16;
        last[k] = run(*model, threads, {one}, 64, cap, SchedulerConfig::Recompute::kAuto);
        per_token[k].push_back(tail_seconds_per_token(last[k].token_times[0], 64));
        if (drops[k] > 0 && last[k].dropped_blocks * 16 < drops[k]) throw Error("fewer blocks dropped than planned");
        std::fprintf(stderr, "round %d D %d: %.2f ms/token (%.0f blocks dropped, %.0f preemptions)\n", round, drops[k],
                     per_token[k].back() * 1e3, last[k].dropped_blocks, last[k].preemptions);
      }
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    const double base = median(per_token[0]);
    for (size_t k = 0; k < drops.size(); ++k) {
      const double t = median(per_token[k]);
      char row[256];
      std::snprintf(row, sizeof row, "| %d | %.2f | %.2fx | %s | %s |\n", drops[k], t * 1e3, t / base,
                    drops[k] ? std::to_string(static_cast<int>((t - base) / drops[k] * 1e6)).c_str() : "-",
                    drops[k] ? std::to_string(static_cast<int>(last[k].model.recompute_s_per_token * 1e6)).c_str() : "-");
      md << row;
    }
    md << "\nThe start-up model times a 64-token recompute alone; inside a decode step the recompute "
       << "shares the step's weight reads, which is the marginal column.\n";

    // 2. Two requests contending for the tiers: recompute against preemption. The scheduler drops
    // blocks where that recomputes fewer tokens than preempting the last sequence would: not when
    // the one preempted is short (a), but when it is long and room comes back soon (b).
    struct Scenario {
      const char* name;
      std::vector<Request> requests;
      int32_t short_by;  // blocks fewer than the two need when request 0 ends
    };
    const std::vector<Scenario> scenarios = {
        {"(a) the later request is short: preempting it is cheap",
         {greedy(*model, words(200, "Spring"), 160), greedy(*model, words(4, "Clock"), 480)}, 8},
        {"(b) the later request is long and room comes back soon",
         {greedy(*model, words(4, "Clock"), 160), greedy(*model, words(200, "Spring"), 160)}, 3}};
    md << "\n## Two requests, recompute vs preemption\n\nBoth tiers hold a few blocks fewer than the two "
       << "requests need when request 0 ends. Median of " << rounds << " alternating rounds:\n\n"
       << "| scenario | recompute | wall s | blocks dropped | restored | preemptions |\n|---|---|---|---|---|---|\n";
    for (const Scenario& sc : scenarios) {
      const std::vector<Request>& two = sc.requests;
      const int32_t together = static_cast<int32_t>((two[0].prompt.size() + 160 + 15) / 16 +
                                                    (two[1].prompt.size() + 160 + 15) / 16);
      std::vector<double> wall[2];
      Run seen[2];
      for (int round = 0; round < rounds; ++round)
        for (int m = 0; m < 2; ++m) {
          const auto mode = m == 0 ? SchedulerConfig::Recompute::kAuto : SchedulerConfig::Recompute::kOff;
          seen[m] = run(*model, threads, two, 64, together - sc.short_by, mode);
          wall[m].push_back(seen[m].wall);
          std::fprintf(stderr, "%s, round %d %s: %.2f s\n", sc.name, round, m == 0 ? "auto" : "off", seen[m].wall);
        }
      for (int m = 0; m < 2; ++m) {
        char row[512];
        std::snprintf(row, sizeof row, "| %s: prompts %zu + %zu, %d blocks | %s | %.2f | %.0f | %.0f | %.0f |\n", sc.name,
                      two[0].prompt.size(), two[1].prompt.size(), together - sc.short_by, m == 0 ? "auto" : "off",
                      median(wall[m]), seen[m].dropped_blocks, seen[m].restored, seen[m].preemptions);
        md << row;
      }
    }
    std::ofstream(out) << md.str();
    std::printf("%s", md.str().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_recompute: %s\n", e.what());
    return 1;
  }
  return 0;
}
