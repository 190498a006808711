// CPU sparse decode policies (kernels/cpu/sparse_attention.h) against their scalar references in
// kernels/ref, on every SIMD level this CPU has. Grid: head dim 64/128/256, GQA group 1/3/4/8,
// S = 1, 7 (below a block), 16 (one block), 33 (odd), 2001 (long); f32 / f16 / INT8 KV; with and
// without the side data (transposed K, running V sums); block size 16, plus 8, 32 and 64 for d = 64,
// G = 3. Block tables are shuffled.
//
// Selection. The CPU ranks by f32 scores summed in its own order, the reference in double, so on
// near-ties they may pick differently. SparQ: per kv head the selections must overlap in ≥ 98% of
// I2, and be identical whenever the reference's boundary gap (k-th vs k+1-th non-forced group
// score, recomputed here in double) exceeds 1e-4·(1 + max |score|). HiP: ≥ 95% of each head's
// blocks shared (the estimate is iterative, a flip in one iteration can move a few blocks). SWA
// ranks the caller's f32 mass itself: identical always.
// Outputs are checked against the reference's attention over the CPU's own selection (SparQ:
// ref::partial_attention over the CPU's I2, α recomputed here in double over that I2; HiP:
// ref::hip_sparse_attention with the CPU's mask) and, when the selections agree, against the
// reference end to end (α, output, bytes).
// Tolerance |cpu − ref| ≤ atol + rtol·|ref|: every dtype reads the same stored values as the
// reference (f16 converted exactly, INT8 as scale·x_q + min but summed as scale·(q·x_q) + min·Σq),
// so only f32 summation order and the 2-ulp vector exp differ: atol = rtol = 5e-6 (f32, f16),
// 2e-5 (INT8, the regrouped dequantisation cancels terms of size ~|min·Σq|). α: 1e-5 absolute.
// Seen (outputs ~N(0,1)): worst 7e-7 for f32 / f16, 2e-6 for INT8; SWA, whose local window goes
// through the dense Kᵀ kernel's 64-key online softmax when the view has k_t: 1.3e-6 / 6e-6.
// Exactness: SparQ with k ≥ S, HiP with mask_k ≥ S (T′ ≤ mask_k) and SWA with ratio 1 equal dense
// attention (ref::paged_attention; cpu::paged_attention too for f32 / f16).
// Bytes: the formulas in sparse_attention.h, and equal to the reference's counters for f32 / f16.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iterator>
#include <map>
#include <numeric>
#include <random>
#include <stdexcept>
#include <set>
#include <string>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/sparse_attention.h"
#include "kernels/cpu/sparse_common.h"
#include "kernels/ref/attention.h"
#include "tests/kernel/paged_kv_fixture.h"

