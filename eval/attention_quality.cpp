// Quality of the sparse decode policies on the real default models: each model prefills S
// tokens of real text, then decodes greedily with dense attention; on every one-token step an
// attention observer takes the real query and the real paged K/V of every (global) layer and
// runs the scalar references of SparQ, HiP and SWA at the server's settings for a kv_read_ratio
// (engine/attention/policy.h resolve_*), next to an exact dense reference (double softmax).
// Reported per layer, averaged over query heads and the last --measure steps:
//   corr:  top-k correspondence, |selected ∩ top-k(dense weight)| / k per query head, where k is
//          the number of keys the policy attends for that head (SparQ |I2| of its kv head; HiP the
//          union of mask blocks, sinks and window; SWA |kept|)
//   err:   ‖out − dense‖ / ‖dense‖ of the head's attention output
//   mass:  dense attention weight carried by the selected keys (summary only)
// State follows the engine (engine/attention/decode_attention.cpp): HiP re-estimates its mask
// every hip_refresh (8) decode steps counted from the first decode step and reuses it between;
// SWA attends densely on the first decode step and then accumulates its own (renormalised)
// weights over the kept positions with the decay 1 − 1/k_local ("swa"). "swa-dm" is the same
// rule fed with the dense weights of every position (an oracle history the engine does not have).
// The decode trajectory itself is dense, so every step measures the policy on identical inputs;
// errors do not compound over steps here.
//
//   attention_quality [--smollm2 PATH] [--gemma3 PATH] [--smollm2-lens 2048,4096]
//       [--gemma3-lens 4096,8192] [--decode 24] [--measure 8] [--threads 2] [--text F1,F2,...]
//       [--out eval/results/attention_quality.md]
// Text: the files of --text concatenated (default: the GPL-3, Apache-2.0, MPL-2.0, LGPL-2.1,
// GPL-2 and GFDL-1.3 texts of /usr/share/common-licenses), cut to S tokens.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <numeric>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/attention/policies/sparq.h"
#include "engine/attention/policies/hip.h"
#include "engine/attention/policies/alisa.h"
#include "bench/cli.h"
#include "engine/attention/decode_attention.h"
#include "engine/attention/policy.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/batch_plan.h"
#include "engine/kv/block_allocator.h"
#include "engine/kv/block_table.h"
#include "engine/model/model.h"
#include "kernels/cpu/sparse_attention.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/ref/attention_state.h"
#include "kernels/ref/hip.h"
#include "kernels/ref/sparq.h"
#include "kernels/ref/swa.h"

