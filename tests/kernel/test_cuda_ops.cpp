// The CUDA ops of kernels/cuda (all but attention and rms_norm, see test_cuda_kernels.cpp) run on
// the CPU through kernels/cuda/emu and compared with their references. The .cu files are
// compiled by the host compiler into fathom_cuda_emu: exactly the source nvcc builds.
// Tolerances, |kernel - ref| <= atol + rtol·|ref| (no pass-rate thresholds); worst errors printed:
//   glu, f32 (silu / gelu-tanh):     atol 1e-6, rtol 1e-6 (same f32 formula; expf/tanhf ulps)
//   rope, f32:                       atol 1e-6, rtol 1e-6 (identical cos/sin; contraction only)
//   embedding, every type:           exact (same decode, products rounded as in the ref)
//   kv_append f32/f16/bf16 rows:     exact vs the f32 input rounded to the storage type;
//             int8 rows + (scale,min): exact vs cpu::kv_store_int8_row; v_sum: exact vs
//             one-by-one f32 appends; k_t: exact copy of the K rows
//   quant_gemv (Q8_0, IQ4_NL, MXFP4, Q2_K, Q3_K, Q4_K, Q6_K, IQ4_XS), x f32: |err| <= 2.5e-7·Σ|w·x| + 1e-6 vs double over the
//             ref-dequantized W (f32 products and per-lane sums, then a 32-lane tree sum)
//   gemm f16 / bf16 (emulated tiled path): |err| <= 1e-6·Σ|a·b| + 1e-6 vs double over the
//             same rounded inputs (f32 accumulate, k in order)
//   sampling: the token equals the reference's exactly (both work in the same 32.32 fixed-point
//             weights, so there is no rounding to tolerate)
#include "kernels/cuda/activation.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/kv_append.h"
#include "kernels/cuda/quant_gemv.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/sampling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/quant_blocks.h"
#include "kernels/ggml_type.h"
#include "kernels/paged_kv.h"
#include "kernels/ref/dequant.h"
#include "tests/kernel/random_rows.h"

#include "tests/kernel/cuda_device_buffer.h"