namespace fathom {
namespace {

constexpr int32_t kBlock = 16, kKvHeads = 2;
const int32_t kDims[] = {64, 128, 256};
const int32_t kGroups[] = {1, 3, 4, 8};
const int32_t kLens[] = {1, 7, 16, 33, 2001};
const KvDtype kDtypes[] = {KvDtype::kF32, KvDtype::kF16, KvDtype::kI8};

double tolerance(KvDtype t) { return t == KvDtype::kI8 ? 2e-5 : 5e-6; }

// Worst |cpu − ref| per dtype, printed at the end of each test.
struct Worst {
  std::map<std::string, double> err;
  void print(const char* what) const {
    for (const auto& [name, e] : err) std::printf("  %s %-5s worst |cpu - ref| = %.3g\n", what, name.c_str(), e);
  }
};

// Checks a against b elementwise; returns the worst absolute error.
double compare(const float* a, const float* b, int64_t n, KvDtype dtype, Worst& worst) {
  const double tol = tolerance(dtype);
  double e = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double x = std::fabs(static_cast<double>(a[i]) - b[i]);
    e = std::max(e, x);
    if (x > tol + tol * std::fabs(b[i])) {
      ADD_FAILURE() << "element " << i << ": cpu " << a[i] << " ref " << b[i];
      break;
    }
  }
  double& w = worst.err[kv_dtype_name(dtype)];
  w = std::max(w, e);
  return e;
}

std::vector<float> random_q(int32_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> q(n);
  for (float& x : q) x = normal(rng);
  return q;
}

// Runs fn once per SIMD level the CPU supports, then restores the best level.
template <typename Fn>
void for_each_simd_level(Fn fn) {
  for (const char* level : {"portable", "avx2", "avx512"}) {
    if (!cpu::set_simd_level_for_testing(level)) continue;
    if (std::string(cpu::simd_level()) != level) continue;
    SCOPED_TRACE(level);
    fn();
  }
  if (!cpu::set_simd_level_for_testing("avx512")) cpu::set_simd_level_for_testing("avx2");
}

// The full grid at block size 16 (the engine's); block sizes 8 (the generic tile path), 32 and 64
// (several 16-position sub-tiles per k_t tile) for d = 64, G = 3.
template <typename Fn>
void for_each_case(Fn fn) {
  std::mt19937 rng(1234);
  for (int32_t bs : {kBlock, 8, 32, 64})
    for (int32_t d : kDims)
      for (int32_t G : kGroups)
        for (int32_t S : kLens)
          for (KvDtype dtype : kDtypes) {
            if (bs != kBlock && (d != 64 || G != 3)) continue;
            const testing::PagedKvFixture f = testing::make_paged_kv(d, kKvHeads, bs, dtype, S, 2, rng);
            const std::vector<float> q = random_q(G * kKvHeads * d, rng);
            for (bool side : {false, true}) {
              SCOPED_TRACE("d=" + std::to_string(d) + " G=" + std::to_string(G) + " S=" + std::to_string(S) + " " +
                           kv_dtype_name(dtype) + " block=" + std::to_string(bs) + (side ? " +k_t/v_sum" : ""));
              fn(f, f.view(side, side), q, G, S, rng);
            }
          }
}

DecodeArgs decode_args(const std::vector<float>& q, std::vector<float>& out, int32_t n_heads, int32_t d, int32_t S) {
  out.assign(static_cast<size_t>(n_heads) * d, 0.0f);
  return DecodeArgs{q.data(), out.data(), n_heads, S - 1, 1.0f / std::sqrt(static_cast<float>(d))};
}

// cpu::swa_decode with its kept positions' weights scattered into weights ([S]; 0 where not kept).
cpu::SwaResult swa_scattered(ThreadPool& pool, const PagedKvView& kv, const DecodeArgs& a, float ratio, const float* mass,
                             std::vector<float>& weights, std::vector<int32_t>* kept_out = nullptr) {
  std::vector<float> kept_weights;
  std::vector<int32_t> kept;
  const cpu::SwaResult res = cpu::swa_decode(pool, kv, a, ref::SwaParams{ratio}, mass, &kept_weights, &kept);
  if (kept_weights.size() != kept.size()) throw std::logic_error("swa_decode: one weight per kept position");
  weights.assign(static_cast<size_t>(a.pos) + 1, 0.0f);
  for (size_t i = 0; i < kept.size(); ++i) weights[kept[i]] = kept_weights[i];
  if (kept_out != nullptr) *kept_out = std::move(kept);
  return res;
}

// The mean of V over [0, pos] per kv head from the cache's running sums ([kKvHeads][d]), as
// sparq_decode reads it; empty without them.
std::vector<float> cache_v_mean(const PagedKvView& kv, int32_t pos) {
  std::vector<float> v_mean;
  if (kv.v_sum != nullptr)
    for (int32_t g = 0; g < kKvHeads; ++g)
      for (int32_t c = 0; c < kv.head_dim; ++c) v_mean.push_back(kv.v_sum[kv.sum_index(pos, g) + c] / (pos + 1));
  return v_mean;
}

// Dense attention of the decode query: ref::paged_attention.
std::vector<float> dense_ref(const PagedKvView& kv, const DecodeArgs& a) {
  std::vector<float> out(static_cast<size_t>(a.n_heads) * kv.head_dim);
  ref::paged_attention(kv, AttentionArgs{a.q, out.data(), 1, a.n_heads, a.pos, 0, a.scale});
  return out;
}

// SparQ steps 1–2 in double exactly as the reference: approx [G][S] for kv head g.
std::vector<double> sparq_scores_double(const PagedKvView& kv, const DecodeArgs& a, int32_t g, int32_t r) {
  const int32_t d = kv.head_dim, G = a.n_heads / kv.n_kv_heads, S = a.pos + 1;
  const float* qg = a.q + static_cast<int64_t>(g) * G * d;
  std::vector<double> sum_abs(d, 0.0);
  for (int32_t j = 0; j < G; ++j)
    for (int32_t c = 0; c < d; ++c) sum_abs[c] += std::fabs(qg[j * d + c]);
  std::vector<int32_t> dims(d);
  std::iota(dims.begin(), dims.end(), 0);
  std::partial_sort(dims.begin(), dims.begin() + r, dims.end(), [&](int32_t x, int32_t y) {
    return sum_abs[x] != sum_abs[y] ? sum_abs[x] > sum_abs[y] : x < y;
  });
  dims.resize(r);
  std::vector<double> approx(static_cast<size_t>(G) * S);
  std::vector<float> row(d);
  for (int32_t j = 0; j < G; ++j) {
    double l1 = 0, l1_r = 0;
    for (int32_t c = 0; c < d; ++c) l1 += std::fabs(qg[j * d + c]);
    for (int32_t c : dims) l1_r += std::fabs(qg[j * d + c]);
    const double factor = a.scale * (l1_r > 0 ? std::sqrt(l1 / l1_r) : 1.0);
    for (int32_t t = 0; t < S; ++t) {
      ref::load_kv_row(kv, kv.k, t, g, row.data());
      double dot = 0;
      for (int32_t c : dims) dot += static_cast<double>(qg[j * d + c]) * row[c];
      approx[static_cast<size_t>(j) * S + t] = dot * factor;
    }
  }
  return approx;
}

TEST(SparseCpu, SparqMatchesReference) {
  Worst worst;
  int64_t cases = 0, exact_required = 0, differing_heads = 0;
  for_each_simd_level([&] {
    ThreadPool pool(2);
    for_each_case([&](const testing::PagedKvFixture& f, const PagedKvView& kv, const std::vector<float>& q, int32_t G,
                      int32_t S, std::mt19937&) {
      const int32_t d = f.d, H = G * kKvHeads;
      std::vector<float> out_cpu, out_ref;
      const DecodeArgs a = decode_args(q, out_cpu, H, d, S);
      DecodeArgs ar = a;
      out_ref.assign(out_cpu.size(), 0.0f);
      ar.out = out_ref.data();
      ref::SparqParams p;
      p.k = std::max(2, S / 3);
      p.r = d / 8;
      cpu::SparqTrace trace;
      const cpu::SparqResult res = cpu::sparq_decode(pool, kv, a, p, &trace);
      const std::vector<float> v_mean = cache_v_mean(kv, a.pos);
      const ref::SparqStats st = ref::sparq_attention(kv, ar, p, v_mean.empty() ? nullptr : v_mean.data());
      ASSERT_EQ(res.r, st.r);
      ASSERT_EQ(res.k, st.k);
      ASSERT_EQ(res.l, st.l);
      ++cases;
      const int64_t elem = static_cast<int64_t>(kv_dtype_bytes(f.dtype)), row = kv_row_bytes(f.dtype, d);
      const int64_t param = f.dtype == KvDtype::kI8 ? static_cast<int64_t>(sizeof(KvInt8Row)) : 0;
      EXPECT_EQ(res.kv_bytes, kKvHeads * (S * (st.r * elem + param) + 2LL * st.k * row +
                                          (kv.v_sum != nullptr ? 4LL * d : static_cast<int64_t>(S) * row)));
      bool all_same = true;
      for (int32_t g = 0; g < kKvHeads; ++g) {
        const std::vector<int32_t>& sel = trace.selected[g];
        ASSERT_EQ(static_cast<int32_t>(sel.size()), st.k);
        ASSERT_TRUE(std::is_sorted(sel.begin(), sel.end()));
        // (a) selection overlap, exact without a near-tie at the boundary.
        const std::vector<double> approx = sparq_scores_double(kv, a, g, st.r);
        std::vector<int32_t> common;
        std::set_intersection(sel.begin(), sel.end(), st.selected[g].begin(), st.selected[g].end(),
                              std::back_inserter(common));
        EXPECT_GE(static_cast<double>(common.size()), 0.98 * st.k);
        const int32_t first_forced = S - st.l, n_rest = st.k - st.l;
        if (n_rest > 0 && n_rest < first_forced) {
          std::vector<double> summed(first_forced, 0.0);
          for (int32_t t = 0; t < first_forced; ++t)
            for (int32_t j = 0; j < G; ++j) summed[t] += approx[static_cast<size_t>(j) * S + t];
          double mx = 0;
          for (double x : summed) mx = std::max(mx, std::fabs(x));
          std::sort(summed.begin(), summed.end(), std::greater<>());
          if (summed[n_rest - 1] - summed[n_rest] > 1e-4 * (1 + mx)) {
            ++exact_required;
            EXPECT_EQ(sel, st.selected[g]);
          }
        }
        if (sel != st.selected[g]) all_same = false, ++differing_heads;
        // (b) output vs the reference's attention over the CPU's own selection.
        std::vector<ref::AttentionState> y(G);
        ref::partial_attention(kv, g, q.data() + static_cast<int64_t>(g) * G * d, G, a.scale, sel.data(),
                               static_cast<int64_t>(sel.size()), y.data());
        std::vector<double> vbar(d, 0.0);
        if (kv.v_sum != nullptr) {
          for (int32_t c = 0; c < d; ++c) vbar[c] = v_mean[static_cast<size_t>(g) * d + c];
        } else {
          std::vector<float> vrow(d);
          for (int32_t t = 0; t < S; ++t) {
            ref::load_kv_row(kv, kv.v, t, g, vrow.data());
            for (int32_t c = 0; c < d; ++c) vbar[c] += vrow[c];
          }
          for (double& x : vbar) x /= S;
        }
        for (int32_t j = 0; j < G; ++j) {
          const double* s = &approx[static_cast<size_t>(j) * S];
          const double m = *std::max_element(s, s + S);
          double all = 0, chosen = 0;
          for (int32_t t = 0; t < S; ++t) all += std::exp(s[t] - m);
          for (int32_t t : sel) chosen += std::exp(s[t] - m);
          const double alpha = chosen / all;
          EXPECT_NEAR(trace.alpha[g * G + j], alpha, 1e-5);
          std::vector<float> expect(d);
          for (int32_t c = 0; c < d; ++c) expect[c] = static_cast<float>(alpha * y[j].o[c] + (1 - alpha) * vbar[c]);
          compare(&out_cpu[static_cast<size_t>(g * G + j) * d], expect.data(), d, f.dtype, worst);
        }
      }
      if (all_same) {  // end to end against the reference
        compare(out_cpu.data(), out_ref.data(), static_cast<int64_t>(out_cpu.size()), f.dtype, worst);
        for (int32_t h = 0; h < H; ++h) EXPECT_NEAR(trace.alpha[h], st.alpha[h], 1e-5);
        if (f.dtype != KvDtype::kI8) {
          EXPECT_EQ(res.kv_bytes, st.kv_bytes);
        }
      }
    });
  });
  std::printf("SparQ: %lld cases, %lld kv heads with an exact-selection requirement, %lld heads differing\n",
              static_cast<long long>(cases), static_cast<long long>(exact_required),
              static_cast<long long>(differing_heads));
  worst.print("sparq");
}

// SparQ with step 1 weighted by √ of the keys' spread (ref::sparq_key_spread): the CPU's I1 is the
// top r of Σ_h |q_h[c]|·√σ[c] computed here in double, and its selection and output follow the
// reference run with the same σ (≥ 98% of I2 shared; end to end where the selections agree).
TEST(SparseCpu, SparqWithKeySpreadMatchesReference) {
  Worst worst;
  int64_t heads = 0, dims_differ_from_plain = 0;
  for_each_simd_level([&] {
    ThreadPool pool(2);
    for_each_case([&](const testing::PagedKvFixture& f, const PagedKvView& kv, const std::vector<float>& q, int32_t G,
                      int32_t S, std::mt19937&) {
      const int32_t d = f.d, H = G * kKvHeads;
      const std::vector<float> spread = ref::sparq_key_spread(kv, S);
      std::vector<float> out_cpu, out_ref, out_plain;
      const DecodeArgs a = decode_args(q, out_cpu, H, d, S);
      DecodeArgs ar = a, ap = a;
      out_ref.assign(out_cpu.size(), 0.0f);
      out_plain.assign(out_cpu.size(), 0.0f);
      ar.out = out_ref.data();
      ap.out = out_plain.data();
      ref::SparqParams p;
      p.k = std::max(2, S / 3);
      p.r = d / 8;
      cpu::SparqTrace trace, plain;
      cpu::sparq_decode(pool, kv, a, p, &trace, spread.data());
      cpu::sparq_decode(pool, kv, ap, p, &plain);
      const std::vector<float> v_mean = cache_v_mean(kv, a.pos);
      const ref::SparqStats st = ref::sparq_attention(kv, ar, p, v_mean.empty() ? nullptr : v_mean.data(), spread.data());
      bool all_same = true;
      for (int32_t g = 0; g < kKvHeads; ++g) {
        std::vector<double> w(d, 0.0);
        for (int32_t j = 0; j < G; ++j)
          for (int32_t c = 0; c < d; ++c)
            w[c] += std::fabs(q[static_cast<size_t>(g * G + j) * d + c]) * std::sqrt(double(spread[g * d + c]));
        std::vector<int32_t> order(d);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int32_t x, int32_t y) { return w[x] > w[y]; });
        order.resize(st.r);
        EXPECT_EQ(trace.dims[g], order) << "kv head " << g;
        dims_differ_from_plain += trace.dims[g] != plain.dims[g];
        ++heads;
        std::vector<int32_t> common;
        std::set_intersection(trace.selected[g].begin(), trace.selected[g].end(), st.selected[g].begin(),
                              st.selected[g].end(), std::back_inserter(common));
        EXPECT_GE(static_cast<double>(common.size()), 0.98 * st.k);
        all_same &= trace.selected[g] == st.selected[g];
      }
      if (all_same) {
        compare(out_cpu.data(), out_ref.data(), static_cast<int64_t>(out_cpu.size()), f.dtype, worst);
        for (int32_t h = 0; h < H; ++h) EXPECT_NEAR(trace.alpha[h], st.alpha[h], 1e-5);
      }
    });
  });
  // Even the fixture's keys, of similar spread per component, move most heads' I1.
  EXPECT_GT(dims_differ_from_plain, 0);
  std::printf("SparQ with key spread: %lld kv heads, %lld with I1 other than the paper's\n", static_cast<long long>(heads),
              static_cast<long long>(dims_differ_from_plain));
  worst.print("sparq key spread");
}

