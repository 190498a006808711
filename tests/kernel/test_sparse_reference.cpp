// Exactness properties of the scalar sparse-attention references in kernels/ref (the spec the
// CPU and CUDA kernels will be tested against): partial-state merge, bifurcated == dense,
// SparQ / HiP / SWA at their loosest settings == dense, INT8 KV round trip, SparQ selection on
// a constructed input, and the KV bytes-read counters. Grid: head dim 64/128/256, GQA group
// 1/3/4/8, sequence lengths 1, below one block, one block, odd, long; f32 and f16 KV.
// Block tables are shuffled so logical order != physical order. Worst errors are printed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/ref/attention.h"
#include "kernels/ref/attention_state.h"
#include "kernels/ref/bifurcated.h"
#include "kernels/ref/dequant.h"
#include "kernels/ref/hip.h"
#include "kernels/ref/kv_int8.h"
#include "kernels/ref/sparq.h"
#include "kernels/ref/swa.h"
#include "tests/kernel/paged_kv_fixture.h"

namespace fathom {
namespace {

constexpr int32_t kBlock = 16, kKvHeads = 2;
const int32_t kDims[] = {64, 128, 256};
const int32_t kGroups[] = {1, 3, 4, 8};
const int32_t kLens[] = {1, 7, 16, 33, 1999};  // 1, below one block, one block, odd, long
const KvDtype kDtypes[] = {KvDtype::kF32, KvDtype::kF16};

// A paged pool of random K/V (f32 master copy, stored as `dtype`) and one sequence's table.
struct Pool {
  int32_t d = 0;
  KvDtype dtype = KvDtype::kF32;
  std::vector<float> kf, vf;    // [physical][kKvHeads][kBlock][d]
  std::vector<uint8_t> k, v;    // the same in `dtype`
  std::vector<int32_t> table;   // logical -> physical for the sequence
  PagedKvView view(const std::vector<int32_t>& t) const {
    return PagedKvView{k.data(), v.data(), dtype, t.data(), kBlock, kKvHeads, d};
  }
  PagedKvView view() const { return view(table); }
  // Stores the f32 master as `dtype` (call after editing kf / vf).
  void store() {
    const size_t n = kf.size(), b = kv_dtype_bytes(dtype);
    k.resize(n * b);
    v.resize(n * b);
    for (size_t i = 0; i < n; ++i) {
      if (dtype == KvDtype::kF32) {
        reinterpret_cast<float*>(k.data())[i] = kf[i];
        reinterpret_cast<float*>(v.data())[i] = vf[i];
      } else {
        reinterpret_cast<uint16_t*>(k.data())[i] = ref::fp32_to_fp16(kf[i]);
        reinterpret_cast<uint16_t*>(v.data())[i] = ref::fp32_to_fp16(vf[i]);
      }
    }
  }
  int64_t offset(int32_t t, int32_t g) const {  // element offset of row t, kv head g
    return (static_cast<int64_t>(table[t / kBlock]) * kKvHeads + g) * kBlock * d + (t % kBlock) * d;
  }
};

Pool make_pool(int32_t d, KvDtype dtype, int32_t physical, int32_t seq_len, std::mt19937& rng) {
  Pool p;
  p.d = d;
  p.dtype = dtype;
  const int64_t n = static_cast<int64_t>(physical) * kKvHeads * kBlock * d;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  p.kf.resize(n);
  p.vf.resize(n);
  for (float& x : p.kf) x = normal(rng);
  for (float& x : p.vf) x = normal(rng);
  std::vector<int32_t> perm(physical);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  perm.resize((seq_len + kBlock - 1) / kBlock);
  p.table = perm;
  p.store();
  return p;
}

std::vector<float> dense(const PagedKvView& kv, const float* q, int32_t n_heads, int32_t pos) {
  std::vector<float> out(static_cast<size_t>(n_heads) * kv.head_dim);
  ref::paged_attention(kv, AttentionArgs{q, out.data(), 1, n_heads, pos, 0, 1.0f / std::sqrt(float(kv.head_dim))});
  return out;
}

// max |a − b| / max |b|: the error relative to the output's scale (outputs shrink like 1/√S).
double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::fabs(double(a[i]) - b[i]));
    den = std::max(den, std::fabs(double(b[i])));
    if (std::isnan(a[i])) return INFINITY;
  }
  return num / den;
}

struct Worst {
  const char* name;
  double err = 0;
  int cases = 0;
  void add(double e) { err = std::max(err, e), ++cases; }
  ~Worst() { std::printf("  %-44s worst rel err %.3g over %d cases\n", name, err, cases); }
};

ref::DecodeArgs decode(const std::vector<float>& q, std::vector<float>& out, int32_t n_heads, int32_t pos, int32_t d) {
  out.assign(static_cast<size_t>(n_heads) * d, 0.0f);
  return ref::DecodeArgs{q.data(), out.data(), n_heads, pos, 1.0f / std::sqrt(float(d))};
}

