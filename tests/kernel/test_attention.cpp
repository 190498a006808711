// CPU paged attention (every ISA variant) against the scalar reference, over a shape grid:
// head dim 64/128/256, GQA group 1/3/4/8, sequence lengths 1, below one block, exactly one
// block, odd, long; decode (1 query) and prefill chunks; sliding windows; f32, f16 and INT8 KV;
// 1 and 2 threads; with and without the transposed K plane (the AVX-512 kernel reads logits
// from K^T when it is there: attention_kt_avx512.cpp). Block tables are shuffled so logical order != physical order.
// Tolerances (max |cpu − ref| over outputs, |v| ~ 1): f32 and f16 5e-6 (both sides read the same
// stored values, only accumulation order differs); INT8 1e-5: same stored bytes, but the kernel
// forms scale·(q·x_q) + min·Σq in f32 where the reference dequantizes each element, and the two
// terms cancel (|scale·q·x_q| ~ 3× the logit), so the f32 rounding of the logit is a few times larger.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_partial.h"
#include "kernels/cpu/ops.h"
#include "kernels/ref/attention.h"

namespace fathom {
namespace {

struct Case {
  int32_t head_dim, group, seq_len, n_q, window;
  KvDtype dtype;
  int32_t block_size = 16;
};

struct Fixture {
  int32_t block_size = 16, n_kv_heads = 2;
  std::vector<int32_t> table;
  std::vector<uint8_t> k, v;  // storage of `dtype`
  std::vector<uint8_t> k_t;   // K transposed per tile, [block][kv head][head_dim][block_size]
  std::vector<KvInt8Row> k_rows, v_rows;  // INT8 only: one per stored row
  std::vector<float> q;

  // transposed_k: also hand the kernels K^T (the AVX-512 kernel then reads logits from it).
  PagedKvView view(const Case& c, bool transposed_k) const {
    PagedKvView kv{k.data(), v.data(), c.dtype, table.data(), block_size, n_kv_heads, c.head_dim};
    if (transposed_k) kv.k_t = k_t.data();
    if (c.dtype == KvDtype::kI8) {
      kv.k_rows = k_rows.data();
      kv.v_rows = v_rows.data();
    }
    return kv;
  }
};

Fixture make(const Case& c, std::mt19937& rng) {
  Fixture f;
  f.block_size = c.block_size;
  const int32_t n_blocks = (c.seq_len + f.block_size - 1) / f.block_size;
  const int32_t physical = n_blocks + 3;
  f.table.resize(n_blocks);
  std::vector<int32_t> perm(physical);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::copy(perm.begin(), perm.begin() + n_blocks, f.table.begin());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t elems = static_cast<int64_t>(physical) * f.n_kv_heads * f.block_size * c.head_dim;
  std::vector<float> kf(elems), vf(elems);
  for (float& x : kf) x = normal(rng);
  for (float& x : vf) x = normal(rng);
  const size_t bytes = kv_dtype_bytes(c.dtype);
  f.k.resize(elems * bytes);
  f.v.resize(elems * bytes);
  if (c.dtype == KvDtype::kI8) {
    const int64_t rows = elems / c.head_dim;
    f.k_rows.resize(rows);
    f.v_rows.resize(rows);
    for (int64_t r = 0; r < rows; ++r) {
      cpu::kv_store_int8_row(&kf[r * c.head_dim], c.head_dim, &f.k[r * c.head_dim], &f.k_rows[r]);
      cpu::kv_store_int8_row(&vf[r * c.head_dim], c.head_dim, &f.v[r * c.head_dim], &f.v_rows[r]);
    }
  } else {
    cpu::kv_store(kf.data(), f.k.data(), c.dtype, elems);
    cpu::kv_store(vf.data(), f.v.data(), c.dtype, elems);
  }
  f.k_t.resize(f.k.size());
  const int64_t tile = static_cast<int64_t>(f.block_size) * c.head_dim;
  for (int64_t t0 = 0; t0 < elems; t0 += tile)
    for (int32_t slot = 0; slot < f.block_size; ++slot)
      for (int32_t x = 0; x < c.head_dim; ++x)
        std::copy_n(&f.k[(t0 + static_cast<int64_t>(slot) * c.head_dim + x) * bytes], bytes,
                    &f.k_t[(t0 + static_cast<int64_t>(x) * f.block_size + slot) * bytes]);
  f.q.resize(static_cast<size_t>(c.n_q) * c.group * f.n_kv_heads * c.head_dim);
  for (float& x : f.q) x = normal(rng);
  return f;
}

float tolerance(KvDtype dtype) {
  // Outputs are convex combinations of V rows (|v| ~ 1): f32 accumulation-order error only.
  // f16 KV: both sides read the same f16 values, so the bound is the same as f32. INT8: see the
  // header comment.
  switch (dtype) {
    case KvDtype::kF32: return 5e-6f;
    case KvDtype::kF16: return 5e-6f;
    case KvDtype::kI8: return 1e-5f;
  }
  return 0.0f;
}

TEST(PagedAttention, MatchesReferenceOnGrid) {
  std::mt19937 rng(1234);
  std::vector<std::pair<const char*, cpu::PartialAttentionFn>> kernels = {
      {"portable", cpu::partial_attention_portable()},
      {"avx2", cpu::partial_attention_avx2()},
      {"avx512", cpu::partial_attention_avx512()}};
  ThreadPool pool1(1), pool2(2);
  int cases = 0;
  float worst[3] = {0, 0, 0};  // per dtype
  for (int32_t d : {64, 128, 256})
    for (int32_t g : {1, 3, 4, 8})
      for (int32_t s : {1, 7, 16, 33, 200, 1000})
        for (int32_t n_q : {1, 5, 19})
          for (int32_t window : {0, 24})
            for (KvDtype dtype : {KvDtype::kF32, KvDtype::kF16, KvDtype::kI8})
              for (bool transposed_k : {false, true}) {
              if (n_q > s || (s == 1000 && n_q > 1)) continue;  // long prefill: covered by the model tests
              const Case c{d, g, s, n_q, window, dtype};
              Fixture f = make(c, rng);
              const PagedKvView kv = f.view(c, transposed_k);
              const int32_t n_heads = g * f.n_kv_heads;
              std::vector<float> expect(f.q.size()), got(f.q.size());
              AttentionArgs args{f.q.data(), expect.data(), n_q, n_heads, s - n_q, window, 1.0f / std::sqrt(float(d))};
              ref::paged_attention(kv, args);
              for (auto& [name, kernel] : kernels) {
                if (!kernel) continue;
                for (ThreadPool* pool : {&pool1, &pool2}) {
                  std::fill(got.begin(), got.end(), NAN);
                  args.out = got.data();
                  cpu::paged_attention_with(kernel, *pool, kv, args);
                  float err = 0;
                  for (size_t i = 0; i < got.size(); ++i) err = std::max(err, std::fabs(got[i] - expect[i]));
                  worst[static_cast<int>(dtype)] = std::max(worst[static_cast<int>(dtype)], err);
                  ASSERT_LE(err, tolerance(dtype)) << name << " d=" << d << " G=" << g << " S=" << s << " n_q=" << n_q
                                                   << " window=" << window << " dtype=" << kv_dtype_name(dtype)
                                                   << " k_t=" << transposed_k
                                                   << " threads=" << pool->size();
                  ++cases;
                }
              }
            }
  std::printf("paged attention: %d kernel runs, worst |cpu - ref|: f32 %.3g, f16 %.3g, int8 %.3g\n", cases, worst[0],
              worst[1], worst[2]);
}

}  // namespace
}  // namespace fathom