namespace {

using namespace fathom;
using Clock = std::chrono::steady_clock;

constexpr double kRatios[] = {0.5, 0.25, 0.125};
// Explicit policy parameters from the command line (--hip-refresh, --hip-mask-k, --sparq-r, ...),
// on top of what each ratio derives: for trying a change before making it the server's rule.
AttentionPolicy g_base;
// --swa-prompt-seed W: SWA's history starts with the prompt's last W positions (run one per step,
// attending densely and accumulating their weights), as the engine seeds it.
int32_t g_swa_prompt_seed = 0;
constexpr int kNumRatios = 3;
// sparq: SparQ with the paper's step 1; sparq-spread: step 1 weighted by √ of the keys' spread per
// component (ref::sparq_key_spread over the positions so far), what the server runs by default.
enum Pol { kSparq, kSparqNr, kHip, kSwa, kSwaDm, kSparqSpread, kNumPols };
const char* kPolNames[kNumPols] = {"sparq", "sparq-nr", "hip", "swa", "swa-dm", "sparq-spread"};


struct Acc {
  double corr = 0, err = 0, mass = 0, kfrac = 0;
  int64_t n = 0;
  // Needle mode: over retrieval heads (dense mass on the needle span >= kRetrievalMass), the share
  // of that mass the policy's selection covers; heads covering less than half of it.
  double needle_kept = 0;
  int64_t needle_heads = 0, needle_misses = 0;
  void add(const Acc& o) {
    corr += o.corr, err += o.err, mass += o.mass, kfrac += o.kfrac, n += o.n;
    needle_kept += o.needle_kept, needle_heads += o.needle_heads, needle_misses += o.needle_misses;
  }
};

// A query head "retrieves" the needle on a step when dense attention puts at least this much of
// its weight on the needle's tokens.
constexpr double kRetrievalMass = 0.1;

// Token positions [begin, end) of the needle (the pass key's digits and the sentence between
// their two occurrences); empty outside needle mode.
struct NeedleSpan {
  int32_t begin = 0, end = 0;
};

// Per (layer, policy, ratio).
struct LayerStats {
  Acc acc[kNumPols][kNumRatios];
  bool active[kNumPols] = {};  // the server runs the policy on this layer
};

// Policy state of one layer at one ratio, mirroring LayerPolicyState.
struct SimState {
  ref::HipMask hip_mask;
  ref::HipParams hip_params;
  bool hip_have = false;
  std::vector<float> swa_mass, swadm_mass;
};

struct RunResult {
  std::string model;
  int32_t S = 0, n_layers_measured = 0;
  std::vector<int32_t> layers;   // measured layer ids
  std::map<int32_t, LayerStats> by_layer;
  double seconds = 0, prefill_seconds = 0;
  // Largest ‖cpu − ref‖/‖ref‖ over heads of the CPU kernel (kernels/cpu) against its reference on
  // the same inputs (SparQ: same parameters; HiP: same mask; SWA: same mass), per policy.
  double cpu_vs_ref[kNumPols] = {};
  std::string continuation;
};

// Dense reference of one decode query: probabilities and outputs per head, double softmax.
struct Dense {
  std::vector<std::vector<double>> p;  // [n_heads][S]
  std::vector<float> out;              // [n_heads][d]
};

Dense dense_reference(const PagedKvView& kv, const DecodeArgs& a) {
  const int32_t d = kv.head_dim, S = a.pos + 1, G = a.n_heads / kv.n_kv_heads;
  Dense r;
  r.p.assign(a.n_heads, std::vector<double>(S));
  r.out.assign(static_cast<size_t>(a.n_heads) * d, 0.0f);
  std::vector<float> K(static_cast<size_t>(S) * d), V(static_cast<size_t>(S) * d);
  std::vector<double> o(d);
  for (int32_t g = 0; g < kv.n_kv_heads; ++g) {
    for (int32_t t = 0; t < S; ++t) {
      ref::load_kv_row(kv, kv.k, t, g, &K[static_cast<size_t>(t) * d]);
      ref::load_kv_row(kv, kv.v, t, g, &V[static_cast<size_t>(t) * d]);
    }
    for (int32_t j = 0; j < G; ++j) {
      const int32_t h = g * G + j;
      const float* q = a.q + static_cast<int64_t>(h) * d;
      std::vector<double>& p = r.p[h];
      double m = -INFINITY;
      for (int32_t t = 0; t < S; ++t) {
        double s = 0;
        for (int32_t i = 0; i < d; ++i) s += static_cast<double>(q[i]) * K[static_cast<size_t>(t) * d + i];
        p[t] = s * a.scale;
        m = std::max(m, p[t]);
      }
      double z = 0;
      for (int32_t t = 0; t < S; ++t) z += (p[t] = std::exp(p[t] - m));
      std::fill(o.begin(), o.end(), 0.0);
      for (int32_t t = 0; t < S; ++t) {
        p[t] /= z;
        for (int32_t i = 0; i < d; ++i) o[i] += p[t] * V[static_cast<size_t>(t) * d + i];
      }
      for (int32_t i = 0; i < d; ++i) r.out[static_cast<size_t>(h) * d + i] = static_cast<float>(o[i]);
    }
  }
  return r;
}

// Scores one head: `sel` sorted ascending positions the policy attends.
void score_head(const std::vector<double>& p, const std::vector<int32_t>& sel, const float* out, const float* ref,
                int32_t d, std::vector<int32_t>& scratch, Acc& acc, NeedleSpan needle = {}) {
  const int32_t S = static_cast<int32_t>(p.size());
  const int32_t k = static_cast<int32_t>(sel.size());
  double corr = 1.0;
  if (k < S) {
    scratch.resize(S);
    std::iota(scratch.begin(), scratch.end(), 0);
    std::nth_element(scratch.begin(), scratch.begin() + k, scratch.end(),
                     [&](int32_t x, int32_t y) { return p[x] != p[y] ? p[x] > p[y] : x < y; });
    std::vector<char> top(S, 0);
    for (int32_t i = 0; i < k; ++i) top[scratch[i]] = 1;
    int32_t hit = 0;
    for (int32_t t : sel) hit += top[t];
    corr = static_cast<double>(hit) / k;
  }
  double mass = 0;
  for (int32_t t : sel) mass += p[t];
  double num = 0, den = 0;
  for (int32_t i = 0; i < d; ++i) {
    num += static_cast<double>(out[i] - ref[i]) * (out[i] - ref[i]);
    den += static_cast<double>(ref[i]) * ref[i];
  }
  acc.corr += corr;
  acc.err += den > 0 ? std::sqrt(num / den) : 0.0;
  acc.mass += mass;
  acc.kfrac += static_cast<double>(k) / S;
  acc.n += 1;
  if (needle.end > needle.begin && needle.end <= S) {
    double total = 0, kept = 0;
    for (int32_t t = needle.begin; t < needle.end; ++t) total += p[t];
    if (total >= kRetrievalMass) {
      for (int32_t t : sel)
        if (t >= needle.begin && t < needle.end) kept += p[t];
      acc.needle_kept += kept / total;
      acc.needle_heads += 1;
      acc.needle_misses += kept < 0.5 * total;
    }
  }
}

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b, int32_t n_heads, int32_t d) {
  double worst = 0;
  for (int32_t h = 0; h < n_heads; ++h) {
    double num = 0, den = 0;
    for (int32_t i = 0; i < d; ++i) {
      const size_t j = static_cast<size_t>(h) * d + i;
      num += static_cast<double>(a[j] - b[j]) * (a[j] - b[j]);
      den += static_cast<double>(b[j]) * b[j];
    }
    worst = std::max(worst, den > 0 ? std::sqrt(num / den) : std::sqrt(num));
  }
  return worst;
}