TEST(SparseReference, MergeIsAssociativeCommutativeWithEmptyIdentity) {
  std::mt19937 rng(1);
  Worst assoc{"merge (a·b)·c vs a·(b·c) vs b·a·c vs whole"};
  for (int32_t d : kDims)
    for (KvDtype dt : kDtypes)
      for (int32_t s : {2, 33, 300}) {
        const Pool p = make_pool(d, dt, (s + kBlock - 1) / kBlock + 2, s, rng);
        const auto q = testing::normal_vector(d, rng);
        std::vector<int32_t> all = ref::position_range(0, s);
        std::shuffle(all.begin(), all.end(), rng);
        const int32_t cut1 = s / 3, cut2 = s / 3 + s / 2;
        ref::AttentionState a, b, c, whole;
        const float scale = 1.0f / std::sqrt(float(d));
        ref::partial_attention(p.view(), 1, q.data(), 1, scale, all.data(), cut1, &a);  // empty when s < 3
        ref::partial_attention(p.view(), 1, q.data(), 1, scale, all.data() + cut1, cut2 - cut1, &b);
        ref::partial_attention(p.view(), 1, q.data(), 1, scale, all.data() + cut2, s - cut2, &c);
        ref::partial_attention(p.view(), 1, q.data(), 1, scale, all.data(), s, &whole);
        const auto l = ref::merge_states(ref::merge_states(a, b), c);
        const auto r = ref::merge_states(a, ref::merge_states(b, c));
        const auto x = ref::merge_states(ref::merge_states(c, a), b);
        for (const ref::AttentionState* m : std::vector<const ref::AttentionState*>{&r, &x, &whole}) {
          const double e = rel_err(l.o, m->o);
          assoc.add(e);
          EXPECT_LE(e, 1e-6) << "d=" << d << " s=" << s;
          EXPECT_NEAR(l.s, m->s, 1e-5 * std::max(1.0f, std::fabs(m->s)));
        }
        // The empty subset: identity on either side, and empty·empty stays empty without NaN.
        const ref::AttentionState e = ref::empty_state(d);
        const auto ae = ref::merge_states(b, e), ea = ref::merge_states(e, b), ee = ref::merge_states(e, e);
        EXPECT_EQ(ae.o, b.o);
        EXPECT_EQ(ea.o, b.o);
        EXPECT_EQ(ae.s, b.s);
        EXPECT_EQ(ee.s, -INFINITY);
        for (float v : ee.o) EXPECT_EQ(v, 0.0f);
        for (float v : ae.o) EXPECT_FALSE(std::isnan(v));
      }
}

// Sequences whose tables share the physical blocks of another table's first `shared` tokens;
// a partially shared block is a copy-on-write copy (same rows below `shared`, fresh after).
struct SharedPool {
  Pool p;
  std::vector<int32_t> free_blocks;
  int32_t fresh() {
    const int32_t b = free_blocks.back();
    free_blocks.pop_back();
    return b;
  }
  std::vector<int32_t> table(const std::vector<int32_t>* src, int32_t shared, int32_t len) {
    std::vector<int32_t> t;
    const int32_t full = shared / kBlock;
    for (int32_t i = 0; i < full; ++i) t.push_back((*src)[i]);
    if (shared % kBlock != 0) {
      const int32_t b = fresh();
      for (int32_t g = 0; g < kKvHeads; ++g)
        for (int32_t row = 0; row < shared % kBlock; ++row)
          for (int32_t c = 0; c < p.d; ++c) {
            const int64_t from = ((int64_t((*src)[full]) * kKvHeads + g) * kBlock + row) * p.d + c;
            const int64_t to = ((int64_t(b) * kKvHeads + g) * kBlock + row) * p.d + c;
            p.kf[to] = p.kf[from];
            p.vf[to] = p.vf[from];
          }
      t.push_back(b);
    }
    while (static_cast<int32_t>(t.size()) * kBlock < len) t.push_back(fresh());
    return t;
  }
};

SharedPool make_shared_pool(int32_t d, KvDtype dt, int32_t physical, std::mt19937& rng) {
  SharedPool sp;
  sp.p = make_pool(d, dt, physical, 1, rng);
  sp.free_blocks.resize(physical);
  std::iota(sp.free_blocks.begin(), sp.free_blocks.end(), 0);
  std::shuffle(sp.free_blocks.begin(), sp.free_blocks.end(), rng);
  return sp;
}