namespace fathom {
namespace {

using testing::DeviceBuffer;

struct WorstError {
  double abs = 0, excess = -1e30;  // excess: |err| - bound, > 0 is a failure
  int64_t index = -1;
  void add(double got, double want, double atol, double rtol, int64_t i) {
    const double err = std::fabs(got - want), e = err - (atol + rtol * std::fabs(want));
    abs = std::max(abs, err);
    if (e > excess || !std::isfinite(got)) {
      excess = std::isfinite(got) ? e : 1e30;
      index = i;
    }
  }
};

// ---- glu ------------------------------------------------------------------------------------
TEST(CudaOps, GluMatchesCpu) {
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (const cuda::GluKind kind : {cuda::GluKind::kSwiGlu, cuda::GluKind::kGeGluTanh, cuda::GluKind::kSwiGluOai}) {
    for (const int64_t n : {1, 3, 7, 83, 769, 5125, 100003}) {
      for (const int64_t offset : {0, 1}) {  // offset 1: unaligned pointers, scalar path
        std::vector<float> gate(n + 1), up(n + 1);
        for (float& v : gate) v = normal(rng);
        for (float& v : up) v = normal(rng);
        std::vector<float> want(gate.begin() + offset, gate.begin() + offset + n);
        if (kind == cuda::GluKind::kSwiGlu)
          cpu::silu_mul(want.data(), up.data() + offset, n);
        else if (kind == cuda::GluKind::kGeGluTanh)
          cpu::gelu_tanh_mul(want.data(), up.data() + offset, n);
        else
          cpu::swiglu_oai_mul(want.data(), up.data() + offset, n);
        DeviceBuffer<float> dg(gate), du(up), dout(n + 1);
        ASSERT_EQ(cuda::glu(kind, dg.ptr + offset, du.ptr + offset, dout.ptr + offset, n, nullptr), cudaSuccess);
        const std::vector<float> got = dout.download();
        WorstError worst;
        // GeGLU: 1 + tanh(y) near -1 loses ~1.2e-7 |0.5 g| absolute to f32 cancellation in
        // the device formula (the CPU's AVX-512 path avoids it), hence the |g u| term; SwiGLU
        // has no such term.
        const double cancel = kind == cuda::GluKind::kGeGluTanh ? 1.2e-7 : 0.0;
        for (int64_t i = 0; i < n; ++i)
          worst.add(got[offset + i], want[i],
                    1e-6 + cancel * std::fabs(static_cast<double>(gate[offset + i]) * up[offset + i]), 1e-6, i);
        std::printf("glu %s n=%ld offset=%ld: worst |err| %.3g\n",
                    kind == cuda::GluKind::kSwiGlu ? "swiglu" : kind == cuda::GluKind::kGeGluTanh ? "geglu" : "swiglu-oai",
                    static_cast<long>(n),
                    static_cast<long>(offset), worst.abs);
        EXPECT_LE(worst.excess, 0.0) << "n=" << n << " at " << worst.index;
      }
    }
  }
  // In place (out == gate).
  std::vector<float> gate(1000), up(1000);
  for (float& v : gate) v = normal(rng);
  for (float& v : up) v = normal(rng);
  std::vector<float> want = gate;
  cpu::silu_mul(want.data(), up.data(), 1000);
  DeviceBuffer<float> dg(gate), du(up);
  ASSERT_EQ(cuda::glu(cuda::GluKind::kSwiGlu, dg.ptr, du.ptr, dg.ptr, 1000, nullptr), cudaSuccess);
  const std::vector<float> got = dg.download();
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-6 + 1e-6 * std::fabs(want[i]));
}

// ---- rope -----------------------------------------------------------------------------------
TEST(CudaOps, RopeMatchesCpu) {
  std::mt19937 rng(2);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  struct Case {
    int32_t n_tokens, n_heads, head_dim, rope_dim, extra_stride;
  };
  const int32_t cache_rows = 5000;
  for (const bool neox : {false, true}) {
    for (const Case c : {Case{1, 1, 2, 2, 0}, Case{3, 5, 64, 64, 0}, Case{7, 3, 128, 32, 0}, Case{5, 4, 80, 80, 17},
                         Case{9, 2, 256, 128, 3}, Case{2, 7, 96, 94, 0}}) {
      const int32_t half = c.rope_dim / 2;
      std::vector<int32_t> all(cache_rows);
      std::iota(all.begin(), all.end(), 0);
      std::vector<float> cos_cache(static_cast<size_t>(cache_rows) * half), sin_cache(cos_cache.size());
      cpu::rope_table(all.data(), cache_rows, c.rope_dim, 10000.0f, 1.0f, cos_cache.data(), sin_cache.data());
      std::vector<int32_t> pos(c.n_tokens);
      std::uniform_int_distribution<int32_t> pick(0, cache_rows - 1);
      for (int32_t& p : pos) p = pick(rng);
      const int64_t stride = static_cast<int64_t>(c.n_heads) * c.head_dim + c.extra_stride;
      std::vector<float> x(static_cast<size_t>(c.n_tokens) * stride);
      for (float& v : x) v = normal(rng);
      // Reference: the token's heads copied out, rotated by cpu::rope_apply with its own table.
      std::vector<float> want = x;
      std::vector<float> ct(half), st(half), heads(static_cast<size_t>(c.n_heads) * c.head_dim);
      for (int32_t t = 0; t < c.n_tokens; ++t) {
        cpu::rope_table(&pos[t], 1, c.rope_dim, 10000.0f, 1.0f, ct.data(), st.data());
        std::copy_n(&x[t * stride], heads.size(), heads.begin());
        cpu::rope_apply(heads.data(), 1, c.n_heads, c.head_dim, c.rope_dim, neox, ct.data(), st.data());
        std::copy(heads.begin(), heads.end(), &want[t * stride]);
      }
      DeviceBuffer<float> dx(x), dc(cos_cache), ds(sin_cache);
      DeviceBuffer<int32_t> dp(pos);
      ASSERT_EQ(cuda::rope(dx.ptr, dp.ptr, c.n_tokens, stride, c.n_heads, c.head_dim, c.rope_dim, neox, dc.ptr,
                           ds.ptr, nullptr),
                cudaSuccess);
      const std::vector<float> got = dx.download();
      WorstError worst;
      for (size_t i = 0; i < got.size(); ++i) worst.add(got[i], want[i], 1e-6, 1e-6, static_cast<int64_t>(i));
      std::printf("rope %s tokens=%d heads=%d head_dim=%d rope_dim=%d: worst |err| %.3g\n", neox ? "neox" : "norm",
                  c.n_tokens, c.n_heads, c.head_dim, c.rope_dim, worst.abs);
      EXPECT_LE(worst.excess, 0.0) << "head_dim=" << c.head_dim << " at " << worst.index;
    }
  }
  float dummy = 0;
  EXPECT_EQ(cuda::rope(&dummy, nullptr, 1, 8, 1, 8, 3, false, nullptr, nullptr, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::rope(&dummy, nullptr, 1, 8, 1, 8, 10, false, nullptr, nullptr, nullptr), cudaErrorInvalidValue);
}

// ---- quantized rows: tests/kernel/random_rows.h ----------------------------------------------
using test::random_rows;

// ---- embedding ------------------------------------------------------------------------------
TEST(CudaOps, EmbeddingMatchesDequantize) {
  std::mt19937 rng(3);
  for (const GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::IQ4_NL,
                              GgmlType::MXFP4, GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q6_K,
                              GgmlType::IQ4_XS}) {
    const int64_t block = ggml_info(type).block_size;
    for (const int64_t dim : {block, 3 * block, 9 * block + (block == 1 ? 7 : 0)}) {
      for (const float scale : {1.0f, std::sqrt(static_cast<float>(dim))}) {
        const int64_t n_rows = 37, row_bytes = static_cast<int64_t>(ggml_row_size(type, dim));
        const std::vector<uint8_t> table = random_rows(type, n_rows, dim, rng);
        ASSERT_EQ(static_cast<int64_t>(table.size()), n_rows * row_bytes);
        std::vector<int32_t> ids = {0, 36, 5, 5, 17, -1, 37, 2, 30, 11, 1};
        std::vector<float> want(ids.size() * dim, 0.0f), row(dim);
        for (size_t t = 0; t < ids.size(); ++t) {
          if (ids[t] < 0 || ids[t] >= n_rows) continue;
          ref::dequantize_row(type, table.data() + ids[t] * row_bytes, row.data(), dim);
          for (int64_t i = 0; i < dim; ++i) want[t * dim + i] = row[i] * scale;
        }
        DeviceBuffer<uint8_t> dt(table);
        DeviceBuffer<int32_t> di(ids);
        DeviceBuffer<float> dout(want.size());
        ASSERT_EQ(cuda::embedding_lookup(dt.ptr, type, n_rows, dim, di.ptr, static_cast<int64_t>(ids.size()), scale,
                                         dout.ptr, nullptr),
                  cudaSuccess);
        const std::vector<float> got = dout.download();
        WorstError worst;
        for (size_t i = 0; i < got.size(); ++i) worst.add(got[i], want[i], 0.0, 0.0, static_cast<int64_t>(i));
        std::printf("embedding %s dim=%ld scale=%g: worst |err| %.3g\n", ggml_type_name(type), static_cast<long>(dim),
                    scale, worst.abs);
        EXPECT_LE(worst.excess, 0.0) << ggml_type_name(type) << " dim=" << dim << " at " << worst.index;
      }
    }
  }
  EXPECT_EQ(cuda::embedding_lookup(nullptr, GgmlType::Q4_0, 1, 32, nullptr, 1, 1.0f, nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::embedding_lookup(nullptr, GgmlType::Q8_0, 1, 48, nullptr, 1, 1.0f, nullptr, nullptr),
            cudaErrorInvalidValue);
}

// ---- kv_append ------------------------------------------------------------------------------
// Host mirror of one cache layer, appended one token at a time the way CpuKvStorage::append does.
struct HostCache {
  cuda::KvStoreType dtype;
  int32_t blocks, n_kv_heads, d, bs;
  size_t elem;
  std::vector<uint8_t> k, v, k_t;
  std::vector<KvInt8Row> k_rows, v_rows;
  std::vector<float> v_sum, k_moments;

  HostCache(cuda::KvStoreType t, int32_t nb, int32_t h, int32_t dim, int32_t block_size, std::mt19937& rng)
      : dtype(t), blocks(nb), n_kv_heads(h), d(dim), bs(block_size) {
    elem = t == cuda::KvStoreType::kF32 ? 4 : t == cuda::KvStoreType::kI8 ? 1 : 2;
    const size_t n = static_cast<size_t>(nb) * h * bs * d;
    std::uniform_int_distribution<int> byte(0, 255);
    k.resize(n * elem);
    v.resize(n * elem);
    k_t.resize(n * elem);
    for (auto* buf : {&k, &v, &k_t})
      for (uint8_t& b : *buf) b = static_cast<uint8_t>(byte(rng));  // garbage outside appended rows
    const size_t rows = static_cast<size_t>(nb) * h * bs;
    k_rows.assign(t == cuda::KvStoreType::kI8 ? rows : 0, KvInt8Row{-7.0f, 3.0f});
    v_rows = k_rows;
    v_sum.assign(static_cast<size_t>(nb) * h * d, 12345.0f);
    k_moments.assign(static_cast<size_t>(nb) * h * 2 * d, -777.0f);
  }

  static uint16_t bf16_rne(float x) {  // independent of the emulator's conversion
    uint32_t b;
    std::memcpy(&b, &x, 4);
    return static_cast<uint16_t>((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
  }

  void store(const float* src, uint8_t* dst, KvInt8Row* row) const {
    switch (dtype) {
      case cuda::KvStoreType::kF32: cpu::kv_store(src, dst, KvDtype::kF32, d); return;
      case cuda::KvStoreType::kF16: cpu::kv_store(src, dst, KvDtype::kF16, d); return;
      case cuda::KvStoreType::kBF16:
        for (int32_t c = 0; c < d; ++c) {
          const uint16_t h = bf16_rne(src[c]);
          std::memcpy(dst + 2 * c, &h, 2);
        }
        return;
      case cuda::KvStoreType::kI8: cpu::kv_store_int8_row(src, d, dst, row); return;
    }
  }

  // k, v: [n_kv_heads][d] f32 of one token at `pos` of the sequence with block table `table`.
  void append(const int32_t* table, int32_t pos, const float* kr, const float* vr) {
    const int32_t slot = pos % bs, block = table[pos / bs];
    for (int32_t h = 0; h < n_kv_heads; ++h) {
      const size_t tile = static_cast<size_t>(block) * n_kv_heads + h, row = tile * bs + slot;
      KvInt8Row* kp = dtype == cuda::KvStoreType::kI8 ? &k_rows[row] : nullptr;
      KvInt8Row* vp = dtype == cuda::KvStoreType::kI8 ? &v_rows[row] : nullptr;
      store(kr + h * d, &k[row * d * elem], kp);
      store(vr + h * d, &v[row * d * elem], vp);
      for (int32_t c = 0; c < d; ++c)
        std::memcpy(&k_t[((tile * d + c) * bs + slot) * elem], &k[(row * d + c) * elem], elem);
      float* sum = &v_sum[tile * d];
      const float* prev = nullptr;
      if (slot > 0) prev = sum;
      else if (pos > 0) prev = &v_sum[(static_cast<size_t>(table[pos / bs - 1]) * n_kv_heads + h) * d];
      for (int32_t c = 0; c < d; ++c) sum[c] = (prev ? prev[c] : 0.0f) + vr[h * d + c];
      // K moments: the previous position's (this tile's or the previous block's), updated.
      float* moments = &k_moments[tile * 2 * d];
      const float* before = prev == nullptr ? nullptr : prev == sum ? moments
                                                        : &k_moments[(static_cast<size_t>(table[pos / bs - 1]) * n_kv_heads + h) * 2 * d];
      for (int32_t c = 0; c < d; ++c) {
        float mean = before ? before[c] : 0.0f, m2 = before ? before[d + c] : 0.0f;
        key_moments_update(kr[h * d + c], pos, mean, m2);
        moments[c] = mean;
        moments[d + c] = m2;
      }
    }
  }
};

template <typename T>
int64_t first_mismatch(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return static_cast<int64_t>(i);
  return -1;
}

TEST(CudaOps, KvAppendMatchesOneByOne) {
  std::mt19937 rng(4);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  struct Seq {
    int32_t prefix, n_new;  // positions [0, prefix) already cached; append [prefix, prefix + n_new)
  };
  struct Case {
    int32_t d, n_kv_heads, bs;
    std::vector<Seq> seqs;
  };
  const std::vector<Case> cases = {
      {64, 2, 16, {{0, 1}}},
      {7, 3, 16, {{5, 37}, {16, 1}, {0, 5}, {31, 2}}},
      {128, 2, 32, {{40, 90}, {0, 33}}},
      {257, 1, 8, {{3, 21}, {8, 8}}},
      {80, 4, 16, {{15, 1}, {47, 1}, {1, 1}}},  // a decode step of three sequences
  };
  for (const cuda::KvStoreType t :
       {cuda::KvStoreType::kF32, cuda::KvStoreType::kF16, cuda::KvStoreType::kBF16, cuda::KvStoreType::kI8}) {
    for (const Case& c : cases) {
      const int32_t n_seqs = static_cast<int32_t>(c.seqs.size());
      int32_t max_blocks = 0, used = 0;
      for (const Seq& s : c.seqs) {
        const int32_t nb = (s.prefix + s.n_new + c.bs - 1) / c.bs;
        max_blocks = std::max(max_blocks, nb);
        used += nb;
      }
      const int32_t physical = used + 3, stride = max_blocks + 1;
      std::vector<int32_t> perm(physical);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      std::vector<int32_t> tables(static_cast<size_t>(n_seqs) * stride, -1);
      for (int32_t s = 0, next = 0; s < n_seqs; ++s)
        for (int32_t b = 0; b < (c.seqs[s].prefix + c.seqs[s].n_new + c.bs - 1) / c.bs; ++b)
          tables[s * stride + b] = perm[next++];
      HostCache host(t, physical, c.n_kv_heads, c.d, c.bs, rng);
      const int32_t row = c.n_kv_heads * c.d;
      std::vector<float> kr(row), vr(row);
      for (int32_t s = 0; s < n_seqs; ++s) {  // the cached prefixes, one by one
        for (int32_t p = 0; p < c.seqs[s].prefix; ++p) {
          for (float& x : kr) x = normal(rng);
          for (float& x : vr) x = normal(rng);
          host.append(&tables[s * stride], p, kr.data(), vr.data());
        }
      }
      // The batch: tokens of sequence s contiguous; K and V in a fused buffer (token stride 2·row + 5).
      const int64_t token_stride = 2 * row + 5;
      std::vector<int32_t> positions, starts = {0};
      for (const Seq& s : c.seqs) {
        for (int32_t j = 0; j < s.n_new; ++j) positions.push_back(s.prefix + j);
        starts.push_back(static_cast<int32_t>(positions.size()));
      }
      const int32_t n_tokens = static_cast<int32_t>(positions.size());
      std::vector<float> kv(static_cast<size_t>(n_tokens) * token_stride);
      for (float& x : kv) x = normal(rng) * 2.0f;
      if (t == cuda::KvStoreType::kI8 && n_tokens > 1)  // a constant V row: scale 0
        std::fill_n(&kv[token_stride + row], c.d, 0.25f);

      DeviceBuffer<uint8_t> dk(host.k), dv(host.v), dkt(host.k_t);
      DeviceBuffer<KvInt8Row> dkr(host.k_rows), dvr(host.v_rows);
      DeviceBuffer<float> dsum(host.v_sum), dmoments(host.k_moments), dkv(kv);
      DeviceBuffer<int32_t> dpos(positions), dstart(starts), dtab(tables);
      cuda::KvCacheLayer layer;
      layer.k = dk.ptr;
      layer.v = dv.ptr;
      layer.k_t = dkt.ptr;
      layer.k_rows = t == cuda::KvStoreType::kI8 ? dkr.ptr : nullptr;
      layer.v_rows = t == cuda::KvStoreType::kI8 ? dvr.ptr : nullptr;
      layer.v_sum = dsum.ptr;
      layer.k_moments = dmoments.ptr;
      layer.dtype = t;
      layer.block_size = c.bs;
      layer.n_kv_heads = c.n_kv_heads;
      layer.head_dim = c.d;
      cuda::KvAppendBatch batch;
      batch.k = dkv.ptr;
      batch.v = dkv.ptr + row;
      batch.k_token_stride = batch.v_token_stride = token_stride;
      batch.positions = dpos.ptr;
      batch.seq_token_start = dstart.ptr;
      batch.block_tables = dtab.ptr;
      batch.table_stride = stride;
      batch.n_tokens = n_tokens;
      batch.n_seqs = n_seqs;
      // The running planes after each token of every other sequence (a verify step's journal).
      std::vector<int32_t> running_row(n_seqs, -1);
      int32_t journaled = 0;
      for (int32_t s = 0; s < n_seqs; ++s)
        if (s % 2 == 1 || n_seqs == 1) {
          running_row[s] = journaled;
          journaled += c.seqs[s].n_new;
        }
      const size_t per_row = static_cast<size_t>(c.n_kv_heads) * 3 * c.d;
      DeviceBuffer<float> djournal(std::vector<float>(journaled * per_row, -1.0f));
      DeviceBuffer<int32_t> drunning_row(running_row);
      batch.running = djournal.ptr;
      batch.running_row = drunning_row.ptr;
      ASSERT_EQ(cuda::kv_append(layer, batch, nullptr), cudaSuccess);

      std::vector<float> journal(journaled * per_row);
      std::vector<int32_t> journal_block(journaled);
      for (int32_t s = 0; s < n_seqs; ++s)
        for (int32_t i = starts[s]; i < starts[s + 1]; ++i) {
          host.append(&tables[s * stride], positions[i], &kv[i * token_stride], &kv[i * token_stride + row]);
          if (running_row[s] < 0) continue;
          const int32_t j = running_row[s] + i - starts[s], block = tables[s * stride + positions[i] / c.bs];
          journal_block[j] = block;
          for (int32_t h = 0; h < c.n_kv_heads; ++h) {
            const size_t tile = static_cast<size_t>(block) * c.n_kv_heads + h;
            float* out = &journal[j * per_row + h * 3 * c.d];
            std::copy_n(&host.v_sum[tile * c.d], c.d, out);
            std::copy_n(&host.k_moments[tile * 2 * c.d], 2 * c.d, out + c.d);
          }
        }
      EXPECT_EQ(first_mismatch(djournal.download(), journal), -1) << "running planes after each journaled token";
      const char* name = t == cuda::KvStoreType::kF32 ? "f32" : t == cuda::KvStoreType::kF16 ? "f16"
                         : t == cuda::KvStoreType::kBF16 ? "bf16" : "int8";
      std::printf("kv_append %s d=%d heads=%d bs=%d seqs=%d tokens=%d\n", name, c.d, c.n_kv_heads, c.bs, n_seqs,
                  n_tokens);
      EXPECT_EQ(first_mismatch(dk.download(), host.k), -1) << name << " K, d=" << c.d;
      EXPECT_EQ(first_mismatch(dv.download(), host.v), -1) << name << " V, d=" << c.d;
      EXPECT_EQ(first_mismatch(dkt.download(), host.k_t), -1) << name << " K^T, d=" << c.d;
      EXPECT_EQ(first_mismatch(dsum.download(), host.v_sum), -1) << name << " v_sum, d=" << c.d;
      EXPECT_EQ(first_mismatch(dmoments.download(), host.k_moments), -1) << name << " k_moments, d=" << c.d;
      if (t == cuda::KvStoreType::kI8) {
        EXPECT_EQ(first_mismatch(dkr.download(), host.k_rows), -1) << "k_rows, d=" << c.d;
        EXPECT_EQ(first_mismatch(dvr.download(), host.v_rows), -1) << "v_rows, d=" << c.d;
      }
      // A rollback to the first journaled token: its block's planes as they were after it.
      if (journaled == 0) continue;
      ASSERT_EQ(cuda::kv_set_running(layer, journal_block[0], djournal.ptr, nullptr), cudaSuccess);
      std::vector<float> want_sum = host.v_sum, want_moments = host.k_moments;
      for (int32_t h = 0; h < c.n_kv_heads; ++h) {
        const size_t tile = static_cast<size_t>(journal_block[0]) * c.n_kv_heads + h;
        std::copy_n(&journal[h * 3 * c.d], c.d, &want_sum[tile * c.d]);
        std::copy_n(&journal[h * 3 * c.d + c.d], 2 * c.d, &want_moments[tile * 2 * c.d]);
      }
      EXPECT_EQ(first_mismatch(dsum.download(), want_sum), -1) << "v_sum after kv_set_running";
      EXPECT_EQ(first_mismatch(dmoments.download(), want_moments), -1) << "k_moments after kv_set_running";
      // kv_get_running copies out what kv_set_running wrote (sparse drafting keeps them so).
      DeviceBuffer<float> dgot(journal.size() / static_cast<size_t>(journaled));
      ASSERT_EQ(cuda::kv_get_running(layer, journal_block[0], dgot.ptr, nullptr), cudaSuccess);
      const std::vector<float> got = dgot.download();
      EXPECT_TRUE(std::equal(got.begin(), got.end(), journal.begin())) << "kv_get_running";
    }
  }
}

// ---- quant_gemv -----------------------------------------------------------------------------
TEST(CudaOps, QuantGemvMatchesDequantizedDot) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const double atol = 1e-6, rtol_sum = 2.5e-7;  // bound: atol + rtol_sum · Σ|w·x| (not |ref|)
  int32_t case_index = 0;
  for (const GgmlType type : {GgmlType::Q8_0, GgmlType::IQ4_NL, GgmlType::MXFP4, GgmlType::Q2_K, GgmlType::Q3_K,
                              GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::IQ4_XS}) {
    const int64_t block = ggml_info(type).block_size;
    for (const int64_t k : {block, 3 * block, 9 * block, (block == 32 ? 129 : 17) * block}) {
      for (const int64_t n_out : {1, 7, 33, 130}) {
        const int32_t n_x = 1 + case_index++ % 4;  // every n_x meets every type and k
        const int64_t row_bytes = static_cast<int64_t>(ggml_row_size(type, k));
        const std::vector<uint8_t> w = random_rows(type, n_out, k, rng);
        std::vector<float> x(static_cast<size_t>(n_x) * k);
        for (float& v : x) v = normal(rng);
        std::vector<double> want(static_cast<size_t>(n_x) * n_out), mag(want.size());
        std::vector<float> row(k);
        for (int64_t n = 0; n < n_out; ++n) {
          ref::dequantize_row(type, w.data() + n * row_bytes, row.data(), k);
          for (int32_t m = 0; m < n_x; ++m) {
            double sum = 0, abs_sum = 0;
            for (int64_t i = 0; i < k; ++i) {
              sum += static_cast<double>(row[i]) * x[m * k + i];
              abs_sum += std::fabs(static_cast<double>(row[i]) * x[m * k + i]);
            }
            want[m * n_out + n] = sum;
            mag[m * n_out + n] = abs_sum;
          }
        }
        DeviceBuffer<uint8_t> dw(w);
        DeviceBuffer<float> dx(x), dy(want.size());
        ASSERT_EQ(cuda::quant_gemv(type, dw.ptr, n_out, k, dx.ptr, n_x, dy.ptr, nullptr), cudaSuccess);
        const std::vector<float> got = dy.download();
        WorstError worst;
        double worst_rel = 0;
        for (size_t i = 0; i < got.size(); ++i) {
          worst.add(got[i], want[i], atol + rtol_sum * mag[i], 0.0, static_cast<int64_t>(i));
          worst_rel = std::max(worst_rel, std::fabs(got[i] - want[i]) / mag[i]);
        }
        std::printf("quant_gemv %s k=%ld n_out=%ld n_x=%d: worst |err| %.3g, |err|/Σ|wx| %.3g\n",
                    ggml_type_name(type), static_cast<long>(k), static_cast<long>(n_out), n_x, worst.abs, worst_rel);
        EXPECT_LE(worst.excess, 0.0) << ggml_type_name(type) << " k=" << k << " n_out=" << n_out << " at "
                                     << worst.index;
      }
    }
  }
  DeviceBuffer<float> dx(256);
  EXPECT_EQ(cuda::quant_gemv(GgmlType::Q4_K, dx.ptr, 1, 256, dx.ptr, 5, dx.ptr, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::quant_gemv(GgmlType::Q4_K, dx.ptr, 1, 96, dx.ptr, 1, dx.ptr, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::quant_gemv(GgmlType::Q4_0, dx.ptr, 1, 256, dx.ptr, 1, dx.ptr, nullptr), cudaErrorInvalidValue);
}

// ---- gemm -----------------------------------------------------------------------------------
// tiled: the tiled kernel (gemm_*_tiled) instead of the handle API (cuBLAS's host stand-in).
template <typename T>
void run_gemm_cases(bool bf16, bool tiled, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const double atol = 1e-6, rtol_sum = 1e-6;  // bound: atol + rtol_sum · Σ|a·b|
  auto round_in = [bf16](float v, T* out) {
    if (bf16) *out = {static_cast<uint16_t>(HostCache::bf16_rne(v))};
    else *out = {ref::fp32_to_fp16(v)};
    uint32_t bits = bf16 ? static_cast<uint32_t>(out->x) << 16 : 0;
    float r;
    if (bf16) std::memcpy(&r, &bits, 4);
    else r = ref::fp16_to_fp32(out->x);
    return r;
  };
  cuda::GemmHandle* handle = nullptr;
  ASSERT_EQ(cuda::gemm_create(&handle), cudaSuccess);
  struct Shape {
    int32_t m, n, k, pad;
  };
  for (const Shape s : {Shape{1, 1, 1, 0}, Shape{7, 13, 5, 0}, Shape{33, 65, 17, 3}, Shape{70, 19, 129, 0},
                        Shape{3, 300, 64, 1}, Shape{64, 64, 64, 0}, Shape{5, 7, 0, 0}}) {
    const int64_t lda = s.k + s.pad, ldb = s.k + 2 * s.pad, ldc = s.n + s.pad;
    std::vector<T> a(static_cast<size_t>(s.m) * lda), b(static_cast<size_t>(s.n) * ldb);
    std::vector<float> af(a.size()), bf(b.size());
    for (size_t i = 0; i < a.size(); ++i) af[i] = round_in(normal(rng), &a[i]);
    for (size_t i = 0; i < b.size(); ++i) bf[i] = round_in(normal(rng), &b[i]);
    std::vector<float> c0(static_cast<size_t>(s.m) * ldc, 99.0f);
    DeviceBuffer<T> da(a), db(b);
    DeviceBuffer<float> dc(c0);
    cudaError_t st;
    if constexpr (std::is_same_v<T, __half>)
      st = tiled ? cuda::gemm_f16_tiled(da.ptr, lda, db.ptr, ldb, dc.ptr, ldc, s.m, s.n, s.k, nullptr)
                 : cuda::gemm_f16(handle, da.ptr, lda, db.ptr, ldb, dc.ptr, ldc, s.m, s.n, s.k, nullptr);
    else
      st = tiled ? cuda::gemm_bf16_tiled(da.ptr, lda, db.ptr, ldb, dc.ptr, ldc, s.m, s.n, s.k, nullptr)
                 : cuda::gemm_bf16(handle, da.ptr, lda, db.ptr, ldb, dc.ptr, ldc, s.m, s.n, s.k, nullptr);
    ASSERT_EQ(st, cudaSuccess);
    const std::vector<float> got = dc.download();
    WorstError worst;
    for (int32_t i = 0; i < s.m; ++i) {
      for (int32_t j = 0; j < s.n; ++j) {
        double sum = 0, mag = 0;
        for (int32_t kk = 0; kk < s.k; ++kk) {
          const double p = static_cast<double>(af[i * lda + kk]) * bf[j * ldb + kk];
          sum += p;
          mag += std::fabs(p);
        }
        worst.add(got[i * ldc + j], sum, atol + rtol_sum * mag, 0.0, i * ldc + j);
      }
      for (int64_t j = s.n; j < ldc; ++j) ASSERT_EQ(got[i * ldc + j], 99.0f) << "wrote past n";
    }
    std::printf("gemm %s%s m=%d n=%d k=%d: worst |err| %.3g\n", bf16 ? "bf16" : "f16", tiled ? " tiled" : "", s.m, s.n,
                s.k, worst.abs);
    EXPECT_LE(worst.excess, 0.0) << "m=" << s.m << " n=" << s.n << " k=" << s.k << " at " << worst.index;
  }
  EXPECT_EQ(cuda::gemm_f16(handle, nullptr, 3, nullptr, 4, nullptr, 4, 1, 4, 4, nullptr), cudaErrorInvalidValue);
  cuda::gemm_destroy(handle);
}

TEST(CudaOps, GemmMatchesDouble) {
  std::mt19937 rng(6);
  for (const bool tiled : {false, true}) {
    run_gemm_cases<__half>(false, tiled, rng);
    run_gemm_cases<__nv_bfloat16>(true, tiled, rng);
  }
}

// ---- sampling -------------------------------------------------------------------------------
// The rule of cuda::sample_top_k_top_p (kernels/cuda/sampling.h) written plainly: a full sort
// of the row, prefixes, and a walk in id order.
uint32_t sample_key(float x) {
  if (std::isnan(x)) x = -INFINITY;
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

int32_t sample_reference(const float* x, int32_t vocab, const cuda::SampleParams& p) {
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return sample_key(x[a]) > sample_key(x[b]); });
  float m = x[order[0]];
  if (std::isnan(m)) m = -INFINITY;
  if (!(p.temperature >= 1e-5f) || p.top_k == 1 || !std::isfinite(m)) return order[0];
  const float inv_t = 1.0f / p.temperature;
  auto weight = [&](int32_t i) {
    const float v = std::isnan(x[i]) ? -INFINITY : x[i];
    return static_cast<uint64_t>(std::exp((v - m) * inv_t) * 4294967296.0f);
  };
  size_t keep = p.top_k > 0 && p.top_k < vocab ? static_cast<size_t>(p.top_k) : order.size();
  uint64_t total = 0;
  for (size_t j = 0; j < keep; ++j) total += weight(order[j]);
  if (p.top_p < 1.0f) {
    const double t = static_cast<double>(p.top_p) * (1.0 - 1e-6) * static_cast<double>(total);
    const uint64_t target = t < 1.0 ? 1 : static_cast<uint64_t>(t);
    uint64_t cum = 0;
    for (size_t j = 0; j < keep; ++j) {
      cum += weight(order[j]);
      if (cum >= target) {
        keep = j + 1;
        break;
      }
    }
    total = cum;
  }
  std::vector<int32_t> chosen(order.begin(), order.begin() + static_cast<ptrdiff_t>(keep));
  std::sort(chosen.begin(), chosen.end());
  uint64_t r = static_cast<uint64_t>(p.uniform * static_cast<double>(total));
  if (r >= total) r = total - 1;
  uint64_t cum = 0;
  for (int32_t id : chosen) {
    cum += weight(id);
    if (cum > r) return id;
  }
  return -1;
}

struct SampleRow {
  std::vector<float> logits;
  cuda::SampleParams params;
  const char* what;
};

// Returns the device's tokens.
std::vector<int32_t> check_sampling(const std::vector<SampleRow>& rows, int32_t vocab) {
  const int64_t stride = vocab + 3;
  std::vector<float> logits(rows.size() * stride, 1e30f);  // padding past vocab must be ignored
  std::vector<cuda::SampleParams> params;
  for (size_t r = 0; r < rows.size(); ++r) {
    std::copy(rows[r].logits.begin(), rows[r].logits.end(), &logits[r * stride]);
    params.push_back(rows[r].params);
  }
  DeviceBuffer<float> dl(logits);
  DeviceBuffer<cuda::SampleParams> dp(params);
  DeviceBuffer<int32_t> dout(rows.size());
  EXPECT_EQ(cuda::sample_top_k_top_p(dl.ptr, stride, vocab, static_cast<int32_t>(rows.size()), dp.ptr, dout.ptr,
                                     nullptr),
            cudaSuccess);
  const std::vector<int32_t> got = dout.download();
  for (size_t r = 0; r < rows.size(); ++r) {
    const cuda::SampleParams& p = rows[r].params;
    const int32_t want = sample_reference(rows[r].logits.data(), vocab, p);
    EXPECT_EQ(got[r], want) << rows[r].what << " V=" << vocab << " row " << r << " T=" << p.temperature
                            << " k=" << p.top_k << " p=" << p.top_p << " u=" << p.uniform;
  }
  return got;
}

TEST(CudaOps, SamplingMatchesReference) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::uniform_int_distribution<int> small(-3, 3);
  const float temps[] = {0.0f, 0.3f, 1.0f, 1.7f};
  const float top_ps[] = {1.0f, 0.95f, 0.5f, 0.01f};
  int32_t rows_checked = 0;
  for (const int32_t vocab : {1, 2, 7, 100, 1000, 5003}) {
    const int32_t top_ks[] = {0, 1, 2, 5, 50, vocab, vocab + 3};
    std::vector<SampleRow> rows;
    for (int kind = 0; kind < 4; ++kind) {
      for (int rep = 0; rep < 12; ++rep) {
        SampleRow row;
        row.logits.resize(vocab);
        switch (kind) {
          case 0: row.what = "normal"; for (float& v : row.logits) v = normal(rng) * 2.0f; break;
          case 1: row.what = "peaked"; for (float& v : row.logits) v = normal(rng) * 8.0f; break;
          case 2: row.what = "ties"; for (float& v : row.logits) v = static_cast<float>(small(rng)); break;
          default:
            row.what = "masked";
            for (float& v : row.logits) {
              const int c = small(rng);
              v = c == -3 ? -INFINITY : c == 3 ? NAN : normal(rng);
            }
            if (vocab == 1) row.logits[0] = 0.5f;
            break;
        }
        row.params.temperature = temps[(rep + kind) % 4];
        row.params.top_k = top_ks[rep % 7];
        row.params.top_p = top_ps[(rep / 2 + kind) % 4];
        row.params.uniform = rep == 0 ? 0.0 : rep == 1 ? 0.9999999999 : unit(rng);
        rows.push_back(row);
      }
    }
    // Edge rows: a uniform row (all ties), all -inf (argmax = 0), a +inf logit, -0 vs +0.
    SampleRow flat{std::vector<float>(vocab, 0.25f), {1.0f, 0, 0.5f, 0, 0.73}, "flat"};
    rows.push_back(flat);
    flat.params = {1.0f, 3, 1.0f, 0, 0.99};
    rows.push_back(flat);
    rows.push_back({std::vector<float>(vocab, -INFINITY), {1.0f, 0, 0.9f, 0, 0.5}, "all -inf"});
    SampleRow inf{std::vector<float>(vocab, 1.0f), {1.0f, 0, 1.0f, 0, 0.5}, "+inf"};
    inf.logits[vocab / 2] = INFINITY;
    rows.push_back(inf);
    SampleRow zeros{std::vector<float>(vocab, -5.0f), {1e-6f, 0, 1.0f, 0, 0.5}, "signed zeros"};
    zeros.logits[0] = -0.0f;
    zeros.logits[vocab - 1] = 0.0f;
    rows.push_back(zeros);
    check_sampling(rows, vocab);
    rows_checked += static_cast<int32_t>(rows.size());
  }
  // Gemma-size vocabulary: a few rows.
  const int32_t big = 262144;
  std::vector<SampleRow> rows;
  for (const cuda::SampleParams p : {cuda::SampleParams{0.0f, 0, 1.0f, 0, 0.3}, cuda::SampleParams{0.8f, 40, 0.9f, 0, 0.61},
                                     cuda::SampleParams{1.0f, 0, 0.95f, 0, 0.17}}) {
    SampleRow row{std::vector<float>(big), p, "V=262144"};
    for (float& v : row.logits) v = normal(rng) * 3.0f;
    rows.push_back(row);
  }
  check_sampling(rows, big);
  rows_checked += static_cast<int32_t>(rows.size());
  std::printf("sampling: %d rows, token == reference on every row\n", rows_checked);
  EXPECT_EQ(cuda::sample_top_k_top_p(nullptr, 3, 4, 1, nullptr, nullptr, nullptr), cudaErrorInvalidValue);
}

// Sampling is a draw: over many uniforms, tokens must come out in proportion to their weights
// (a coarse check that the threshold and draw are not merely self-consistent).
TEST(CudaOps, SamplingFrequenciesFollowTheNucleus) {
  const int32_t vocab = 6;
  const std::vector<float> logits = {std::log(0.4f), std::log(0.3f), std::log(0.2f), std::log(0.05f),
                                     std::log(0.03f), std::log(0.02f)};
  const int32_t n = 90;
  std::vector<SampleRow> rows;
  for (int32_t i = 0; i < n; ++i)
    rows.push_back({logits, {1.0f, 0, 0.9f, 0, (i + 0.5) / n}, "freq"});
  const std::vector<int32_t> got = check_sampling(rows, vocab);  // == the reference, row by row
  std::vector<int32_t> count(vocab, 0);
  for (int32_t id : got) ++count[id];
  // Nucleus of 0.9: {0.4, 0.3, 0.2} renormalised to 4/9, 3/9, 2/9; the tail never appears.
  EXPECT_NEAR(count[0], n * 4 / 9.0, 1);
  EXPECT_NEAR(count[1], n * 3 / 9.0, 1);
  EXPECT_NEAR(count[2], n * 2 / 9.0, 1);
  EXPECT_EQ(count[3] + count[4] + count[5], 0);
}

}  // namespace
}  // namespace fathom