// HiP sizes scaled to the test lengths: set A is dense up to S = 45 and halves ~6 times at 2001;
// set B makes S = 16 and 33 sparse too.
// Set C is A with one mask per kv head.
const ref::HipParams kHipSets[] = {{32, 2, 4, 8}, {8, 2, 2, 4}, {32, 2, 4, 8, true}};

TEST(SparseCpu, HipMatchesReference) {
  Worst worst;
  int64_t masks = 0, masks_differing = 0;
  for_each_simd_level([&] {
    ThreadPool pool(2);
    for_each_case([&](const testing::PagedKvFixture& f, const PagedKvView& kv, const std::vector<float>& q, int32_t G,
                      int32_t S, std::mt19937&) {
      if (kv.k_t != nullptr) return;  // HiP reads no side data: one run per case
      const int32_t d = f.d, H = G * kKvHeads;
      const int64_t row = kv_row_bytes(f.dtype, d), elem = kv_dtype_bytes(f.dtype);
      for (const ref::HipParams& p : kHipSets) {
        // Estimate a few steps back, attend now: the cached-mask path.
        std::vector<float> out_cpu, out_ref;
        DecodeArgs a = decode_args(q, out_cpu, H, d, S);
        DecodeArgs est = a;
        est.pos = std::max(0, a.pos - 5);
        ref::HipMask mask_cpu, mask_ref;
        ref::HipBytes b_cpu, b_ref;
        cpu::hip_estimate_mask(pool, kv, est, p, &mask_cpu, &b_cpu);
        mask_ref = ref::hip_estimate_mask(kv, est, p, &b_ref);
        ++masks;
        ASSERT_EQ(mask_cpu.dense, mask_ref.dense);
        ASSERT_EQ(mask_cpu.pos, mask_ref.pos);
        bool same = true;
        for (int32_t h = 0; h < H; ++h) {
          const std::vector<int32_t>& bc = mask_cpu.block_starts[h];
          const std::vector<int32_t>& br = mask_ref.block_starts[h];
          ASSERT_EQ(bc.size(), br.size());
          std::vector<int32_t> common;
          std::set_intersection(bc.begin(), bc.end(), br.begin(), br.end(), std::back_inserter(common));
          EXPECT_GE(static_cast<double>(common.size()), 0.95 * br.size());
          same &= bc == br;
          if (p.per_kv_head && h % G != 0) {
            EXPECT_EQ(bc, mask_cpu.block_starts[h - h % G]);
          }
        }
        masks_differing += !same;
        if (same) {
          EXPECT_EQ(b_cpu.k_bytes, b_ref.k_bytes / (d * elem) * row);
        }
        // The attention over the CPU's mask vs the reference's over the same mask.
        ref::HipBytes s_cpu, s_ref;
        cpu::hip_sparse_decode(pool, kv, a, p, mask_cpu, &s_cpu);
        out_ref.assign(out_cpu.size(), 0.0f);
        DecodeArgs ar = a;
        ar.out = out_ref.data();
        ref::hip_sparse_attention(kv, ar, p, mask_cpu, &s_ref);
        compare(out_cpu.data(), out_ref.data(), static_cast<int64_t>(out_cpu.size()), f.dtype, worst);
        EXPECT_EQ(s_cpu.k_bytes, s_ref.k_bytes / (d * elem) * row);
        EXPECT_EQ(s_cpu.v_bytes, s_ref.v_bytes / (d * elem) * row);
      }
    });
  });
  std::printf("HiP: %lld masks estimated, %lld differ from the reference's (near-ties)\n",
              static_cast<long long>(masks), static_cast<long long>(masks_differing));
  worst.print("hip");
}