// Positions HiP attends for head h with mask m at pos (the union hip_sparse_attention takes).
std::vector<int32_t> hip_selection(const ref::HipMask& m, const ref::HipParams& hp, int32_t h, int32_t pos) {
  const int32_t S = pos + 1;
  if (m.dense) return ref::position_range(0, S);
  std::vector<char> in(S, 0);
  for (int32_t b : m.block_starts[h])
    for (int32_t t = b; t < std::min(b + hp.block_size_k, S); ++t) in[t] = 1;
  for (int32_t t = 0; t < std::min(hp.sink, S); ++t) in[t] = 1;
  for (int32_t t = std::max(0, pos - hp.window); t < S; ++t) in[t] = 1;
  std::vector<int32_t> sel;
  for (int32_t t = 0; t < S; ++t)
    if (in[t]) sel.push_back(t);
  return sel;
}

// SWA weights of one step as the engine folds them: softmax over the kept positions, summed over heads.
void swa_update(const Dense& dense, const std::vector<int32_t>& kept, int32_t k_local, std::vector<float>& mass) {
  const int32_t S = static_cast<int32_t>(dense.p[0].size());
  mass.resize(S, 0.0f);
  std::vector<double> w(S, 0.0);
  for (const auto& p : dense.p) {
    double z = 0;
    for (int32_t t : kept) z += p[t];
    for (int32_t t : kept) w[t] += p[t] / z;
  }
  const float keep = 1.0f - 1.0f / static_cast<float>(std::max(1, k_local));
  for (int32_t t = 0; t < S; ++t) mass[t] = mass[t] * keep + static_cast<float>(w[t]);
}

std::string read_text(const std::vector<std::string>& files) {
  std::string text;
  for (const std::string& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "cannot read %s\n", f.c_str());
      std::exit(1);
    }
    std::stringstream ss;
    ss << in.rdbuf();
    text += ss.str();
    text += "\n\n";
  }
  return text;
}