TEST(SparseReference, BifurcatedEqualsDensePerSequence) {
  std::mt19937 rng(2);
  Worst one{"bifurcated, one prefix, b = 3"}, nested{"bifurcated, nested prefixes"};
  const int32_t suffix[3] = {0, 5, 17};  // tokens after the shared prefix (0: query is its last)
  for (int32_t d : kDims)
    for (int32_t g : kGroups)
      for (int32_t mc : kLens)
        for (KvDtype dt : kDtypes) {
          if (mc == 1999 && g != 4) continue;  // long prefix: one group size keeps the test fast
          const int32_t n_heads = g * kKvHeads;
          SharedPool sp = make_shared_pool(d, dt, 4 * ((mc + 17) / kBlock + 2), rng);
          const std::vector<int32_t> prefix = sp.table(nullptr, 0, mc);
          std::vector<std::vector<int32_t>> tables;
          for (int32_t i = 0; i < 3; ++i) tables.push_back(sp.table(&prefix, mc, mc + suffix[i]));
          sp.p.store();
          std::vector<PagedKvView> views;
          std::vector<ref::DecodeArgs> args;
          std::vector<std::vector<float>> qs, outs(3);
          for (int32_t i = 0; i < 3; ++i) {
            views.push_back(sp.p.view(tables[i]));
            qs.push_back(testing::normal_vector(n_heads * d, rng));
          }
          for (int32_t i = 0; i < 3; ++i) args.push_back(decode(qs[i], outs[i], n_heads, mc + suffix[i] - 1, d));
          const PagedKvView prefix_view = sp.p.view(prefix);
          const int64_t bytes = ref::bifurcated_attention({{&prefix_view, 0, mc, {0, 1, 2}}}, views.data(),
                                                          args.data(), 3);
          for (int32_t i = 0; i < 3; ++i) {
            const double e = rel_err(outs[i], dense(views[i], qs[i].data(), n_heads, args[i].pos));
            one.add(e);
            EXPECT_LE(e, 1e-5) << "d=" << d << " g=" << g << " mc=" << mc << " seq " << i;
          }
          // (m_c + Σ m_d)·2·d per kv head.
          EXPECT_EQ(bytes, int64_t(mc + 0 + 5 + 17) * 2 * d * kKvHeads * int64_t(kv_dtype_bytes(dt)));
        }
  // Nested: [0, m0) shared by all three, [m0, m1) by sequences 0 and 1 only.
  for (int32_t d : kDims)
    for (KvDtype dt : kDtypes)
      for (auto [m0, m1] : {std::pair{16, 39}, std::pair{7, 64}, std::pair{100, 301}}) {
        const int32_t g = 3, n_heads = g * kKvHeads;
        SharedPool sp = make_shared_pool(d, dt, 4 * (m1 / kBlock + 4), rng);
        const std::vector<int32_t> root = sp.table(nullptr, 0, m0);
        const std::vector<int32_t> doc = sp.table(&root, m0, m1);
        std::vector<std::vector<int32_t>> tables = {sp.table(&doc, m1, m1 + 3), sp.table(&doc, m1, m1 + 9),
                                                    sp.table(&root, m0, m0 + 20)};
        sp.p.store();
        std::vector<PagedKvView> views;
        std::vector<ref::DecodeArgs> args;
        std::vector<std::vector<float>> qs, outs(3);
        const int32_t pos[3] = {m1 + 2, m1 + 8, m0 + 19};
        for (int32_t i = 0; i < 3; ++i) {
          views.push_back(sp.p.view(tables[i]));
          qs.push_back(testing::normal_vector(n_heads * d, rng));
        }
        for (int32_t i = 0; i < 3; ++i) args.push_back(decode(qs[i], outs[i], n_heads, pos[i], d));
        const PagedKvView root_view = sp.p.view(root), doc_view = sp.p.view(doc);
        const int64_t bytes = ref::bifurcated_attention(
            {{&doc_view, m0, m1, {0, 1}}, {&root_view, 0, m0, {0, 1, 2}}}, views.data(), args.data(), 3);
        for (int32_t i = 0; i < 3; ++i) {
          const double e = rel_err(outs[i], dense(views[i], qs[i].data(), n_heads, pos[i]));
          nested.add(e);
          EXPECT_LE(e, 1e-5) << "d=" << d << " m0=" << m0 << " m1=" << m1 << " seq " << i;
        }
        EXPECT_EQ(bytes, int64_t(m1 + 3 + 9 + 20) * 2 * d * kKvHeads * int64_t(kv_dtype_bytes(dt)));
      }
}