namespace fathom {
namespace {

// Blocks of 32 and 64 tokens: the K^T kernels walk several 16-key sub-tiles (8-key vectors) per block.
TEST(PagedAttention, LargerBlocksMatchReference) {
  std::mt19937 rng(77);
  ThreadPool pool(2);
  for (const cpu::PartialAttentionFn kernel : {cpu::partial_attention_avx2(), cpu::partial_attention_avx512()}) {
    if (!kernel) continue;
    for (int32_t bs : {32, 64})
      for (int32_t d : {64, 80, 128})  // 80: the Kᵀ kernels' narrower V tail (not a multiple of 32)
        for (int32_t s : {1, 33, 200, 1000})
          for (int32_t n_q : {1, 5})
            for (KvDtype dtype : {KvDtype::kF16, KvDtype::kI8}) {
              if (n_q > s) continue;
              const Case c{d, 3, s, n_q, 0, dtype, bs};
              Fixture f = make(c, rng);
              const PagedKvView kv = f.view(c, true);
              const int32_t n_heads = 3 * f.n_kv_heads;
              std::vector<float> expect(f.q.size()), got(f.q.size(), NAN);
              AttentionArgs args{f.q.data(), expect.data(), n_q, n_heads, s - n_q, 0, 1.0f / std::sqrt(float(d))};
              ref::paged_attention(kv, args);
              args.out = got.data();
              cpu::paged_attention_with(kernel, pool, kv, args);
              float err = 0;
              for (size_t i = 0; i < got.size(); ++i) err = std::max(err, std::fabs(got[i] - expect[i]));
              ASSERT_LE(err, tolerance(dtype)) << "block=" << bs << " d=" << d << " S=" << s << " n_q=" << n_q;
            }
  }
}

// A row's output must not depend on how many other query tokens share the call, nor on the
// thread count (the engine's batch invariance and exact recompute-preemption rely on it).
TEST(PagedAttention, RowResultIsBitwiseIndependentOfBatchAndThreads) {
  std::mt19937 rng(99);
  ThreadPool pool1(1), pool2(2);
  // The kernel paged_attention uses here, and the AVX2 one (a CPU with AVX-512 uses that one).
  for (const cpu::PartialAttentionFn kernel : {cpu::best_partial_attention(), cpu::partial_attention_avx2()})
  for (KvDtype dtype : {KvDtype::kF16, KvDtype::kI8})
  for (bool transposed_k : {false, true})
  for (int32_t s : {40, 700, 1500}) {
    const Case c{64, 3, s, 19, 0, dtype};
    Fixture f = make(c, rng);
    const PagedKvView kv = f.view(c, transposed_k);
    const int32_t n_heads = c.group * f.n_kv_heads, row = n_heads * c.head_dim;
    std::vector<float> all(f.q.size());
    if (!kernel) continue;
    cpu::paged_attention_with(kernel, pool2, kv, AttentionArgs{f.q.data(), all.data(), c.n_q, n_heads, s - c.n_q, 0, 0.125f});
    for (int32_t i : {0, 7, 18}) {
      for (ThreadPool* pool : {&pool1, &pool2}) {
        std::vector<float> one(row);
        cpu::paged_attention_with(kernel, *pool, kv, AttentionArgs{f.q.data() + static_cast<int64_t>(i) * row, one.data(), 1,
                                                                   n_heads, s - c.n_q + i, 0, 0.125f});
        for (int32_t x = 0; x < row; ++x)
          ASSERT_EQ(one[x], all[static_cast<int64_t>(i) * row + x])
              << kv_dtype_name(dtype) << " k_t=" << transposed_k << " S=" << s << " token " << i << " elem " << x;
      }
    }
  }
}

}  // namespace
}  // namespace fathom