RunResult run_one(const Model& model, CpuBackend& backend, const std::string& name, const std::vector<int32_t>& all_tokens, int32_t S,
                  int32_t n_decode, int32_t n_measure, NeedleSpan needle = {}) {
  const auto t_start = Clock::now();
  const ModelConfig& c = model.config();
  RunResult res;
  res.model = name;
  res.S = S;
  const std::vector<int32_t> prompt(all_tokens.begin(), all_tokens.begin() + S);
  for (int32_t l = 0; l < c.n_layers; ++l)
    if (!c.layers[l].sliding) res.layers.push_back(l);
  const int32_t d = c.head_dim;

  // sims[layer][ratio]
  std::vector<std::vector<SimState>> sims(c.n_layers, std::vector<SimState>(kNumRatios));
  int32_t step = -1;  // decode step index; −1 during prefill
  bool seeding = false;  // a prompt position run alone to seed SWA's history (--swa-prompt-seed)
  const int32_t first_measured = n_decode - n_measure;
  std::vector<int32_t> scratch;
  std::vector<float> out(static_cast<size_t>(c.n_heads) * d), out_cpu(out.size());
  ThreadPool pool(1);

  backend.set_attention_observer([&](int32_t layer, bool sliding, const PagedKvView& kv, const DecodeArgs& q) {
    if (sliding || (step < 0 && !seeding)) return;
    const bool measure = !seeding && step >= first_measured;
    const int32_t pos = q.pos, S_cur = pos + 1;
    const int32_t G = q.n_heads / kv.n_kv_heads;
    DecodeArgs a = q;
    a.out = out.data();  // never write the engine's output buffer
    const Dense dense = dense_reference(kv, q);
    // sparq-spread's σ over the positions so far: the same for every ratio below.
    const std::vector<float> spread = measure ? ref::sparq_key_spread(kv, S_cur) : std::vector<float>{};
    LayerStats& ls = res.by_layer[layer];
    for (int ri = 0; ri < kNumRatios; ++ri) {
      AttentionPolicy p = g_base;
      p.kv_read_ratio = kRatios[ri];
      SimState& st = sims[layer][ri];
      // SWA (engine rule): dense seed on the first decode step, then its own weights.
      for (int which = 0; which < 2; ++which) {
        std::vector<float>& mass = which == 0 ? st.swa_mass : st.swadm_mass;
        p.kind = policy_kind("alisa");
        ref::SwaParams sp = alisa::resolve(p, S_cur);
        const bool seeded = !mass.empty() && !seeding;
        if (!seeded) sp.ratio = 1.0f;
        mass.resize(S_cur, 0.0f);
        alisa::LayerState pooling;  // the engine's selection mass (pool from --swa-pool)
        pooling.mass = mass;
        const float* selection = seeded ? alisa::selection_mass(p, pooling) : mass.data();
        const ref::SwaStats ss = ref::swa_attention(kv, a, sp, selection);
        if (measure && seeded && which == 0) {
          DecodeArgs ac = a;
          ac.out = out_cpu.data();
          cpu::swa_decode(pool, kv, ac, sp, selection, nullptr);
          res.cpu_vs_ref[kSwa] = std::max(res.cpu_vs_ref[kSwa], max_rel_diff(out_cpu, out, q.n_heads, d));
        }
        if (measure && seeded) {
          Acc& acc = ls.acc[which == 0 ? kSwa : kSwaDm][ri];
          for (int32_t h = 0; h < q.n_heads; ++h)
            score_head(dense.p[h], ss.kept, &out[static_cast<size_t>(h) * d], &dense.out[static_cast<size_t>(h) * d], d,
                       scratch, acc, needle);
        }
        if (which == 0) {
          swa_update(dense, ss.kept, ss.k_local, mass);
        } else {
          swa_update(dense, ref::position_range(0, S_cur), ss.k_local, mass);
        }
      }
      ls.active[kSwa] = ls.active[kSwaDm] = layer_uses_policy(p, layer, sliding);
      // HiP: refresh every hip_refresh steps from the first decode step; only from the refresh
      // that starts the measured window on (earlier masks are never used).
      p.kind = policy_kind("hip");
      ls.active[kHip] = layer_uses_policy(p, layer, sliding);
      const int32_t R = p.integer(hip::kRefresh);
      if (step >= first_measured / R * R) {
        if (step % R == 0 || !st.hip_have) {
          st.hip_params = hip::resolve(p, S_cur);
          st.hip_mask = ref::hip_estimate_mask(kv, a, st.hip_params, nullptr);
          st.hip_have = true;
        }
        if (measure) {
          ref::hip_sparse_attention(kv, a, st.hip_params, st.hip_mask, nullptr);
          DecodeArgs ac = a;
          ac.out = out_cpu.data();
          ref::HipBytes hb;
          cpu::hip_sparse_decode(pool, kv, ac, st.hip_params, st.hip_mask, &hb);
          res.cpu_vs_ref[kHip] = std::max(res.cpu_vs_ref[kHip], max_rel_diff(out_cpu, out, q.n_heads, d));
          for (int32_t h = 0; h < q.n_heads; ++h)
            score_head(dense.p[h], hip_selection(st.hip_mask, st.hip_params, h, pos), &out[static_cast<size_t>(h) * d],
                       &dense.out[static_cast<size_t>(h) * d], d, scratch, ls.acc[kHip][ri], needle);
        }
      }
      // SparQ: stateless; with the server's default (reallocation on) and with it off.
      p.kind = policy_kind("sparq");
      ls.active[kSparq] = ls.active[kSparqNr] = layer_uses_policy(p, layer, sliding);
      if (measure) {
        for (const Pol pol : {kSparq, kSparqNr}) {
          p.set(sparq::kReallocation, pol == kSparq);
          const ref::SparqParams sp = sparq::resolve(p, S_cur, kv.head_dim);
          const ref::SparqStats ss = ref::sparq_attention(kv, a, sp, nullptr);
          for (int32_t h = 0; h < q.n_heads; ++h)
            score_head(dense.p[h], ss.selected[h / G], &out[static_cast<size_t>(h) * d],
                       &dense.out[static_cast<size_t>(h) * d], d, scratch, ls.acc[pol][ri], needle);
          DecodeArgs ac = a;
          ac.out = out_cpu.data();
          cpu::sparq_decode(pool, kv, ac, sp);
          res.cpu_vs_ref[pol] = std::max(res.cpu_vs_ref[pol], max_rel_diff(out_cpu, out, q.n_heads, d));
        }
        p.set(sparq::kReallocation, true);
        const ref::SparqStats ss =
            ref::sparq_attention(kv, a, sparq::resolve(p, S_cur, kv.head_dim), nullptr, spread.data());
        for (int32_t h = 0; h < q.n_heads; ++h)
          score_head(dense.p[h], ss.selected[h / G], &out[static_cast<size_t>(h) * d],
                     &dense.out[static_cast<size_t>(h) * d], d, scratch, ls.acc[kSparqSpread][ri], needle);
      }
      ls.active[kSparqSpread] = ls.active[kSparq];
    }
  });

  BlockAllocator allocator(backend.kv_blocks(), backend.kv_layout().block_size);
  BlockTable blocks(allocator);
  if (!blocks.reserve(S + n_decode + 1)) {
    std::fprintf(stderr, "KV pool too small for %d tokens\n", S + n_decode);
    std::exit(1);
  }
  std::vector<int32_t> tokens = prompt;
  std::vector<float> logits;
  std::vector<int32_t> generated;
  // With --swa-prompt-seed W: prefill up to S − W, then the prompt's last W positions one by one,
  // each seeding SWA's history (as the engine's scheduler runs them); the last one is step −1.
  int32_t done = 0;
  if (g_swa_prompt_seed > 0 && S > g_swa_prompt_seed) {
    const int32_t head = S - g_swa_prompt_seed;
    for (int32_t at = 0; at < S - 1;) {
      const int32_t n = at == 0 ? head : 1;
      seeding = at > 0;
      BatchPlan plan;
      plan.seqs.push_back(SeqStep{std::span<const int32_t>(tokens.data() + at, n), at, &blocks.blocks(),
                                  LogitsWanted::kLast});
      backend.forward(plan, logits);
      at += n;
    }
    done = S - 1;
  }
  for (step = -1; step < n_decode; ++step) {
    seeding = step < 0 && done > 0;
    const auto t0 = Clock::now();
    BatchPlan plan;
    const int32_t first = step < 0 ? done : static_cast<int32_t>(tokens.size()) - 1;
    const std::span<const int32_t> toks(tokens.data() + first, step < 0 ? tokens.size() - done : 1);
    plan.seqs.push_back(SeqStep{toks, first, &blocks.blocks(), LogitsWanted::kLast});
    backend.forward(plan, logits);
    const float* row = logits.data();
    const int32_t next = static_cast<int32_t>(std::max_element(row, row + model.vocab()) - row);
    tokens.push_back(next);
    generated.push_back(next);
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    if (step < 0) {
      res.prefill_seconds = dt;
      std::fprintf(stderr, "  %s S=%d: prefill %.1f s (%.0f tok/s)\n", name.c_str(), S, dt, S / dt);
    } else if (step == first_measured || step == n_decode - 1) {
      std::fprintf(stderr, "  %s S=%d: decode step %d took %.1f s\n", name.c_str(), S, step, dt);
    }
  }
  backend.set_attention_observer(nullptr);
  res.continuation = model.tokenizer().decode(generated);
  res.seconds = std::chrono::duration<double>(Clock::now() - t_start).count();
  return res;
}