// SparQ with k ≥ S (l ≤ k), HiP with mask_k ≥ S, SWA with r = 1: every position is attended,
// so each equals dense decode. Also checks each policy's bytes-read counter against its formula.
TEST(SparseReference, LoosestSettingsEqualDense) {
  std::mt19937 rng(3);
  Worst sq_on{"sparq k >= S, reallocation on"}, sq_off{"sparq k >= S, reallocation off"};
  Worst hip{"hip mask_k >= S"}, swa{"swa r = 1"};
  for (int32_t d : kDims)
    for (int32_t g : kGroups)
      for (int32_t s : kLens)
        for (KvDtype dt : kDtypes) {
          const int32_t n_heads = g * kKvHeads, pos = s - 1;
          const int64_t elem = kv_dtype_bytes(dt);
          const Pool p = make_pool(d, dt, (s + kBlock - 1) / kBlock + 3, s, rng);
          const auto q = testing::normal_vector(n_heads * d, rng);
          const auto want = dense(p.view(), q.data(), n_heads, pos);
          std::vector<float> out;
          for (bool realloc : {true, false}) {
            ref::SparqParams sp;
            sp.k = s + (realloc ? 0 : 5);
            sp.l = std::min(sp.k, 32);
            sp.reallocation = realloc;
            const ref::SparqStats st = ref::sparq_attention(p.view(), decode(q, out, n_heads, pos, d), sp);
            const double e = rel_err(out, want);
            (realloc ? sq_on : sq_off).add(e);
            EXPECT_LE(e, 1e-5) << "sparq d=" << d << " g=" << g << " s=" << s << " realloc=" << realloc;
            // Per kv head: S·r (step 2) + 2·k·d (step 5) + S·d (v̄ computed from V when reallocating).
            const int64_t r = d / 8, per_head = int64_t(s) * r + 2 * int64_t(s) * d + (realloc ? int64_t(s) * d : 0);
            EXPECT_EQ(st.kv_bytes, per_head * kKvHeads * elem);
            EXPECT_EQ(st.r, r);
          }
          ref::HipParams hp;
          hp.mask_k = s;  // T′ = pos − window − sink < mask_k: dense
          ref::HipBytes hb = ref::hip_attention(p.view(), decode(q, out, n_heads, pos, d), hp);
          double e = rel_err(out, want);
          hip.add(e);
          EXPECT_LE(e, 1e-5) << "hip d=" << d << " g=" << g << " s=" << s;
          EXPECT_EQ(hb.total(), 2 * int64_t(s) * d * kKvHeads * elem);
          std::vector<float> mass(s);
          for (float& m : mass) m = std::uniform_real_distribution<float>(0, 1)(rng);
          const ref::SwaStats ss = ref::swa_attention(p.view(), decode(q, out, n_heads, pos, d), {1.0f}, mass.data());
          e = rel_err(out, want);
          swa.add(e);
          EXPECT_LE(e, 1e-5) << "swa d=" << d << " g=" << g << " s=" << s;
          EXPECT_EQ(ss.kv_bytes, 2 * int64_t(s) * d * kKvHeads * elem);
        }
}

// A few keys dominate: SparQ with small k must select exactly them (top-k correspondence 1),
// always keep the last l positions, count S·r + 2·k·d (+ d·4 for a supplied v̄) per kv head, and
// stay close to dense. Dominant keys are K = c·q̄_g (q̄_g: the group's mean query, the group's
// queries are q̄_g + 0.1·noise) with logit ≈ 16; random keys have logits ~ N(0, 1).
TEST(SparseReference, SparqSelectsDominantKeys) {
  std::mt19937 rng(4);
  Worst on{"sparq dominant keys, realloc on (bound 1e-3)"}, off{"sparq dominant keys, realloc off (bound 1e-3)"};
  for (int32_t d : kDims)
    for (int32_t g : kGroups)
      for (KvDtype dt : kDtypes) {
        const int32_t s = 1000, pos = s - 1, n_heads = g * kKvHeads, k = 16, l = 4;
        Pool p = make_pool(d, dt, s / kBlock + 3, s, rng);
        std::vector<float> q = testing::normal_vector(n_heads * d, rng);
        std::vector<std::vector<int32_t>> dominant(kKvHeads);
        for (int32_t kh = 0; kh < kKvHeads; ++kh) {
          const std::vector<float> base = testing::normal_vector(d, rng);
          for (int32_t j = 0; j < g; ++j)
            for (int32_t c = 0; c < d; ++c) q[(kh * g + j) * d + c] = base[c] + 0.1f * testing::normal_vector(1, rng)[0];
          double norm2 = 0;
          for (float x : base) norm2 += double(x) * x;
          std::vector<int32_t> cand = ref::position_range(0, s - l);
          std::shuffle(cand.begin(), cand.end(), rng);
          dominant[kh].assign(cand.begin(), cand.begin() + (k - l));
          std::sort(dominant[kh].begin(), dominant[kh].end());
          for (int32_t t : dominant[kh])
            for (int32_t c = 0; c < d; ++c) p.kf[p.offset(t, kh) + c] = float(16.0 * std::sqrt(d) / norm2 * base[c]);
        }
        p.store();
        const auto want = dense(p.view(), q.data(), n_heads, pos);
        std::vector<float> vbar(kKvHeads * d, 0.0f);  // exact mean of the stored V, as a cache keeps it
        std::vector<float> row(d);
        for (int32_t kh = 0; kh < kKvHeads; ++kh) {
          for (int32_t t = 0; t < s; ++t) {
            ref::load_kv_row(p.view(), p.v.data(), t, kh, row.data());
            for (int32_t c = 0; c < d; ++c) vbar[kh * d + c] += row[c] / s;
          }
        }
        for (bool realloc : {true, false}) {
          std::vector<float> out;
          const ref::SparqStats st = ref::sparq_attention(p.view(), decode(q, out, n_heads, pos, d),
                                                          {k, l, -1, realloc}, vbar.data());
          for (int32_t kh = 0; kh < kKvHeads; ++kh) {
            std::vector<int32_t> expect = dominant[kh];
            for (int32_t t = s - l; t < s; ++t) expect.push_back(t);
            EXPECT_EQ(st.selected[kh], expect) << "d=" << d << " g=" << g << " kv head " << kh;
          }
          const double e = rel_err(out, want);
          (realloc ? on : off).add(e);
          EXPECT_LE(e, 1e-3) << "d=" << d << " g=" << g;
          const int64_t per_head = int64_t(s) * (d / 8) * int64_t(kv_dtype_bytes(dt)) +
                                   2 * int64_t(k) * d * int64_t(kv_dtype_bytes(dt)) + (realloc ? int64_t(d) * 4 : 0);
          EXPECT_EQ(st.kv_bytes, per_head * kKvHeads);
        }
      }
}