TEST(SparseCpu, SwaMatchesReference) {
  Worst worst;
  for_each_simd_level([&] {
    ThreadPool pool(2);
    for_each_case([&](const testing::PagedKvFixture& f, const PagedKvView& kv, const std::vector<float>& q, int32_t G,
                      int32_t S, std::mt19937& rng) {
      // With the transposed K plane (and AVX-512) the local window is streamed through it.
      const int32_t d = f.d, H = G * kKvHeads;
      // Coarse mass: many exact ties, so the tie rule (lower position) is exercised.
      std::uniform_int_distribution<int> coarse(0, 20);
      std::vector<float> mass(S);
      for (float& m : mass) m = 0.05f * static_cast<float>(coarse(rng));
      for (float ratio : {0.3f, 0.5f}) {
        std::vector<float> out_cpu, out_ref, weights(S, 0.0f);
        const DecodeArgs a = decode_args(q, out_cpu, H, d, S);
        DecodeArgs ar = a;
        out_ref.assign(out_cpu.size(), 0.0f);
        ar.out = out_ref.data();
        std::vector<int32_t> kept;
        const cpu::SwaResult res = swa_scattered(pool, kv, a, ratio, mass.data(), weights, &kept);
        const ref::SwaStats st = ref::swa_attention(kv, ar, ref::SwaParams{ratio}, mass.data());
        EXPECT_EQ(kept, st.kept);
        EXPECT_EQ(res.k_local, st.k_local);
        EXPECT_EQ(res.k_global, st.k_global);
        EXPECT_EQ(res.kv_bytes, 2LL * static_cast<int64_t>(kept.size()) * kv_row_bytes(f.dtype, d) * kKvHeads);
        if (f.dtype != KvDtype::kI8) {
          EXPECT_EQ(res.kv_bytes, st.kv_bytes);
        }
        compare(out_cpu.data(), out_ref.data(), static_cast<int64_t>(out_cpu.size()), f.dtype, worst);
        // Weights: softmax over the kept positions, summed over all query heads.
        std::vector<double> expect(S, 0.0);
        std::vector<float> krow(d);
        for (int32_t h = 0; h < H; ++h) {
          std::vector<double> logit;
          for (int32_t t : st.kept) {
            ref::load_kv_row(kv, kv.k, t, h / G, krow.data());
            double dot = 0;
            for (int32_t c = 0; c < d; ++c) dot += static_cast<double>(q[static_cast<size_t>(h) * d + c]) * krow[c];
            logit.push_back(dot * a.scale);
          }
          const double m = *std::max_element(logit.begin(), logit.end());
          double sum = 0;
          for (double& x : logit) sum += (x = std::exp(x - m));
          for (size_t i = 0; i < st.kept.size(); ++i) expect[st.kept[i]] += logit[i] / sum;
        }
        for (int32_t t = 0; t < S; ++t) EXPECT_NEAR(weights[t], expect[t], 1e-5 * H) << "t=" << t;
      }
    });
  });
  worst.print("swa");
}

// The loosest setting of each policy is dense attention.
TEST(SparseCpu, LoosestSettingsEqualDense) {
  Worst worst;
  for_each_simd_level([&] {
    ThreadPool pool(2);
    for_each_case([&](const testing::PagedKvFixture& f, const PagedKvView& kv, const std::vector<float>& q, int32_t G,
                      int32_t S, std::mt19937&) {
      const int32_t d = f.d, H = G * kKvHeads;
      std::vector<float> out;
      const DecodeArgs a = decode_args(q, out, H, d, S);
      const std::vector<float> dense = dense_ref(kv, a);
      if (f.dtype != KvDtype::kI8 && kv.k_t == nullptr) {  // the dense CPU kernel itself
        std::vector<float> dense_cpu(out.size());
        cpu::paged_attention(pool, kv, AttentionArgs{a.q, dense_cpu.data(), 1, H, a.pos, 0, a.scale});
        compare(dense_cpu.data(), dense.data(), static_cast<int64_t>(out.size()), f.dtype, worst);
      }
      ref::SparqParams sp;
      sp.k = S + 3;
      cpu::SparqTrace trace;
      cpu::sparq_decode(pool, kv, a, sp, &trace);
      for (float alpha : trace.alpha) EXPECT_EQ(alpha, 1.0f);
      compare(out.data(), dense.data(), static_cast<int64_t>(out.size()), f.dtype, worst);
      std::vector<float> mass(S, 0.0f);
      std::fill(out.begin(), out.end(), 0.0f);
      const cpu::SwaResult sw = cpu::swa_decode(pool, kv, a, ref::SwaParams{1.0f}, mass.data(), nullptr);
      EXPECT_EQ(sw.k_local + sw.k_global, S);
      compare(out.data(), dense.data(), static_cast<int64_t>(out.size()), f.dtype, worst);
      if (kv.k_t != nullptr) return;  // HiP reads no side data
      ref::HipParams hp{S + 1, 2, 4, 8};
      ref::HipMask mask;
      cpu::hip_estimate_mask(pool, kv, a, hp, &mask, nullptr);
      EXPECT_TRUE(mask.dense);
      std::fill(out.begin(), out.end(), 0.0f);
      cpu::hip_sparse_decode(pool, kv, a, hp, mask, nullptr);
      compare(out.data(), dense.data(), static_cast<int64_t>(out.size()), f.dtype, worst);
    });
  });
  worst.print("dense");
}