namespace fathom {
namespace {

// Soft-capped logits (Gemma 2: cap·tanh(logit / cap)) and attention sinks (gpt-oss: a per-head
// logit in the softmax's denominator) on every ISA variant and KV type, against the reference's
// tanh and sinks in double. Logits ~ N(0, 1) (scale 1/√d) and cap 1 put many of them on the flat
// part of tanh; sinks ~ N(1, 1) take a large share of the weight. Either one ignored would be far
// off (checked on the reference); the tolerance is the plain one plus a few ulps of the cap.
TEST(PagedAttention, SoftCapsAndSinksMatchReference) {
  std::mt19937 rng(4242);
  const std::pair<const char*, cpu::PartialAttentionFn> kernels[] = {{"portable", cpu::partial_attention_portable()},
                                                                     {"avx2", cpu::partial_attention_avx2()},
                                                                     {"avx512", cpu::partial_attention_avx512()}};
  ThreadPool pool(2);
  int runs = 0;
  float worst_effect[2] = {0, 0};  // the largest move of the output by the cap, by the sinks
  for (const bool sinks : {false, true})
    for (int32_t d : {64, 128})
      for (int32_t g : {1, 4})
        for (int32_t s : {7, 200})
          for (int32_t n_q : {1, 5})
            for (int32_t window : {0, 24})
              for (KvDtype dtype : {KvDtype::kF32, KvDtype::kF16, KvDtype::kI8})
                for (bool transposed_k : {false, true}) {
                  const Case c{d, g, s, n_q, window, dtype};
                  Fixture f = make(c, rng);
                  const PagedKvView kv = f.view(c, transposed_k);
                  const int32_t n_heads = g * f.n_kv_heads;
                  std::normal_distribution<float> sink(1.0f, 1.0f);
                  std::vector<float> sink_logits(n_heads);
                  for (float& x : sink_logits) x = sink(rng);
                  std::vector<float> expect(f.q.size()), plain_out(f.q.size()), got(f.q.size());
                  AttentionArgs args{f.q.data(), expect.data(), n_q, n_heads, s - n_q, window,
                                     1.0f / std::sqrt(float(d)), sinks ? 0.0f : 1.0f,
                                     sinks ? sink_logits.data() : nullptr};
                  ref::paged_attention(kv, args);
                  AttentionArgs plain = args;
                  plain.softcap = 0.0f;
                  plain.sinks = nullptr;
                  plain.out = plain_out.data();
                  ref::paged_attention(kv, plain);
                  float effect = 0;  // how far the cap or the sinks move this case's output
                  for (size_t i = 0; i < expect.size(); ++i) effect = std::max(effect, std::fabs(expect[i] - plain_out[i]));
                  worst_effect[sinks] = std::max(worst_effect[sinks], effect);
                  for (const auto& [name, kernel] : kernels) {
                    if (!kernel) continue;
                    std::fill(got.begin(), got.end(), NAN);
                    args.out = got.data();
                    cpu::paged_attention_with(kernel, pool, kv, args);
                    float err = 0;
                    for (size_t i = 0; i < got.size(); ++i) err = std::max(err, std::fabs(got[i] - expect[i]));
                    ASSERT_LE(err, tolerance(dtype) + 2e-6f)
                        << name << (sinks ? " sinks" : " cap") << " d=" << d << " G=" << g << " S=" << s
                        << " n_q=" << n_q << " window=" << window << " dtype=" << kv_dtype_name(dtype)
                        << " k_t=" << transposed_k;
                    ++runs;
                  }
                }
  std::printf("soft-capped / sink paged attention: %d kernel runs; the cap moves outputs up to %.3g, sinks %.3g\n",
              runs, worst_effect[0], worst_effect[1]);
  EXPECT_GT(worst_effect[0], 0.05f);  // thousands of times the tolerance: a kernel ignoring them fails
  EXPECT_GT(worst_effect[1], 0.05f);
}

}  // namespace
}  // namespace fathom