// SparQ with the keys' spread (sparq_key_spread, the key_spread argument): σ is each component's
// standard deviation over the positions; the run equals SparQ on keys k[c]/√σ[c] with the queries
// q[c]·√σ[c] (same I2, α and output up to rounding), and with σ = 1 it is bitwise the paper's rule.
// Keys here have very different spreads per component, as real keys do.
TEST(SparseReference, SparqKeySpreadIsSparqOnRescaledKeys) {
  std::mt19937 rng(9);
  Worst worst{"sparq key spread vs rescaled keys (bound 1e-5)"};
  for (int32_t d : {64, 256})
    for (int32_t g : {1, 3, 4}) {
      const int32_t s = 777, pos = s - 1, n_heads = g * kKvHeads;
      Pool p = make_pool(d, KvDtype::kF32, s / kBlock + 2, s, rng);
      std::vector<float> spread_of_c(d);
      for (float& x : spread_of_c) x = std::exp(2.0f * testing::normal_vector(1, rng)[0]);  // spreads over ~e^±4
      for (int32_t t = 0; t < s; ++t)
        for (int32_t kh = 0; kh < kKvHeads; ++kh)
          for (int32_t c = 0; c < d; ++c) p.kf[p.offset(t, kh) + c] = p.kf[p.offset(t, kh) + c] * spread_of_c[c] + 0.5f;
      p.store();
      const std::vector<float> q = testing::normal_vector(n_heads * d, rng);
      const std::vector<float> sigma = ref::sparq_key_spread(p.view(), s);
      // σ against a two-pass mean / variance in double.
      for (int32_t kh = 0; kh < kKvHeads; ++kh)
        for (int32_t c = 0; c < d; ++c) {
          double mean = 0, var = 0;
          for (int32_t t = 0; t < s; ++t) mean += p.kf[p.offset(t, kh) + c] / double(s);
          for (int32_t t = 0; t < s; ++t) var += std::pow(p.kf[p.offset(t, kh) + c] - mean, 2) / s;
          ASSERT_NEAR(sigma[kh * d + c], std::sqrt(var), 1e-5 * std::sqrt(var)) << "c=" << c;
        }
      Pool unit = p;  // k[c] / √σ[c], the queries q[c]·√σ[c]
      std::vector<float> q_unit = q;
      for (int32_t t = 0; t < s; ++t)
        for (int32_t kh = 0; kh < kKvHeads; ++kh)
          for (int32_t c = 0; c < d; ++c) unit.kf[unit.offset(t, kh) + c] /= std::sqrt(sigma[kh * d + c]);
      unit.store();
      for (int32_t h = 0; h < n_heads; ++h)
        for (int32_t c = 0; c < d; ++c) q_unit[h * d + c] *= std::sqrt(sigma[(h / g) * d + c]);
      const ref::SparqParams params{64, 16, d / 8, true};
      std::vector<float> out, out_unit, out_plain, out_ones;
      const ref::SparqStats st = ref::sparq_attention(p.view(), decode(q, out, n_heads, pos, d), params, nullptr, sigma.data());
      const ref::SparqStats su = ref::sparq_attention(unit.view(), decode(q_unit, out_unit, n_heads, pos, d), params);
      for (int32_t kh = 0; kh < kKvHeads; ++kh) EXPECT_EQ(st.selected[kh], su.selected[kh]) << "d=" << d << " g=" << g;
      for (int32_t h = 0; h < n_heads; ++h) EXPECT_NEAR(st.alpha[h], su.alpha[h], 1e-5);
      worst.add(rel_err(out, out_unit));
      EXPECT_LE(rel_err(out, out_unit), 1e-5) << "d=" << d << " g=" << g;
      // σ = 1 everywhere: the paper's rule, bit for bit. And these spreads do change the selection.
      const std::vector<float> ones(sigma.size(), 1.0f);
      const ref::SparqStats sp = ref::sparq_attention(p.view(), decode(q, out_plain, n_heads, pos, d), params);
      const ref::SparqStats so = ref::sparq_attention(p.view(), decode(q, out_ones, n_heads, pos, d), params, nullptr, ones.data());
      EXPECT_EQ(sp.selected, so.selected);
      EXPECT_EQ(out_plain, out_ones);
      EXPECT_NE(sp.selected, st.selected) << "d=" << d << " g=" << g;
    }
}