// A tiered cache's view as the kernels see it (docs/tiered_kv.md): every block "in the host tier"
// (negative table entries), rows readable only through host_rows after a prefetch — or, with
// host_table entries set back to device blocks, a mixed table (prefetch skips those; read_k_rows
// and read_kt_rows serve host blocks only). This one maps
// each prefetched row back to its own place in the fixture's planes, holds at most `cap` rows per
// call, and fails the test when asked for more or when a row is read without a prefetch (its map
// entry stays -1: the read would leave the planes).
struct MirrorPrefetcher final : RowPrefetcher {
  MirrorPrefetcher(const testing::PagedKvFixture& f, int32_t cap) : cap_(cap), f_(f) {
    for (int32_t b : f.table) host_table.push_back(-b - 1);
    map.assign(static_cast<size_t>(f.k.size()) / kv_dtype_bytes(f.dtype) / f.d * f.n_kv_heads, -1);
  }
  void prefetch(int32_t g, const int32_t* pos, int32_t n, bool) override {
    ++calls;
    if (n > cap_) ADD_FAILURE() << "prefetch of " << n << " rows, capacity " << cap_;
    for (size_t k = g; k < map.size(); k += f_.n_kv_heads) map[k] = -1;  // head g's earlier rows: gone (worst case)
    for (int32_t i = 0; i < n; ++i) {
      if (host_table[pos[i] / f_.block_size] >= 0) continue;  // a device block (a mixed table): read in place
      const int32_t b = -host_table[pos[i] / f_.block_size] - 1, off = pos[i] % f_.block_size;
      map[(static_cast<size_t>(b) * f_.block_size + off) * f_.n_kv_heads + g] = (b * f_.n_kv_heads + g) * f_.block_size + off;
    }
  }
  int32_t capacity() const override { return cap_; }
  size_t read_kt_rows(int32_t slot, int32_t g, const int32_t* dims, int32_t r, void* dst) const override {
    const size_t row = static_cast<size_t>(f_.block_size) * kv_dtype_bytes(f_.dtype);
    const uint8_t* tile = f_.k_t.data() + (static_cast<size_t>(slot) * f_.n_kv_heads + g) * f_.d * row;
    for (int32_t i = 0; i < r; ++i) std::memcpy(static_cast<uint8_t*>(dst) + i * row, tile + dims[i] * row, row);
    return r * row;
  }
  size_t read_k_rows(int32_t g, const int32_t* pos, int32_t n, void* dst, KvInt8Row* params) const override {
    const size_t row = static_cast<size_t>(f_.d) * kv_dtype_bytes(f_.dtype);
    for (int32_t i = 0; i < n; ++i) {
      const int32_t b = -host_table[pos[i] / f_.block_size] - 1, off = pos[i] % f_.block_size;
      const size_t r = (static_cast<size_t>(b) * f_.n_kv_heads + g) * f_.block_size + off;
      std::memcpy(static_cast<uint8_t*>(dst) + i * row, f_.k.data() + r * row, row);
      if (f_.dtype == KvDtype::kI8) params[i] = f_.k_rows[r];
    }
    k_rows_read += n;
    return n * row;
  }
  void count_read(int64_t bytes) override { kt_bytes += bytes; }
  PagedKvView view(bool side_data = false) {
    PagedKvView kv = f_.view(side_data, side_data);
    kv.block_table = host_table.data();
    kv.host_rows = map.data();
    kv.prefetcher = this;
    return kv;
  }
  std::vector<int32_t> host_table, map;
  int64_t calls = 0, kt_bytes = 0;
  mutable std::atomic<int64_t> k_rows_read{0};

 private:
  int32_t cap_;
  const testing::PagedKvFixture& f_;
};

// HiP over a tiered view (f16 and INT8): the same mask and bitwise the same output as over the
// resident view, the estimation's keys read from the host tier in place (no prefetch: its first iteration alone
// touches 2 · mask_k = 1,024 keys per mask, more than the cache), with a mask per query head and
// per kv head; with a 200-row cache the attention runs in batches (a selection of ~600 rows per mask).
TEST(SparseCpu, HipOverHostRowsMatchesResident) {
  std::mt19937 rng(99);
  ThreadPool pool(2);
  const int32_t d = 64, G = 3, S = 6000, H = G * kKvHeads;
  struct Case {
    KvDtype dtype;
    bool per_kv_head;
    int32_t cap;
  };
  for (const auto& [dtype, per_kv_head, cap] : {Case{KvDtype::kF16, false, 600}, Case{KvDtype::kF16, true, 600},
                                                Case{KvDtype::kF16, true, 200}, Case{KvDtype::kI8, true, 600}}) {
    const testing::PagedKvFixture f = testing::make_paged_kv(d, kKvHeads, kBlock, dtype, S, 2, rng);
    const std::vector<float> q = random_q(H * d, rng);
    const ref::HipParams p{512, 2, 16, 64, per_kv_head};
    std::vector<float> out_resident, out_tiered;
    const DecodeArgs a = decode_args(q, out_resident, H, d, S);
    DecodeArgs at = decode_args(q, out_tiered, H, d, S);
    ref::HipMask mask_resident, mask_tiered;
    cpu::hip_estimate_mask(pool, f.view(false, false), a, p, &mask_resident, nullptr);
    cpu::hip_sparse_decode(pool, f.view(false, false), a, p, mask_resident, nullptr);
    MirrorPrefetcher fetch(f, cap);
    const PagedKvView tiered = fetch.view();
    cpu::hip_estimate_mask(pool, tiered, at, p, &mask_tiered, nullptr);
    const int64_t estimation_calls = fetch.calls;
    EXPECT_EQ(estimation_calls, 0) << "the estimation goes around the row cache";
    EXPECT_GT(fetch.k_rows_read.load(), 1024 * (per_kv_head ? kKvHeads : H));
    EXPECT_EQ(fetch.kt_bytes, fetch.k_rows_read.load() * d * static_cast<int64_t>(kv_dtype_bytes(dtype))) << "its bytes are counted";
    cpu::hip_sparse_decode(pool, tiered, at, p, mask_tiered, nullptr);
    EXPECT_EQ(mask_tiered.block_starts, mask_resident.block_starts) << kv_dtype_name(dtype) << " cap " << cap;
    EXPECT_EQ(out_tiered, out_resident) << kv_dtype_name(dtype) << " cap " << cap;
    const int64_t masks = per_kv_head ? kKvHeads : H;  // the attention: one call per mask, or batches
    if (cap == 600) EXPECT_EQ(fetch.calls - estimation_calls, masks);
    else EXPECT_GE(fetch.calls - estimation_calls, 3 * masks);
  }
}

