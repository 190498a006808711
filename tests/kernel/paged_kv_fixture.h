#pragma once
// Test fixture shared by the attention kernel tests: a paged KV pool of random rows with an f32
// master copy, stored as f32 / f16 / INT8 (per-row scale and min), plus the optional SparQ side
// data the engine maintains at append time (K transposed per tile, running V sums and K
// moments). One
// sequence's block table is a random permutation, so logical order != physical order.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/paged_kv.h"
#include "kernels/ref/dequant.h"

namespace fathom::testing {

// n values ~ N(0, sigma²): queries and other inputs for the attention kernel tests.
inline std::vector<float> normal_vector(size_t n, std::mt19937& rng, float sigma = 1.0f) {
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

struct PagedKvFixture {
  int32_t d = 0, n_kv_heads = 0, block_size = 0;
  KvDtype dtype = KvDtype::kF32;
  std::vector<float> kf, vf;               // master rows [physical][n_kv_heads][block_size][d]
  std::vector<uint8_t> k, v, k_t;          // stored as `dtype`; k_t: [physical][n_kv_heads][d][block_size]
  std::vector<KvInt8Row> k_rows, v_rows;   // INT8 only: [physical][n_kv_heads][block_size]
  std::vector<float> v_sum;                // [physical][n_kv_heads][d] running sums of the master V
  std::vector<float> k_moments;            // [physical][n_kv_heads][2][d] running mean and M2 of the master K
  std::vector<int32_t> table;              // the sequence's logical -> physical blocks
  int32_t seq_len = 0;

  PagedKvView view(bool with_k_t = true, bool with_v_sum = true) const {
    PagedKvView kv{k.data(), v.data(), dtype, table.data(), block_size, n_kv_heads, d};
    if (dtype == KvDtype::kI8) {
      kv.k_rows = k_rows.data();
      kv.v_rows = v_rows.data();
    }
    if (with_k_t) kv.k_t = k_t.data();
    if (with_v_sum) kv.v_sum = v_sum.data();
    kv.k_moments = k_moments.data();
    return kv;
  }

  // Re-stores the master copy (call after editing kf / vf) and rebuilds the side data.
  void store() {
    const size_t elem = kv_dtype_bytes(dtype), rows = kf.size() / d;
    k.assign(kf.size() * elem, 0);
    v.assign(vf.size() * elem, 0);
    k_rows.assign(dtype == KvDtype::kI8 ? rows : 0, KvInt8Row{});
    v_rows.assign(k_rows.size(), KvInt8Row{});
    for (size_t r = 0; r < rows; ++r) {
      if (dtype == KvDtype::kI8) {
        cpu::kv_store_int8_row(&kf[r * d], d, &k[r * d], &k_rows[r]);
        cpu::kv_store_int8_row(&vf[r * d], d, &v[r * d], &v_rows[r]);
      } else {
        cpu::kv_store(&kf[r * d], &k[r * d * elem], dtype, d);
        cpu::kv_store(&vf[r * d], &v[r * d * elem], dtype, d);
      }
    }
    // Transposed K, tile by tile: k_t[tile][c][slot] = k[tile][slot][c] (same bytes per element).
    k_t.assign(k.size(), 0);
    const size_t tiles = rows / block_size;
    for (size_t tile = 0; tile < tiles; ++tile)
      for (int32_t s = 0; s < block_size; ++s)
        for (int32_t c = 0; c < d; ++c)
          std::copy_n(&k[((tile * block_size + s) * d + c) * elem], elem,
                      &k_t[((tile * d + c) * block_size + s) * elem]);
    // Running V sums and K moments along the sequence, the way the engine appends: a new block
    // starts from the previous block's.
    v_sum.assign(tiles * d, 0.0f);
    k_moments.assign(tiles * 2 * d, 0.0f);
    for (int32_t h = 0; h < n_kv_heads; ++h) {
      std::vector<float> run(d, 0.0f), mean(d, 0.0f), m2(d, 0.0f);
      for (int32_t t = 0; t < seq_len; ++t) {
        const size_t tile = static_cast<size_t>(table[t / block_size]) * n_kv_heads + h;
        const size_t row = (tile * block_size + t % block_size) * d;
        for (int32_t c = 0; c < d; ++c) {
          run[c] += vf[row + c];
          key_moments_update(kf[row + c], t, mean[c], m2[c]);
        }
        std::copy(run.begin(), run.end(), &v_sum[tile * d]);
        std::copy(mean.begin(), mean.end(), &k_moments[tile * 2 * d]);
        std::copy(m2.begin(), m2.end(), &k_moments[tile * 2 * d + d]);
      }
    }
  }
};

// `spare` extra physical blocks are allocated but not in the table (kernels must not read them).
inline PagedKvFixture make_paged_kv(int32_t d, int32_t n_kv_heads, int32_t block_size, KvDtype dtype, int32_t seq_len,
                                    int32_t spare, std::mt19937& rng) {
  PagedKvFixture f;
  f.d = d;
  f.n_kv_heads = n_kv_heads;
  f.block_size = block_size;
  f.dtype = dtype;
  f.seq_len = seq_len;
  const int32_t used = (seq_len + block_size - 1) / block_size, physical = used + spare;
  const size_t n = static_cast<size_t>(physical) * n_kv_heads * block_size * d;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  f.kf.resize(n);
  f.vf.resize(n);
  for (float& x : f.kf) x = normal(rng);
  for (float& x : f.vf) x = normal(rng);
  std::vector<int32_t> perm(physical);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  f.table.assign(perm.begin(), perm.begin() + used);
  f.store();
  return f;
}

}  // namespace fathom::testing