// The case the weighting is for: the query's largest components lie along directions where every
// key is the same (they add a constant to every logit), and the planted keys differ from the rest
// only along a component with a small query weight. The paper's rule spends r = 1 on the constant
// component and ranks at random; weighted by the keys' spread it picks the informative one.
TEST(SparseReference, SparqKeySpreadFindsKeysAlongALowQueryComponent) {
  std::mt19937 rng(12);
  const int32_t d = 64, g = 2, s = 600, pos = s - 1, n_heads = g * kKvHeads, k = 24, l = 4;
  Pool p = make_pool(d, KvDtype::kF32, s / kBlock + 2, s, rng);
  std::vector<float> q(n_heads * d, 0.01f);
  std::vector<std::vector<int32_t>> planted(kKvHeads);
  for (int32_t kh = 0; kh < kKvHeads; ++kh) {
    for (int32_t j = 0; j < g; ++j) q[(kh * g + j) * d + 0] = 8.0f, q[(kh * g + j) * d + 1] = 1.0f;
    for (int32_t t = 0; t < s; ++t) {
      for (int32_t c = 0; c < d; ++c) p.kf[p.offset(t, kh) + c] = 0.01f * p.kf[p.offset(t, kh) + c];
      p.kf[p.offset(t, kh) + 0] = 1.0f;  // every key the same along component 0
    }
    std::vector<int32_t> cand = ref::position_range(0, s - l);
    std::shuffle(cand.begin(), cand.end(), rng);
    planted[kh].assign(cand.begin(), cand.begin() + (k - l));
    std::sort(planted[kh].begin(), planted[kh].end());
    for (int32_t t : planted[kh]) p.kf[p.offset(t, kh) + 1] = 40.0f;
  }
  p.store();
  const std::vector<float> sigma = ref::sparq_key_spread(p.view(), s);
  const ref::SparqParams params{k, l, 1, true};
  std::vector<float> out;
  const ref::SparqStats weighted = ref::sparq_attention(p.view(), decode(q, out, n_heads, pos, d), params, nullptr, sigma.data());
  const ref::SparqStats plain = ref::sparq_attention(p.view(), decode(q, out, n_heads, pos, d), params);
  for (int32_t kh = 0; kh < kKvHeads; ++kh) {
    std::vector<int32_t> expect = planted[kh];
    for (int32_t t = s - l; t < s; ++t) expect.push_back(t);
    EXPECT_EQ(weighted.selected[kh], expect) << "kv head " << kh;
    std::vector<int32_t> found;
    std::set_intersection(plain.selected[kh].begin(), plain.selected[kh].end(), planted[kh].begin(), planted[kh].end(),
                          std::back_inserter(found));
    EXPECT_LT(found.size(), planted[kh].size() / 2) << "the paper's rule, r = 1, should not see the planted keys";
  }
}