// SparQ over a tiered view whose blocks are all in the host tier but the last (the one a step
// writes, which holds the running V sum): step 1 reads the r dimension rows of each host tile,
// step 5 its top-k rows through a 600-row cache; bitwise the resident output, for f32 and f16.
TEST(SparseCpu, SparqOverHostRowsMatchesResident) {
  std::mt19937 rng(5);
  ThreadPool pool(2);
  const int32_t d = 64, G = 3, S = 3001, H = G * kKvHeads;
  for (KvDtype dtype : {KvDtype::kF32, KvDtype::kF16}) {
    const testing::PagedKvFixture f = testing::make_paged_kv(d, kKvHeads, kBlock, dtype, S, 2, rng);
    const std::vector<float> q = random_q(H * d, rng);
    ref::SparqParams p;
    p.r = 8;
    p.k = 400;
    p.l = 64;
    std::vector<float> out_resident, out_tiered;
    const DecodeArgs a = decode_args(q, out_resident, H, d, S);
    const DecodeArgs at = decode_args(q, out_tiered, H, d, S);
    cpu::SparqTrace trace_resident, trace_tiered;
    const cpu::SparqResult resident = cpu::sparq_decode(pool, f.view(), a, p, &trace_resident);
    MirrorPrefetcher fetch(f, 600);
    fetch.host_table.back() = f.table.back();  // the last block is device-resident
    const cpu::SparqResult tiered = cpu::sparq_decode(pool, fetch.view(true), at, p, &trace_tiered);
    EXPECT_EQ(trace_tiered.selected, trace_resident.selected);
    EXPECT_EQ(out_tiered, out_resident);
    EXPECT_EQ(tiered.kv_bytes, resident.kv_bytes);
    const int64_t host_blocks = static_cast<int64_t>(f.table.size()) - 1;
    EXPECT_EQ(fetch.kt_bytes, host_blocks * kKvHeads * p.r * kBlock * static_cast<int64_t>(kv_dtype_bytes(dtype)));
    EXPECT_EQ(fetch.calls, kKvHeads);  // one prefetch of top-k rows per kv head
  }
}

// SWA's seed step keeps every position: over a tiered view whose cache holds 700 rows it attends
// in batches of key chunks (last batch first at odd positions); output and weights are bitwise the
// one-pass result.
TEST(SparseCpu, SwaOverHostRowsInBatchesMatchesOnePass) {
  std::mt19937 rng(7);
  ThreadPool pool(2);
  const int32_t d = 64, G = 3, S = 2001, H = G * kKvHeads;
  const testing::PagedKvFixture f = testing::make_paged_kv(d, kKvHeads, kBlock, KvDtype::kF16, S, 2, rng);
  const std::vector<float> q = random_q(H * d, rng);
  const std::vector<float> mass(S, 0.0f);
  for (int32_t n : {S, S - 1}) {  // position 2000 (batches in order), 1999 (reversed)
    for (float ratio : {1.0f, 0.5f}) {
      std::vector<float> out_one, out_batched, w_one(S, 0.0f), w_batched(S, 0.0f);
      const DecodeArgs a = decode_args(q, out_one, H, d, n);
      const DecodeArgs ab = decode_args(q, out_batched, H, d, n);
      swa_scattered(pool, f.view(false, false), a, ratio, mass.data(), w_one);
      MirrorPrefetcher fetch(f, 700);
      swa_scattered(pool, fetch.view(), ab, ratio, mass.data(), w_batched);
      EXPECT_GE(fetch.calls, 2 * kKvHeads) << "ratio " << ratio;
      EXPECT_EQ(out_batched, out_one) << "ratio " << ratio << " keys " << n;
      EXPECT_EQ(w_batched, w_one) << "ratio " << ratio << " keys " << n;
    }
  }
}

// SWA streams its local window through the transposed K plane when the window's blocks are in the
// device tier, over a tiered view too: with the older half of the blocks in the host tier the output
// and weights are bitwise the all-resident ones. With a block of the window in the host tier the
// window is gathered through the row cache instead: the same attention up to summation order.
TEST(SparseCpu, SwaWindowOverTieredViewMatchesResident) {
  // Every SIMD level with streamed runs (AVX2 and AVX-512: each has its own Kᵀ kernel).
  for_each_simd_level([&] {
    if (cpu::sparse::kernels().run_partial == nullptr) return;  // portable: runs are gathered
    std::mt19937 rng(9);
    ThreadPool pool(2);
    const int32_t d = 64, G = 3, S = 2001, H = G * kKvHeads, n_blocks = (S + kBlock - 1) / kBlock;
    for (KvDtype dtype : {KvDtype::kF16, KvDtype::kI8}) {
      const testing::PagedKvFixture f = testing::make_paged_kv(d, kKvHeads, kBlock, dtype, S, 2, rng);
      const std::vector<float> q = random_q(H * d, rng);
      std::vector<float> mass(S);
      std::uniform_real_distribution<float> uni(0.0f, 1.0f);
      for (float& m : mass) m = uni(rng);
      const float ratio = 0.25f;  // window [S − 250, S): blocks 109-125
      for (int32_t host_blocks : {n_blocks / 2, n_blocks - 2}) {
        SCOPED_TRACE(std::string(kv_dtype_name(dtype)) + ", " + std::to_string(host_blocks) + " blocks in the host tier");
        MirrorPrefetcher fetch(f, 700);
        for (int32_t b = host_blocks; b < n_blocks; ++b) fetch.host_table[b] = f.table[b];
        std::vector<float> out_res, out_tier, w_res(S, 0.0f), w_tier(S, 0.0f);
        const DecodeArgs a = decode_args(q, out_res, H, d, S);
        const DecodeArgs at = decode_args(q, out_tier, H, d, S);
        std::vector<int32_t> kept_res, kept_tier;
        swa_scattered(pool, f.view(true, true), a, ratio, mass.data(), w_res, &kept_res);
        swa_scattered(pool, fetch.view(true), at, ratio, mass.data(), w_tier, &kept_tier);
        EXPECT_EQ(kept_tier, kept_res);
        EXPECT_GE(fetch.calls, kKvHeads);  // the heavy hitters came through the cache
        if (host_blocks == n_blocks / 2) {
          EXPECT_EQ(out_tier, out_res);
          EXPECT_EQ(w_tier, w_res);
        } else {
          Worst worst;
          compare(out_tier.data(), out_res.data(), static_cast<int64_t>(out_res.size()), dtype, worst);
          for (int32_t t = 0; t < S; ++t) EXPECT_NEAR(w_tier[t], w_res[t], 1e-6 * H) << "t=" << t;
        }
      }
    }
  });
}