std::string fmt(const char* f, double a) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, a);
  return buf;
}

std::string report(const RunResult& r, int32_t n_decode, int32_t n_measure) {
  std::ostringstream o;
  o << "### " << r.model << ", S = " << r.S << " prompt tokens (+" << n_decode << " decoded)\n\n";
  // Summary: over the layers the server runs the policy on.
  o << "| policy | ratio | k/S | top-k corr | rel. err | dense mass kept | layers |\n|---|---|---|---|---|---|---|\n";
  for (int pi = 0; pi < kNumPols; ++pi)
    for (int ri = 0; ri < kNumRatios; ++ri) {
      Acc sum;
      int layers = 0;
      for (const auto& [l, ls] : r.by_layer)
        if (ls.active[pi] && ls.acc[pi][ri].n > 0) sum.add(ls.acc[pi][ri]), ++layers;
      if (sum.n == 0) continue;
      o << "| " << kPolNames[pi] << " | 1/" << static_cast<int>(std::lround(1 / kRatios[ri])) << " | "
        << fmt("%.3f", sum.kfrac / sum.n) << " | " << fmt("%.3f", sum.corr / sum.n) << " | "
        << fmt("%.4f", sum.err / sum.n) << " | " << fmt("%.3f", sum.mass / sum.n) << " | " << layers << " |\n";
    }
  o << "\nPer layer, top-k corr / rel. err (mean over heads and " << n_measure
    << " steps; † = the server keeps this layer dense for HiP, shown for reference):\n\n| layer |";
  for (int pi = 0; pi < kNumPols; ++pi)
    for (int ri = 0; ri < kNumRatios; ++ri)
      o << " " << kPolNames[pi] << " 1/" << static_cast<int>(std::lround(1 / kRatios[ri])) << " |";
  o << "\n|---|";
  for (int i = 0; i < kNumPols * kNumRatios; ++i) o << "---|";
  o << "\n";
  for (const auto& [l, ls] : r.by_layer) {
    o << "| " << l << " |";
    for (int pi = 0; pi < kNumPols; ++pi)
      for (int ri = 0; ri < kNumRatios; ++ri) {
        const Acc& a = ls.acc[pi][ri];
        if (a.n == 0) {
          o << " – |";
          continue;
        }
        o << " " << fmt("%.2f", a.corr / a.n) << " / " << fmt("%.3f", a.err / a.n) << (ls.active[pi] ? "" : "†")
          << " |";
      }
    o << "\n";
  }
  std::string cont = r.continuation;
  std::replace(cont.begin(), cont.end(), '\n', ' ');
  std::replace(cont.begin(), cont.end(), '|', '/');
  o << "\nCPU kernels vs their references on the same inputs, worst relative output difference over heads:";
  for (int pi = 0; pi < kNumPols; ++pi)
    if (pi != kSwaDm && pi != kSparqSpread) o << " " << kPolNames[pi] << " " << fmt("%.1e", r.cpu_vs_ref[pi]) << (pi + 1 < kSwaDm ? "," : ".");
  o << "\nPrefill " << fmt("%.1f", r.prefill_seconds) << " s, whole run " << fmt("%.0f", r.seconds)
    << " s. Greedy continuation: `" << cont << "`\n\n";
  return o.str();
}

