#include "engine/backend/cpu/break_even.h"

#include <algorithm>
#include <chrono>
#include <numeric>

#include "engine/attention/decode_attention.h"
#include "engine/attention/policy_registry.h"
#include "engine/backend/cpu/cpu_policies.h"
#include "engine/backend/cpu/kv_storage.h"
#include "kernels/cpu/attention.h"

namespace fathom {
namespace {

constexpr int32_t kLengths[] = {256, 512, 1024, 2048, 4096, 8192, 16384, 32768};
constexpr int kRounds = 3;

// µs per call of `steps` calls of `step`, each timed after `evict` (untimed) has dropped the
// layer's KV from the caches: in a decode step the other layers' KV and the weights pass through
// the caches between two reads of one layer's, so each read comes from memory. (Timed in cache,
// dense read 8k keys at ~2x its speed in a served step while the sparse policies' fixed costs
// did not change, and the break-evens came out too long and varied per start-up: SWA on SmolLM2
// at 3/8 from 8,192 keys or never, where bench_decode measures it 1.2-1.3x dense at 8k.)
template <typename Evict, typename Step>
double round_us(int steps, Evict evict, Step step) {
  double total = 0;
  for (int i = 0; i < steps; ++i) {
    evict();
    const auto t0 = std::chrono::steady_clock::now();
    step();
    total += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  }
  return total / steps;
}

// Uniform in [-1, 1): the values only have to be finite and varied (timings do not depend on them
// beyond SparQ's and HiP's selections, which any spread of scores exercises).
struct Lcg {
  uint64_t s = 0x9e3779b97f4a7c15ull;
  float next() {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>(static_cast<int64_t>(s >> 40) - (1 << 23)) / static_cast<float>(1 << 23);
  }
};

}  // namespace

BreakEven measure_break_even(ThreadPool& pool, const KvLayout& model_layout, int32_t n_heads, float scale,
                             const AttentionPolicy& p, int32_t context_length) {
  KvLayout layout = model_layout;
  layout.n_layers = 1;
  // The lengths a decode step of this model can have: past its context no step runs, so a policy
  // that is slower only there is not held back by it.
  std::vector<int32_t> lengths;
  for (int32_t keys : kLengths)
    if (context_length <= 0 || keys <= context_length) lengths.push_back(keys);
  if (lengths.empty()) lengths.push_back(kLengths[0]);
  const int32_t max_keys = lengths.back(), bs = layout.block_size, d = layout.head_dim;
  const int32_t blocks = (max_keys + bs - 1) / bs;
  CpuKvStorage kv(layout, blocks);
  std::vector<int32_t> table(blocks);
  std::iota(table.begin(), table.end(), 0);
  Lcg rng;
  const size_t row = static_cast<size_t>(layout.n_kv_heads) * d;
  std::vector<float> k(row), v(row), q(static_cast<size_t>(n_heads) * d), out(q.size());
  for (float& x : q) x = rng.next();
  int32_t appended = 0;

  BreakEven be;
  const PolicyDef& def = policy_def(p.kind);
  const int steps = def.measure_steps != nullptr ? def.measure_steps(p) : 8;
  for (int32_t keys : lengths) {
    for (; appended < keys; ++appended) {
      for (size_t i = 0; i < row; ++i) k[i] = rng.next(), v[i] = rng.next();
      kv.append(0, table.data(), appended, k.data(), v.data());
    }
    const PagedKvView view = kv.view(0, table.data());
    BreakEvenTimes t{keys, 0, 0};
    const AttentionArgs dense{q.data(), out.data(), 1, n_heads, keys - 1, 0, scale};
    const bool every_key = selects_every_key(p, keys, d);  // the engine runs such a step densely anyway
    const DecodeArgs sparse{q.data(), out.data(), n_heads, keys - 1, scale};
    LayerPolicyState state;
    if (!every_key)
      for (int i = 0; i < steps; ++i) cpu_sparse_decode(pool, view, sparse, p, state);  // HiP's mask, SWA's mass
    // Best of kRounds rounds each, dense and sparse alternating, so that a drift of the machine's
    // speed during the measurement (frequency, a neighbour's load) weighs on both alike.
    t.dense_us = t.sparse_us = 1e30;
    // On the pool's threads, which keeps the workers spinning for the timed call as in a decode step;
    // the blocks this length uses (table order is block order).
    const int32_t used = (keys + bs - 1) / bs;
    auto evict = [&] { pool.run_on_all([&](int i, int n) { kv.evict_layer_from_cache(0, used, i, n); }); };
    for (int r = 0; r < kRounds; ++r) {
      t.dense_us = std::min(t.dense_us, round_us(steps, evict, [&] { cpu::paged_attention(pool, view, dense); }));
      if (!every_key)
        t.sparse_us =
            std::min(t.sparse_us, round_us(steps, evict, [&] { cpu_sparse_decode(pool, view, sparse, p, state); }));
    }
    if (every_key) t.sparse_us = t.dense_us;
    be.times.push_back(t);
  }
  // The shortest length from which every measured length is faster sparse.
  for (size_t i = be.times.size(); i-- > 0;) {
    if (be.times[i].sparse_us >= be.times[i].dense_us) break;
    be.min_keys = be.times[i].keys;
  }
  return be;
}

}  // namespace fathom