// sparse::attend with the gathered positions filled inside the pool call (`fill_positions`, as
// swa_decode chooses its heavy hitters while the window streams) equals filling them first, bit
// for bit, on pools of 1-4 threads (which thread takes the fill varies with timing: repeated).
TEST(SparseCpu, AttendWithDeferredPositionsEqualsFilledFirst) {
  // Every SIMD level with streamed runs (AVX2 and AVX-512: each has its own Kᵀ kernel).
  for_each_simd_level([&] {
    if (cpu::sparse::kernels().run_partial == nullptr) return;  // portable: runs are gathered
    std::mt19937 rng(17);
    const int32_t d = 64, G = 3, S = 2001, older = 1500, H = G * kKvHeads;
    for (KvDtype dtype : {KvDtype::kF16, KvDtype::kI8}) {
      const testing::PagedKvFixture f = testing::make_paged_kv(d, kKvHeads, kBlock, dtype, S, 2, rng);
      const PagedKvView kv = f.view(true, true);
      const std::vector<float> q = random_q(H * d, rng);
      std::vector<std::vector<int32_t>> chosen(kKvHeads);  // per kv head, ascending, below the run
      for (auto& c : chosen) {
        for (int32_t t = 0; t < older; ++t)
          if (rng() % 3 == 0) c.push_back(t);
      }
      auto run = [&](ThreadPool& pool, bool deferred, std::vector<float>& out, std::vector<float>& weights) {
        std::vector<std::vector<int32_t>> pos(kKvHeads);
        std::vector<cpu::sparse::AttendTask> tasks(kKvHeads);
        out.assign(static_cast<size_t>(H) * d, 0.0f);
        int32_t keys = 0;
        for (int32_t g = 0; g < kKvHeads; ++g) keys = std::max(keys, static_cast<int32_t>(chosen[g].size()) + S - older);
        weights.assign(static_cast<size_t>(H) * keys, 0.0f);
        for (int32_t g = 0; g < kKvHeads; ++g) {
          pos[g] = deferred ? std::vector<int32_t>(chosen[g].size(), -1) : chosen[g];
          cpu::sparse::AttendTask& t = tasks[g];
          t.g = g;
          t.R = G;
          t.q = &q[static_cast<size_t>(g) * G * d];
          t.out = &out[static_cast<size_t>(g) * G * d];
          t.pos = pos[g].data();
          t.n = static_cast<int32_t>(pos[g].size());
          t.run_begin = older;
          t.run_end = S;
          t.weights = &weights[static_cast<size_t>(g) * G * keys];
        }
        std::atomic<int> fills{0};
        const std::function<void()> fill = [&] {
          ++fills;
          for (int32_t g = 0; g < kKvHeads; ++g) std::copy(chosen[g].begin(), chosen[g].end(), pos[g].begin());
        };
        cpu::sparse::attend(pool, cpu::sparse::kernels(), kv, 0.125f, tasks, 0, nullptr, false,
                            deferred ? fill : std::function<void()>{});
        EXPECT_EQ(fills.load(), deferred ? 1 : 0);
      };
      for (int threads : {1, 2, 3, 4}) {
        SCOPED_TRACE(std::string(kv_dtype_name(dtype)) + ", " + std::to_string(threads) + " threads");
        ThreadPool pool(threads);
        std::vector<float> out_first, w_first;
        run(pool, false, out_first, w_first);
        for (int rep = 0; rep < 20; ++rep) {
          std::vector<float> out, w;
          run(pool, true, out, w);
          ASSERT_EQ(out, out_first);
          ASSERT_EQ(w, w_first);
        }
      }
    }
  });
}

// A fill_positions that throws (e.g. out of memory in the caller's selection) fails the attend call
// with its exception, on whichever thread it ran, and leaves the pool serving: no thread is left
// waiting for positions that never come.
TEST(SparseCpu, AttendRethrowsAFailedFill) {
  // Every SIMD level with streamed runs (AVX2 and AVX-512: each has its own Kᵀ kernel).
  for_each_simd_level([&] {
    if (cpu::sparse::kernels().run_partial == nullptr) return;  // portable: runs are gathered
    std::mt19937 rng(5);
    const int32_t d = 64, G = 3, S = 1200, older = 900;
    const testing::PagedKvFixture f = testing::make_paged_kv(d, 1, kBlock, KvDtype::kF16, S, 2, rng);
    const std::vector<float> q = random_q(G * d, rng);
    std::vector<float> out(G * d);
    std::vector<int32_t> pos(300, -1);
    cpu::sparse::AttendTask t;
    t.R = G;
    t.q = q.data();
    t.out = out.data();
    t.pos = pos.data();
    t.n = static_cast<int32_t>(pos.size());
    t.run_begin = older;
    t.run_end = S;
    for (int threads : {1, 2, 3}) {
      ThreadPool pool(threads);
      for (int rep = 0; rep < 10; ++rep)
        EXPECT_THROW(cpu::sparse::attend(pool, cpu::sparse::kernels(), f.view(true, true), 0.125f, {t}, 0, nullptr, false,
                                         [] { throw std::runtime_error("selection failed"); }),
                     std::runtime_error);
      cpu::sparse::attend(pool, cpu::sparse::kernels(), f.view(true, true), 0.125f, {t}, 0, nullptr, false,
                          [&] { std::iota(pos.begin(), pos.end(), 0); });
      for (float x : out) EXPECT_TRUE(std::isfinite(x));
      std::fill(pos.begin(), pos.end(), -1);
    }
  });
}

// kth_largest_key is the k-th entry of the keys sorted descending, for every k, at every SIMD level:
// keys at the ends of the range (0, UINT32_MAX), many duplicates, lengths off the vector width.
// On a Serial stand-in of a pool (every job on the calling thread, the work split as for the
// pool's size) every policy's output, bytes and selections are bitwise the real pool's: what lets
// CpuBackend::attend_decodes run one sequence's step per thread without changing any output.
TEST(SparseCpu, EveryPolicyOnASerialStandInEqualsThePoolBitwise) {
  std::mt19937 rng(77);
  for (int threads : {2, 3}) {
    ThreadPool pool(threads), serial(ThreadPool::Serial{}, threads);
    for (int32_t d : {64, 256})
      for (int32_t S : {33, 2001, 5000})
        for (KvDtype dtype : {KvDtype::kF16, KvDtype::kI8}) {
          const int32_t G = d == 64 ? 3 : 4, H = G * kKvHeads;
          SCOPED_TRACE(std::to_string(threads) + " threads d=" + std::to_string(d) + " S=" + std::to_string(S) + " " +
                       kv_dtype_name(dtype));
          const testing::PagedKvFixture f = testing::make_paged_kv(d, kKvHeads, kBlock, dtype, S, 2, rng);
          const PagedKvView kv = f.view(true, true);
          const std::vector<float> q = random_q(H * d, rng);
          std::vector<float> mass(S);
          std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
          for (float& m : mass) m = uniform(rng);
          // Every policy's output (then its bytes, selection, weights) on one pool, as floats.
          auto run = [&](ThreadPool& on) {
            std::vector<float> all, out;
            auto record = [&](int64_t x) { all.push_back(static_cast<float>(x)); };
            DecodeArgs a = decode_args(q, out, H, d, S);
            cpu::paged_attention(on, kv, AttentionArgs{a.q, a.out, 1, H, a.pos, 0, a.scale});
            all.insert(all.end(), out.begin(), out.end());
            a = decode_args(q, out, H, d, S);
            const cpu::SparqResult sq = cpu::sparq_decode(on, kv, a, ref::sparq_params_for_ratio(0.125, S, d));
            all.insert(all.end(), out.begin(), out.end());
            record(sq.kv_bytes);
            for (const ref::HipParams& p : {ref::HipParams{S / 11 + 1, 2, 4, 32, true}, ref::HipParams{64, 2, 4, 16}}) {
              a = decode_args(q, out, H, d, S);
              ref::HipMask mask;
              ref::HipBytes b;
              cpu::hip_estimate_mask(on, kv, a, p, &mask, &b);
              cpu::hip_sparse_decode(on, kv, a, p, mask, &b);
              all.insert(all.end(), out.begin(), out.end());
              record(b.total());
              for (const std::vector<int32_t>& starts : mask.block_starts)
                for (int32_t t : starts) record(t);
            }
            a = decode_args(q, out, H, d, S);
            std::vector<float> weights;
            std::vector<int32_t> kept;
            const cpu::SwaResult sw = swa_scattered(on, kv, a, 0.125f, mass.data(), weights, &kept);
            all.insert(all.end(), out.begin(), out.end());
            all.insert(all.end(), weights.begin(), weights.end());
            record(sw.kv_bytes);
            return all;
          };
          const std::vector<float> on_pool = run(pool), on_serial = run(serial);
          ASSERT_EQ(on_pool.size(), on_serial.size());
          EXPECT_EQ(std::memcmp(on_pool.data(), on_serial.data(), on_pool.size() * sizeof(float)), 0);
        }
  }
}