// Needle mode: how much of the needle's attention each policy keeps where the model retrieves it.
std::string report_needle(const RunResult& r, const std::string& key, NeedleSpan needle) {
  std::ostringstream o;
  o << "### " << r.model << ", S = " << r.S << ", key " << key << " at tokens " << needle.begin << "–" << needle.end
    << " (depth " << fmt("%.2f", static_cast<double>(needle.begin) / r.S) << ")\n\n";
  std::string cont = r.continuation;
  std::replace(cont.begin(), cont.end(), '\n', ' ');
  std::replace(cont.begin(), cont.end(), '|', '/');
  o << "Dense greedy reply: `" << cont << "`\n\n";
  o << "| policy | ratio | needle mass kept | retrieval heads < 50% kept | retrieval head-steps | dense mass kept | "
       "top-k corr | rel. err |\n|---|---|---|---|---|---|---|---|\n";
  for (int pi = 0; pi < kNumPols; ++pi)
    for (int ri = 0; ri < kNumRatios; ++ri) {
      Acc sum;
      for (const auto& [l, ls] : r.by_layer)
        if (ls.active[pi]) sum.add(ls.acc[pi][ri]);
      if (sum.n == 0) continue;
      o << "| " << kPolNames[pi] << " | 1/" << static_cast<int>(std::lround(1 / kRatios[ri])) << " | "
        << (sum.needle_heads ? fmt("%.3f", sum.needle_kept / sum.needle_heads) : "–") << " | "
        << sum.needle_misses << " | " << sum.needle_heads << " | " << fmt("%.3f", sum.mass / sum.n) << " | "
        << fmt("%.3f", sum.corr / sum.n) << " | " << fmt("%.4f", sum.err / sum.n) << " |\n";
    }
  o << "\nPer layer at 1/8: retrieval head-steps, then needle mass kept per policy († = dense for that policy):\n\n"
       "| layer | retrieval head-steps |";
  for (int pi = 0; pi < kNumPols; ++pi) o << " " << kPolNames[pi] << " |";
  o << "\n|---|---|";
  for (int pi = 0; pi < kNumPols; ++pi) o << "---|";
  o << "\n";
  const int ri = kNumRatios - 1;
  for (const auto& [l, ls] : r.by_layer) {
    if (ls.acc[kSparq][ri].needle_heads == 0) continue;
    o << "| " << l << " | " << ls.acc[kSparq][ri].needle_heads << " |";
    for (int pi = 0; pi < kNumPols; ++pi) {
      const Acc& a = ls.acc[pi][ri];
      o << " " << (a.needle_heads ? fmt("%.2f", a.needle_kept / a.needle_heads) : "–") << (ls.active[pi] ? "" : "†")
        << " |";
    }
    o << "\n";
  }
  o << "\n";
  return o.str();
}

