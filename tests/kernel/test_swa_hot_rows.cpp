// SWA's compacted heavy-hitter copy (kernels/cpu/swa_hot_rows.h) and swa_decode reading through it.
// The copy must hold exactly the kept positions' K and V rows, byte for byte, after any sequence of
// kept sets (growing, shrinking, overlapping, disjoint); what it copies in must be exactly the
// positions that entered. Through swa_decode, step after step, it must give the reference's
// selection, output and weights (ref::swa_attention; the heavy hitters summed in slot order, so the
// tolerance of test_sparse_cpu).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/sparse_attention.h"
#include "kernels/cpu/swa_hot_rows.h"
#include "kernels/ref/attention_state.h"
#include "kernels/ref/swa.h"
#include "tests/kernel/paged_kv_fixture.h"

namespace fathom {
namespace {

constexpr int32_t kBlock = 16, kKvHeads = 2;

// Byte offset of the row of position t, kv head g, in the fixture's planes.
int64_t source_offset(const PagedKvView& kv, int32_t t, int32_t g) {
  return (kv.tile_offset(t / kv.block_size, g) + static_cast<int64_t>(t % kv.block_size) * kv.head_dim) *
         static_cast<int64_t>(kv_dtype_bytes(kv.dtype));
}

// Every slot of `hot` holds its position's K and V rows, and the slots are exactly `kept`.
void expect_holds(const cpu::SwaHotRows& hot, const PagedKvView& kv, const std::vector<int32_t>& kept) {
  ASSERT_EQ(hot.size(), static_cast<int32_t>(kept.size()));
  std::vector<int32_t> held(hot.slot_positions(), hot.slot_positions() + hot.size());
  std::sort(held.begin(), held.end());
  std::vector<int32_t> want = kept;
  std::sort(want.begin(), want.end());
  ASSERT_EQ(held, want);
  const PagedKvView& hv = hot.view();
  const int64_t row_bytes = static_cast<int64_t>(kv_dtype_bytes(kv.dtype)) * kv.head_dim;
  for (int32_t s = 0; s < hot.size(); ++s)
    for (int32_t g = 0; g < kv.n_kv_heads; ++g) {
      const int32_t t = hot.slot_positions()[s];
      const int64_t dst = source_offset(hv, s, g), src = source_offset(kv, t, g);
      ASSERT_EQ(std::memcmp(static_cast<const uint8_t*>(hv.k) + dst, static_cast<const uint8_t*>(kv.k) + src, row_bytes), 0)
          << "K slot " << s << " position " << t << " head " << g;
      ASSERT_EQ(std::memcmp(static_cast<const uint8_t*>(hv.v) + dst, static_cast<const uint8_t*>(kv.v) + src, row_bytes), 0)
          << "V slot " << s << " position " << t << " head " << g;
    }
}

TEST(SwaHotRows, HoldsExactlyTheKeptRowsThroughAnySequenceOfSets) {
  std::mt19937 rng(7);
  for (KvDtype dtype : {KvDtype::kF32, KvDtype::kF16}) {
    SCOPED_TRACE(kv_dtype_name(dtype));
    const int32_t S = 700;
    const testing::PagedKvFixture f = testing::make_paged_kv(64, kKvHeads, kBlock, dtype, S, 2, rng);
    const PagedKvView kv = f.view();
    cpu::SwaHotRows hot;
    std::vector<int32_t> prev;
    // Sizes up, down, to one, back up; each set keeps part of the last one and draws the rest.
    for (int32_t n : {40, 41, 60, 200, 150, 150, 1, 90, 300, 10, 299}) {
      std::set<int32_t> next;
      std::bernoulli_distribution keep(0.7);
      for (int32_t t : prev)
        if (static_cast<int32_t>(next.size()) < n && keep(rng)) next.insert(t);
      std::uniform_int_distribution<int32_t> pos(0, S - 1);
      while (static_cast<int32_t>(next.size()) < n) next.insert(pos(rng));
      std::vector<int32_t> kept(next.begin(), next.end());
      std::shuffle(kept.begin(), kept.end(), rng);
      const std::set<int32_t> before(prev.begin(), prev.end());
      int32_t entering = 0;
      for (int32_t t : kept) entering += before.count(t) == 0 ? 1 : 0;
      SCOPED_TRACE("n=" + std::to_string(n));
      EXPECT_EQ(hot.update(kv, kept.data(), n, S), entering);
      expect_holds(hot, kv, kept);
      prev = kept;
    }
    // A shorter sequence (recomputed, say) starts afresh: every row copied again.
    const std::vector<int32_t> first = {4, 0, 3, 1, 2};
    EXPECT_EQ(hot.update(kv, first.data(), 5, /*S=*/10), 5);
    expect_holds(hot, kv, first);
    EXPECT_GT(hot.bytes(), 0);
    // A copy (a fork) holds the same rows in its own memory.
    const cpu::SwaHotRows fork = hot;
    EXPECT_NE(fork.view().k, hot.view().k);
    expect_holds(fork, kv, first);
  }
}

TEST(SwaHotRows, RefusesViewsItCannotStandFor) {
  std::mt19937 rng(8);
  const testing::PagedKvFixture f = testing::make_paged_kv(64, kKvHeads, kBlock, KvDtype::kI8, 64, 2, rng);
  EXPECT_FALSE(cpu::SwaHotRows::supports(f.view()));
  cpu::SwaHotRows hot;
  const int32_t kept[] = {1, 2};
  EXPECT_THROW(hot.update(f.view(), kept, 2, 64), std::invalid_argument);
}

// swa_decode with a copy, over several steps whose mass changes, against the reference each step.
TEST(SwaHotRows, SwaDecodeThroughTheCopyMatchesReference) {
  for (const char* level : {"avx2", "avx512"}) {
    if (!cpu::set_simd_level_for_testing(level) || std::string(cpu::simd_level()) != level) continue;
    SCOPED_TRACE(level);
    ThreadPool pool(2);
    std::mt19937 rng(9);
    for (KvDtype dtype : {KvDtype::kF32, KvDtype::kF16})
      for (int32_t d : {64, 128}) {
        SCOPED_TRACE(std::string(kv_dtype_name(dtype)) + " d=" + std::to_string(d));
        const int32_t S = 2001, G = 3, H = G * kKvHeads;
        const testing::PagedKvFixture f = testing::make_paged_kv(d, kKvHeads, kBlock, dtype, S, 2, rng);
        const PagedKvView kv = f.view();  // with the transposed K plane: the window is streamed
        std::normal_distribution<float> normal(0.0f, 1.0f);
        std::vector<float> q(static_cast<size_t>(H) * d), mass(S);
        for (float& x : q) x = normal(rng);
        std::uniform_real_distribution<float> u(0.0f, 1.0f);
        for (float& m : mass) m = u(rng);
        cpu::SwaHotRows hot;
        int32_t copied_total = 0;
        for (int step = 0; step < 6; ++step) {
          SCOPED_TRACE("step " + std::to_string(step));
          // A few positions' mass changes a step (as the decayed fold does), and the ratio once.
          for (int i = 0; i < 20; ++i) mass[std::uniform_int_distribution<int32_t>(0, S - 1)(rng)] = u(rng);
          const float ratio = step == 3 ? 0.4f : 0.25f;
          std::vector<float> out(q.size()), out_ref(q.size()), kept_weights;
          std::vector<int32_t> kept;
          const DecodeArgs a{q.data(), out.data(), H, S - 1, 1.0f / std::sqrt(static_cast<float>(d))};
          DecodeArgs ar = a;
          ar.out = out_ref.data();
          const cpu::SwaResult res = cpu::swa_decode(
              pool, kv, a, ref::SwaParams{ratio}, [&] { return mass.data(); }, &kept_weights, &kept, &hot);
          const ref::SwaStats st = ref::swa_attention(kv, ar, ref::SwaParams{ratio}, mass.data());
          ASSERT_GE(res.hot_rows_copied, 0);
          copied_total += res.hot_rows_copied;
          std::vector<int32_t> sorted = kept;
          std::sort(sorted.begin(), sorted.end());
          EXPECT_EQ(sorted, st.kept);
          EXPECT_EQ(hot.size(), st.k_global);
          for (size_t i = 0; i < out.size(); ++i)
            ASSERT_NEAR(out[i], out_ref[i], 5e-6 + 5e-6 * std::fabs(out_ref[i])) << "element " << i;
          // Weights in `kept` order: per kept position the softmax weight summed over heads.
          ASSERT_EQ(kept_weights.size(), kept.size());
          std::vector<double> expect(kept.size(), 0.0);
          std::vector<float> krow(d);
          for (int32_t h = 0; h < H; ++h) {
            std::vector<double> logit;
            for (int32_t t : kept) {
              ref::load_kv_row(kv, kv.k, t, h / G, krow.data());
              double dot = 0;
              for (int32_t c = 0; c < d; ++c) dot += static_cast<double>(q[static_cast<size_t>(h) * d + c]) * krow[c];
              logit.push_back(dot * a.scale);
            }
            const double m = *std::max_element(logit.begin(), logit.end());
            double sum = 0;
            for (double& x : logit) sum += (x = std::exp(x - m));
            for (size_t i = 0; i < kept.size(); ++i) expect[i] += logit[i] / sum;
          }
          for (size_t i = 0; i < kept.size(); ++i) ASSERT_NEAR(kept_weights[i], expect[i], 1e-5 * H) << "position " << kept[i];
          // The bytes: the kept rows, plus the rows the copy took in.
          EXPECT_EQ(res.kv_bytes, 2LL * (static_cast<int64_t>(kept.size()) + res.hot_rows_copied) *
                                      static_cast<int64_t>(kv_row_bytes(dtype, d)) * kKvHeads);
        }
        // The first step copies the whole set; later ones far fewer than a set a step.
        EXPECT_LT(copied_total, 3 * hot.size());
      }
  }
  if (!cpu::set_simd_level_for_testing("avx512")) cpu::set_simd_level_for_testing("avx2");
}

}  // namespace
}  // namespace fathom