// HiP's sparse path (S ≈ 2000 with the reference defaults mask_k 512, block 2, sink 16, window
// 256): a planted region of 64 tokens whose keys align with the group's query (logit ≈ 16) must
// be in every head's mask; each head keeps exactly mask_k / block_size_k distinct blocks inside
// the middle region; V bytes for G = 1 (or one mask per kv head) are exactly
// (mask_k + sink + window + 1)·d per kv head;
// the output stays near dense; a mask estimated 7 steps earlier is reused with the window
// following the current position.
TEST(SparseReference, HipSparsePathSelectsPlantedBlocks) {
  std::mt19937 rng(5);
  Worst fresh{"hip sparse, planted region (bound 1e-3)"}, reused{"hip sparse, mask reused 7 steps (bound 1e-3)"};
  const int32_t s = 2000, pos_est = s - 8, plant_lo = 600, plant_hi = 664;
  for (bool per_kv_head : {false, true})
  for (int32_t d : kDims)
    for (int32_t g : kGroups)
      for (KvDtype dt : kDtypes) {
        ref::HipParams hp;  // defaults
        hp.per_kv_head = per_kv_head;
        const int32_t n_heads = g * kKvHeads;
        const int64_t elem = kv_dtype_bytes(dt);
        Pool p = make_pool(d, dt, s / kBlock + 3, s, rng);
        std::vector<float> q = testing::normal_vector(n_heads * d, rng);
        for (int32_t kh = 0; kh < kKvHeads; ++kh) {
          const std::vector<float> base = testing::normal_vector(d, rng);
          for (int32_t j = 0; j < g; ++j)
            for (int32_t c = 0; c < d; ++c) q[(kh * g + j) * d + c] = base[c] + 0.1f * testing::normal_vector(1, rng)[0];
          double norm2 = 0;
          for (float x : base) norm2 += double(x) * x;
          for (int32_t t = plant_lo; t < plant_hi; ++t)
            for (int32_t c = 0; c < d; ++c) p.kf[p.offset(t, kh) + c] = float(16.0 * std::sqrt(d) / norm2 * base[c]);
        }
        p.store();
        std::vector<float> out;
        ref::HipBytes bytes;
        const ref::HipMask mask = ref::hip_estimate_mask(p.view(), decode(q, out, n_heads, pos_est, d), hp, &bytes);
        ASSERT_FALSE(mask.dense);
        const int32_t t_mid = pos_est - hp.window - hp.sink;
        for (int32_t h = 0; h < n_heads; ++h) {
          const std::vector<int32_t>& b = mask.block_starts[h];
          ASSERT_EQ(static_cast<int32_t>(b.size()), hp.mask_k / hp.block_size_k);
          EXPECT_TRUE(std::adjacent_find(b.begin(), b.end(), std::greater_equal<int32_t>()) == b.end());
          for (int32_t x : b) {
            EXPECT_GE(x, hp.sink);
            EXPECT_LT(x, hp.sink + t_mid);
            EXPECT_EQ((x - hp.sink) % hp.block_size_k, 0);
          }
          for (int32_t t = plant_lo; t < plant_hi; t += hp.block_size_k)
            EXPECT_TRUE(std::binary_search(b.begin(), b.end(), t)) << "planted block " << t << " head " << h;
        }
        const int64_t k_est = bytes.k_bytes;
        EXPECT_GT(k_est, 0);
        ref::hip_sparse_attention(p.view(), decode(q, out, n_heads, pos_est, d), hp, mask, &bytes);
        const int64_t v_rows = bytes.v_bytes / (d * elem * kKvHeads);
        if (g == 1 || per_kv_head) {  // t_mid is even: every selected block is full; one selection per kv head
          EXPECT_EQ(v_rows, hp.mask_k + hp.sink + hp.window + 1);
        }
        EXPECT_GE(v_rows, hp.mask_k + hp.sink + hp.window + 1);
        EXPECT_EQ(bytes.k_bytes - k_est, bytes.v_bytes);
        double e = rel_err(out, dense(p.view(), q.data(), n_heads, pos_est));
        fresh.add(e);
        EXPECT_LE(e, 1e-3) << "d=" << d << " g=" << g;
        ref::hip_sparse_attention(p.view(), decode(q, out, n_heads, s - 1, d), hp, mask, nullptr);
        e = rel_err(out, dense(p.view(), q.data(), n_heads, s - 1));
        reused.add(e);
        EXPECT_LE(e, 1e-3) << "reused d=" << d << " g=" << g;
      }
}

// SWA at r = 1/4 keeps the last ⌊n·r/2⌋ tokens and the same number of older tokens with the
// largest mass; the output equals dense attention over a pool holding only the kept rows.
TEST(SparseReference, SwaKeepsRecentAndHeavyTokens) {
  std::mt19937 rng(6);
  Worst w{"swa r = 1/4 vs dense over the kept rows"};
  for (int32_t d : kDims)
    for (int32_t g : kGroups)
      for (KvDtype dt : kDtypes) {
        const int32_t n = 1001, n_heads = g * kKvHeads;
        const Pool p = make_pool(d, dt, n / kBlock + 3, n, rng);
        const auto q = testing::normal_vector(n_heads * d, rng);
        std::vector<float> mass(n), out;
        for (float& m : mass) m = std::uniform_real_distribution<float>(0, 1)(rng);
        const ref::SwaStats st = ref::swa_attention(p.view(), decode(q, out, n_heads, n - 1, d), {0.25f}, mass.data());
        const int32_t k_local = n / 8, k_global = n / 4 - k_local;  // 125, 125
        ASSERT_EQ(st.k_local, k_local);
        ASSERT_EQ(st.k_global, k_global);
        std::vector<int32_t> order = ref::position_range(0, n - k_local);
        std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return mass[a] > mass[b]; });
        std::vector<int32_t> expect(order.begin(), order.begin() + k_global);
        for (int32_t t = n - k_local; t < n; ++t) expect.push_back(t);
        std::sort(expect.begin(), expect.end());
        ASSERT_EQ(st.kept, expect);
        EXPECT_EQ(st.kv_bytes, int64_t(k_local + k_global) * 2 * d * kKvHeads * int64_t(kv_dtype_bytes(dt)));
        // Compact pool: logical position i holds kept row expect[i] (attention is order-free).
        Pool c = make_pool(d, dt, (n / 4) / kBlock + 2, n / 4, rng);
        for (int32_t i = 0; i < static_cast<int32_t>(expect.size()); ++i)
          for (int32_t kh = 0; kh < kKvHeads; ++kh)
            for (int32_t x = 0; x < d; ++x) {
              c.kf[c.offset(i, kh) + x] = p.kf[p.offset(expect[i], kh) + x];
              c.vf[c.offset(i, kh) + x] = p.vf[p.offset(expect[i], kh) + x];
            }
        c.store();
        const double e = rel_err(out, dense(c.view(), q.data(), n_heads, static_cast<int32_t>(expect.size()) - 1));
        w.add(e);
        EXPECT_LE(e, 1e-5) << "d=" << d << " g=" << g;
      }
}