TEST(SparseCpu, KthLargestKeyMatchesSort) {
  std::mt19937 rng(11);
  for_each_simd_level([&] {
    for (int32_t m : {1, 2, 15, 16, 17, 100, 513}) {
      for (int shape = 0; shape < 3; ++shape) {
        std::vector<uint32_t> keys(m);
        for (uint32_t& x : keys) x = shape == 0 ? static_cast<uint32_t>(rng()) : shape == 1 ? rng() % 4 : 0xFFFFFFFFu - rng() % 3;
        if (m > 2) keys[0] = 0, keys[1] = 0xFFFFFFFFu;
        std::vector<uint32_t> sorted = keys;
        std::sort(sorted.begin(), sorted.end(), std::greater<uint32_t>());
        for (int32_t k = 1; k <= m; ++k)
          ASSERT_EQ(cpu::sparse::kernels().kth_largest_key(keys.data(), m, k), sorted[k - 1])
              << "m=" << m << " k=" << k << " shape=" << shape;
      }
    }
  });
}

// top_k is exactly the reference's ordering, ties included, and lists its indices ascending:
// small n (radix select), large n (sampled threshold) on continuous scores, scores with many ties
// (coarse), all equal, sorted ascending / descending (a strided sample then sees a biased
// picture), spikes of large values, and large values only where the strided sample looks (for
// n = 16k, 64k: its threshold is too high, fewer than k pass, the radix fallback answers). At
// every SIMD level.
// SparQ step 1 over a range of blocks takes its 16-key tiles two at a time where the ISA has a pair
// kernel, and one at a time over a single 16-key block: the same arithmetic per tile, so scores
// and group sums must be equal bit for bit either way, for every tile of a shuffled table
// (a pair's second tile, a short last tile, blocks of 2 and 4 tiles).
TEST(SparseCpu, SparqScoresOfARangeEqualBlockByBlock) {
  for_each_simd_level([&] {
    std::mt19937 rng(11);
    const cpu::sparse::Kernels& kern = cpu::sparse::kernels();
    for (int32_t bs : {16, 32, 64})
      for (KvDtype dtype : {KvDtype::kF32, KvDtype::kF16})
        for (int32_t G : {1, 3, 8})
          for (int32_t S : {16, 47, 80, 1000}) {
            SCOPED_TRACE("bs=" + std::to_string(bs) + " " + kv_dtype_name(dtype) + " G=" + std::to_string(G) +
                         " S=" + std::to_string(S));
            constexpr int32_t d = 64, r = 8;
            const testing::PagedKvFixture f = testing::make_paged_kv(d, kKvHeads, bs, dtype, S, 0, rng);
            const PagedKvView kv = f.view(true, true);
            const std::vector<int32_t> dims = {3, 9, 17, 22, 40, 41, 50, 63};
            const std::vector<float> qr = random_q(G * r, rng);
            const int32_t n_blocks = (S + bs - 1) / bs;
            std::vector<float> whole(static_cast<size_t>(G) * S, NAN), parts(whole.size(), NAN);
            std::vector<float> whole_sum(S, NAN), parts_sum(S, NAN);
            kern.sparq_scores(kv, 1, dims.data(), r, qr.data(), G, 0, n_blocks, S, whole.data(), S, whole_sum.data());
            for (int32_t b = 0; b < n_blocks; ++b)
              kern.sparq_scores(kv, 1, dims.data(), r, qr.data(), G, b, b + 1, S, parts.data(), S, parts_sum.data());
            ASSERT_EQ(0, std::memcmp(whole.data(), parts.data(), whole.size() * sizeof(float)));
            ASSERT_EQ(0, std::memcmp(whole_sum.data(), parts_sum.data(), whole_sum.size() * sizeof(float)));
            // And both are the scores: Σ_i qr[j][i]·K[t][dims[i]] (f32 sums in any order: 1e-5).
            std::vector<float> row(d);
            for (int32_t t = 0; t < S; ++t) {
              ref::load_kv_row(kv, kv.k, t, 1, row.data());
              float total = 0;
              for (int32_t j = 0; j < G; ++j) {
                double dot = 0;
                for (int32_t i = 0; i < r; ++i) dot += static_cast<double>(qr[j * r + i]) * row[dims[i]];
                ASSERT_NEAR(whole[static_cast<size_t>(j) * S + t], dot, 1e-5 * (1 + std::fabs(dot))) << "t=" << t;
                total += whole[static_cast<size_t>(j) * S + t];
              }
              ASSERT_NEAR(whole_sum[t], total, 1e-5 * (1 + std::fabs(total))) << "t=" << t;
            }
          }
  });
}

TEST(SparseCpu, TopKMatchesSortOrder) {
  std::mt19937 rng(7);
  for_each_simd_level([&] {
  for (int32_t n : {1, 5, 100, 2047, 5000, 16384, 65536}) {
    for (int shape = 0; shape < 7; ++shape) {
      std::vector<float> s(n);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      for (int32_t i = 0; i < n; ++i) {
        const float x = normal(rng);
        s[i] = shape == 0 ? x : shape == 1 ? std::round(x * 4) / 4 : shape == 2 ? 1.5f : shape == 3 ? static_cast<float>(i)
               : shape == 4 ? static_cast<float>(-i) : shape == 5 ? (i % 97 == 5 ? 100.0f + x : x)
               : (i % std::max(1, n / 512) == 0 ? 1.0f + x * 0.01f : -1.0f);
      }
      if (n > 3) s[1] = -0.0f, s[2] = 0.0f;
      for (int32_t k : {0, 1, n / 16, n / 3, n - 1, n}) {
        std::vector<int32_t> got(std::max(k, 0));
        cpu::sparse::top_k(s.data(), n, k, got.data());
        std::vector<int32_t> order(n);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int32_t x, int32_t y) { return s[x] > s[y]; });
        order.resize(std::max(k, 0));
        std::sort(order.begin(), order.end());
        ASSERT_EQ(got, order) << "n=" << n << " k=" << k << " shape=" << shape;
      }
    }
  }
  });
}

}  // namespace
}  // namespace fathom