// The needle's token span: from the first occurrence of `key` in the decoded prompt to the end of
// its last (the needle sentence names the key twice).
NeedleSpan find_needle(const Tokenizer& tok, const std::vector<int32_t>& ids, const std::string& key) {
  std::string text;
  std::vector<size_t> start(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    start[i] = text.size();
    text += tok.token_bytes(ids[i]);
  }
  const size_t a = text.find(key), b = text.rfind(key);
  if (a == std::string::npos) return {};
  const size_t e = b + key.size();
  NeedleSpan n;
  n.begin = static_cast<int32_t>(std::upper_bound(start.begin(), start.end(), a) - start.begin()) - 1;
  n.end = static_cast<int32_t>(std::lower_bound(start.begin(), start.end(), e) - start.begin());
  return n;
}

int run_needles(const std::string& path, const std::string& out_path, int threads, int32_t n_decode) {
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", path.c_str());
    return 1;
  }
  std::ostringstream md;
  md << "# Why sparse decode misses the pass key\n\n"
     << "Generated by `attention_quality --needles` (eval/attention_quality.cpp) from passkey prompts "
        "written by `eval/passkey_diagnose.py`. Each prompt is prefilled, then " << n_decode
     << " tokens are decoded greedily with dense attention; on every decode step the real query and f16 K/V of "
        "every global layer go through each policy's scalar reference at the server's settings for the ratio.\n\n"
     << "- A **retrieval head-step** is a (step, layer, query head) whose dense attention puts ≥ "
     << kRetrievalMass << " of its weight on the needle (the pass key sentence).\n"
     << "- **needle mass kept**: over those, the share of the needle's dense weight on keys the policy attends "
        "(1 = it reads every needle token the head wants); `< 50% kept`: how many of them keep less than half.\n"
     << "- Columns as in attention_quality.md otherwise; layers the server runs densely for a policy are left out "
        "of its summary (they keep everything).\n\n";
  std::map<std::string, std::pair<std::unique_ptr<Model>, std::unique_ptr<CpuBackend>>> loaded;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const nlohmann::json j = nlohmann::json::parse(line);
    const std::string model_path = j.at("model"), key = j.at("key"), name = j.at("name");
    const std::vector<int32_t> ids = j.at("ids").get<std::vector<int32_t>>();
    auto& slot = loaded[model_path];
    if (!slot.first) {
      ModelOptions opts;
      opts.threads = threads;
      slot.first = Model::load(model_path);
      slot.second = std::make_unique<CpuBackend>(*slot.first, opts);
    }
    const NeedleSpan needle = find_needle(slot.first->tokenizer(), ids, key);
    if (needle.end <= needle.begin) {
      std::fprintf(stderr, "%s: key %s not found in the prompt\n", name.c_str(), key.c_str());
      return 1;
    }
    const RunResult r = run_one(*slot.first, *slot.second, name, ids, static_cast<int32_t>(ids.size()), n_decode,
                                n_decode, needle);
    const std::string part = report_needle(r, key, needle);
    std::fputs(part.c_str(), stdout);
    std::fflush(stdout);
    md << part;
    std::ofstream(out_path) << md.str();  // a valid partial report after every prompt
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string smollm = "models/smollm2-135m-instruct-q4_1.gguf", gemma = "models/gemma-3-270m-q4_k_m.gguf";
  std::string smollm_lens = "2048,4096", gemma_lens = "4096,8192";
  std::string text_files =
      "/usr/share/common-licenses/GPL-3,/usr/share/common-licenses/Apache-2.0,/usr/share/common-licenses/MPL-2.0,"
      "/usr/share/common-licenses/LGPL-2.1,/usr/share/common-licenses/GPL-2,/usr/share/common-licenses/GFDL-1.3";
  std::string out_path = "eval/results/attention_quality.md";
  std::string needles;  // JSON lines {"name", "model", "ids", "key"}: needle mode
  int threads = 2, n_decode = 24, n_measure = 8;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--smollm2") smollm = next();
    else if (a == "--gemma3") gemma = next();
    else if (a == "--smollm2-lens") smollm_lens = next();
    else if (a == "--gemma3-lens") gemma_lens = next();
    else if (a == "--decode") n_decode = std::atoi(next().c_str());
    else if (a == "--measure") n_measure = std::atoi(next().c_str());
    else if (a == "--threads") threads = std::atoi(next().c_str());
    else if (a == "--text") text_files = next();
    else if (a == "--out") out_path = next();
    else if (a == "--needles") needles = next();
    else if (a == "--swa-pool") g_base.set(alisa::kPool, std::atoi(next().c_str()));
    else if (a == "--swa-prompt-seed") g_swa_prompt_seed = std::atoi(next().c_str());
    else if (a == "--hip-refresh") g_base.set(hip::kRefresh, std::atoi(next().c_str()));
    else if (a == "--hip-mask-k") g_base.set(hip::kMaskK, std::atoi(next().c_str()));
    else if (a == "--hip-sink") g_base.set(hip::kSink, std::atoi(next().c_str()));
    else if (a == "--hip-window") g_base.set(hip::kWindow, std::atoi(next().c_str()));
    else if (a == "--sparq-r") g_base.set(sparq::kR, std::atoi(next().c_str()));
    else if (a == "--sparq-k") g_base.set(sparq::kK, std::atoi(next().c_str()));
    else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  g_base.validate();  // a flag out of its policy's bounds (e.g. --sparq-r 0) is an error, not "derived"
  n_measure = std::clamp(n_measure, 1, n_decode);
  if (!needles.empty()) return run_needles(needles, out_path, threads, n_decode);
  const std::string text = read_text(bench::split_list(text_files));
  const auto t0 = Clock::now();

  std::ostringstream md;
  md << "# Sparse decode attention quality on the default models\n\n"
     << "Generated by `attention_quality` (eval/attention_quality.cpp). Each model prefills S tokens of "
        "real text (the concatenated " << text_files << " texts, BOS first), then decodes " << n_decode
     << " tokens greedily with dense attention. On the last " << n_measure
     << " decode steps the real query and paged f16 K/V of every global layer are run through the scalar references "
        "(kernels/ref) of each policy at the server's settings for the kv_read_ratio (resolve_sparq / resolve_hip / "
        "resolve_swa), against an exact dense softmax in double.\n\n"
     << "- **top-k corr**: per query head, the fraction of the true top-k keys by dense attention weight that the "
        "policy attended, with k = the number of keys that policy attends for that head (column k/S: SparQ |I2| = "
        "max(ratio/2·S, 128), HiP mask + sinks + window ≈ ratio·S, SWA |kept| = ratio·S).\n"
     << "- **rel. err**: ‖out − dense‖ / ‖dense‖ of the head's attention output (SparQ with mean-value reallocation "
        "on, the server default, and the paper's step 1; `sparq-nr`: reallocation off; `sparq-spread`: step 1 weighted by √ "
        "of the keys' spread per component, ref::sparq_key_spread — the server's default rule since 579fac5).\n"
     << "- **dense mass kept**: the dense attention weight on the attended keys.\n"
     << "- HiP state follows the engine: mask re-estimated every 8 decode steps from the first one (the measured "
        "steps are one full refresh cycle, mask ages 0–7); the server keeps HiP's first 3 layers dense, so its summary "
        "averages the others. SWA (`swa`) follows the engine: dense first decode step, then the decayed mass of its own "
        "weights over the kept tokens; `swa-dm` feeds the same rule the dense weights of every token (an oracle).\n"
     << "- The trajectory is dense, so errors do not compound: this is a per-step measurement. Gemma 3's sliding "
        "layers (window 512) stay dense under every policy and are not measured.\n\n";
  struct Job {
    std::string name, path;
    std::vector<std::string> lens;
  };
  const std::vector<Job> jobs = {{"SmolLM2-135M-Instruct Q4_1", smollm, bench::split_list(smollm_lens)},
                                 {"Gemma 3 270M Q4_K_M", gemma, bench::split_list(gemma_lens)}};
  for (const Job& job : jobs) {
    if (job.path.empty() || job.lens.empty()) continue;
    ModelOptions opts;
    opts.threads = threads;
    auto model = Model::load(job.path);
    CpuBackend backend(*model, opts);
    const std::vector<int32_t> all = model->tokenizer().encode(text);
    for (const std::string& ls : job.lens) {
      const int32_t S = std::atoi(ls.c_str());
      if (static_cast<int32_t>(all.size()) < S) {
        std::fprintf(stderr, "the text has only %zu tokens for %s; need %d\n", all.size(), job.name.c_str(), S);
        return 1;
      }
      const RunResult r = run_one(*model, backend, job.name, all, S, n_decode, n_measure);
      const std::string part = report(r, n_decode, n_measure);
      std::fputs(part.c_str(), stdout);
      std::fflush(stdout);
      md << part;
    }
  }
  const double total = std::chrono::duration<double>(Clock::now() - t0).count();
  md << "Total run time " << fmt("%.0f", total) << " s (2 threads for the forward passes; references single-threaded).\n";
  std::ofstream(out_path) << md.str();
  std::fprintf(stderr, "wrote %s (%.0f s)\n", out_path.c_str(), total);
  return 0;
}