// INT8 round trip: |x − dequant(quant(x))| ≤ λ/2 per element (+ f32 rounding), over group sizes
// 32/64/128, a short last group, a constant group and groups offset far from zero.
TEST(SparseReference, Int8RoundTripWithinHalfStep) {
  std::mt19937 rng(7);
  double worst = 0;  // in units of λ
  for (int32_t gs : {32, 64, 128})
    for (int64_t n : {int64_t(1), int64_t(7), int64_t(64), int64_t(128 * 33 + 5)}) {
      std::vector<float> x(n);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      for (int64_t g0 = 0; g0 < n; g0 += gs) {
        const float spread = std::exp(normal(rng) * 2.0f), offset = (g0 / gs) % 3 == 2 ? 100.0f : 0.0f;
        for (int64_t i = g0; i < std::min<int64_t>(n, g0 + gs); ++i)
          x[i] = (g0 / gs) % 5 == 4 ? 3.25f : offset + spread * normal(rng);  // every 5th group constant
      }
      const int64_t n_groups = (n + gs - 1) / gs;
      std::vector<uint8_t> q(n);
      std::vector<ref::Int8Group> groups(n_groups);
      std::vector<float> y(n);
      ref::kv_int8_quantize(x.data(), n, gs, q.data(), groups.data());
      ref::kv_int8_dequantize(q.data(), groups.data(), n, gs, y.data());
      EXPECT_EQ(ref::kv_int8_bytes(n, gs), n + n_groups * 8);
      for (int64_t i = 0; i < n; ++i) {
        const ref::Int8Group& g = groups[i / gs];
        const double err = std::fabs(double(x[i]) - y[i]);
        const double bound = g.scale / 2.0 * (1 + 1e-4) + 4 * FLT_EPSILON * (std::fabs(g.min) + 255.0 * g.scale);
        EXPECT_LE(err, bound) << "i=" << i << " gs=" << gs;
        if (g.scale > 0) {
          worst = std::max(worst, err / g.scale);
        } else {
          EXPECT_EQ(err, 0.0);
        }
      }
    }
  std::printf("  %-44s worst |x - x'| / lambda = %.4f\n", "int8 round trip", worst);
}

// sparq_params_for_ratio: the transfer model's ratio at the chosen (r, k) lands near the target
// c wherever the k floor does not bind (c·S/2 ≥ 128), k is the floor where it does, and the
// kernel's counter (without v̄) equals S·r + 2·k·d per kv head.
TEST(SparseReference, SparqParamsForRatioHitTheTransferModel) {
  double worst = 0;
  for (int32_t d : kDims)
    for (int32_t s : {1024, 4096, 16384, 65536})
      for (double c : {0.5, 0.25, 0.125}) {
        const ref::SparqParams p = ref::sparq_params_for_ratio(c, s, d);
        const double m_sparq = double(s) * p.r + 2.0 * p.k * d + 4.0 * d, m_dense = 2.0 * s * d + 2.0 * d;
        if (c * s / 2 < ref::kSparqMinK) {
          EXPECT_EQ(p.k, ref::kSparqMinK) << "d=" << d << " S=" << s << " c=" << c;
          continue;
        }
        const double rel = std::fabs(m_sparq / m_dense - c) / c;
        worst = std::max(worst, rel);
        EXPECT_LE(rel, 0.1) << "d=" << d << " S=" << s << " c=" << c << " r=" << p.r << " k=" << p.k;
        EXPECT_EQ(p.l, p.k / 4);
      }
  std::printf("  %-44s worst |c_model - c| / c = %.4f\n", "sparq_params_for_ratio", worst);
  std::mt19937 rng(8);
  const int32_t d = 64, s = 1500, n_heads = 3 * kKvHeads;
  const Pool p = make_pool(d, KvDtype::kF16, s / kBlock + 3, s, rng);
  const auto q = testing::normal_vector(n_heads * d, rng);
  std::vector<float> out;
  const ref::SparqParams sp = ref::sparq_params_for_ratio(0.125, s, d, false);
  const ref::SparqStats st = ref::sparq_attention(p.view(), decode(q, out, n_heads, s - 1, d), sp);
  // Random data has a flat softmax with nothing to find, so the error is large; informative only.
  std::printf("  sparq c = 1/8 at S = %d, d = %d: r = %d, k = %d, l = %d, rel err vs dense %.3g (random data)\n", s,
              d, st.r, st.k, st.l, rel_err(out, dense(p.view(), q.data(), n_heads, s - 1)));
  EXPECT_EQ(st.kv_bytes, (int64_t(s) * sp.r + 2 * int64_t(sp.k) * d) * 2 * kKvHeads);
  for (const auto& sel : st.selected) EXPECT_EQ(static_cast<int32_t>(sel.size()), sp.k);
}

}  // namespace
}  // namespace fathom
