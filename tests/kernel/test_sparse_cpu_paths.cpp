// The CPU sparse decode policies' other paths, each against the plain path bit for bit (their
// numerics against kernels/ref are the op-test grid's, tests/kernel/test_backend_ops.cpp): tiered
// views whose rows are read through a hot-row cache (MirrorPrefetcher), a gathered position list filled
// inside the pool call, a fill that throws (the fault path), and a Serial stand-in of the pool. One
// comparison is not bitwise: SWA's window gathered through the hot-row cache instead of streamed (a
// block of it in the host tier) sums in another order, within the grid's CPU tolerance
// (|a − b| ≤ t + t·|b|, t = 5e-6 f32 / f16, 2e-5 INT8).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <stdexcept>
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
    const std::vector<float> q = testing::normal_vector(H * d, rng);
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
    EXPECT_EQ(estimation_calls, 0) << "the estimation goes around the hot-row cache";
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
    const std::vector<float> q = testing::normal_vector(H * d, rng);
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
  const std::vector<float> q = testing::normal_vector(H * d, rng);
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
// window is gathered through the hot-row cache instead: the same attention up to summation order.
TEST(SparseCpu, SwaWindowOverTieredViewMatchesResident) {
  // Every SIMD level with streamed runs (AVX2 and AVX-512: each has its own Kᵀ kernel).
  for_each_simd_level([&] {
    if (cpu::sparse::kernels().run_partial == nullptr) return;  // portable: runs are gathered
    std::mt19937 rng(9);
    ThreadPool pool(2);
    const int32_t d = 64, G = 3, S = 2001, H = G * kKvHeads, n_blocks = (S + kBlock - 1) / kBlock;
    for (KvDtype dtype : {KvDtype::kF16, KvDtype::kI8}) {
      const testing::PagedKvFixture f = testing::make_paged_kv(d, kKvHeads, kBlock, dtype, S, 2, rng);
      const std::vector<float> q = testing::normal_vector(H * d, rng);
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
      const std::vector<float> q = testing::normal_vector(H * d, rng);
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
    const std::vector<float> q = testing::normal_vector(G * d, rng);
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
          const std::vector<float> q = testing::normal_vector(H * d, rng);
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

}  // namespace
}  // namespace fathom
