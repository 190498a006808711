// The CUDA ops of kernels/cuda (all but attention and rms_norm, see test_cuda_kernels.cpp) run on
// the CPU through kernels/cuda/emu and compared with their references. The .cu files are
// included so the host compiler builds exactly the source nvcc builds.
// Tolerances, |kernel - ref| <= atol + rtol·|ref| (no pass-rate thresholds); worst errors printed:
//   glu, f32 (silu / gelu-tanh):     atol 1e-6, rtol 1e-6 (same f32 formula; expf/tanhf ulps)
//   rope, f32:                       atol 1e-6, rtol 1e-6 (identical cos/sin; contraction only)
//   embedding, every type:           exact (same decode, products rounded as in the ref)
//   kv_append f32/f16/bf16 rows:     exact vs the f32 input rounded to the storage type;
//             int8 rows + (scale,min): exact vs cpu::kv_store_int8_row; v_sum: exact vs
//             one-by-one f32 appends; k_t: exact copy of the K rows
//   quant_gemv (Q8_0, Q4_K, Q6_K), x f32: |err| <= 2e-6·Σ|w·x| + 1e-6 vs double over the
//             ref-dequantized W (f32 products and a 32-lane tree sum)
//   gemm f16 / bf16 (emulated tiled path): |err| <= 1e-5·Σ|a·b| vs double over the same
//             rounded inputs (f32 accumulate)
//   sampling: the token equals the reference's exactly (both work in the same 32.32 fixed-point
//             weights, so there is no rounding to tolerate)
#include "kernels/cuda/activation.cu"
#include "kernels/cuda/embedding.cu"
#include "kernels/cuda/rope.cu"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/quant_blocks.h"
#include "kernels/ggml_type.h"
#include "kernels/ref/dequant.h"

namespace fathom {
namespace {

template <typename T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t n = 0;
  explicit DeviceBuffer(size_t count) : n(count) {
    EXPECT_EQ(cudaMalloc(&ptr, std::max<size_t>(1, n) * sizeof(T)), cudaSuccess);
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) {
    cudaMemcpy(ptr, host.data(), n * sizeof(T), cudaMemcpyHostToDevice);
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  std::vector<T> download() const {
    std::vector<T> host(n);
    cudaMemcpy(host.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost);
    return host;
  }
};

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
  for (const cuda::GluKind kind : {cuda::GluKind::kSwiGlu, cuda::GluKind::kGeGluTanh}) {
    for (const int64_t n : {1, 3, 7, 83, 769, 5125, 100003}) {
      for (const int64_t offset : {0, 1}) {  // offset 1: unaligned pointers, scalar path
        std::vector<float> gate(n + 1), up(n + 1);
        for (float& v : gate) v = normal(rng);
        for (float& v : up) v = normal(rng);
        std::vector<float> want(gate.begin() + offset, gate.begin() + offset + n);
        if (kind == cuda::GluKind::kSwiGlu)
          cpu::silu_mul(want.data(), up.data() + offset, n);
        else
          cpu::gelu_tanh_mul(want.data(), up.data() + offset, n);
        DeviceBuffer<float> dg(gate), du(up), dout(n + 1);
        ASSERT_EQ(cuda::glu(kind, dg.ptr + offset, du.ptr + offset, dout.ptr + offset, n, nullptr), cudaSuccess);
        const std::vector<float> got = dout.download();
        WorstError worst;
        for (int64_t i = 0; i < n; ++i) worst.add(got[offset + i], want[i], 1e-6, 1e-6, i);
        std::printf("glu %s n=%ld offset=%ld: worst |err| %.3g\n",
                    kind == cuda::GluKind::kSwiGlu ? "swiglu" : "geglu", static_cast<long>(n),
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

// ---- quantized rows -------------------------------------------------------------------------
uint16_t f16(float v) { return ref::fp32_to_fp16(v); }

// `rows` random rows of `dim` elements stored as `type`, with scales that keep values ~ 1.
std::vector<uint8_t> random_rows(GgmlType type, int64_t rows, int64_t dim, std::mt19937& rng) {
  std::uniform_int_distribution<int> byte(0, 255);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> unit(0.5f, 1.5f);
  std::vector<uint8_t> out;
  auto append = [&out](const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out.insert(out.end(), b, b + n);
  };
  for (int64_t r = 0; r < rows; ++r) {
    switch (type) {
      case GgmlType::F32:
        for (int64_t i = 0; i < dim; ++i) {
          const float v = normal(rng);
          append(&v, 4);
        }
        break;
      case GgmlType::F16:
      case GgmlType::BF16:
        for (int64_t i = 0; i < dim; ++i) {
          const float v = normal(rng);
          uint32_t bits;
          std::memcpy(&bits, &v, 4);
          const uint16_t h = type == GgmlType::F16 ? f16(v) : static_cast<uint16_t>(bits >> 16);
          append(&h, 2);
        }
        break;
      case GgmlType::Q8_0:
        for (int64_t b = 0; b < dim / 32; ++b) {
          quant::BlockQ8_0 q;
          q.d = f16(unit(rng) / 127.0f);
          for (int8_t& v : q.qs) v = static_cast<int8_t>(byte(rng) - 128);
          append(&q, sizeof(q));
        }
        break;
      case GgmlType::Q4_K:
        for (int64_t b = 0; b < dim / 256; ++b) {
          quant::BlockQ4_K q;
          q.d = f16(unit(rng) / 500.0f);
          q.dmin = f16(unit(rng) / 100.0f);
          for (uint8_t& v : q.scales) v = static_cast<uint8_t>(byte(rng));
          for (uint8_t& v : q.qs) v = static_cast<uint8_t>(byte(rng));
          append(&q, sizeof(q));
        }
        break;
      case GgmlType::Q6_K:
        for (int64_t b = 0; b < dim / 256; ++b) {
          quant::BlockQ6_K q;
          for (uint8_t& v : q.ql) v = static_cast<uint8_t>(byte(rng));
          for (uint8_t& v : q.qh) v = static_cast<uint8_t>(byte(rng));
          for (int8_t& v : q.scales) v = static_cast<int8_t>(byte(rng) - 128);
          q.d = f16(unit(rng) / 4000.0f);
          append(&q, sizeof(q));
        }
        break;
      default: ADD_FAILURE() << "random_rows: unsupported type";
    }
  }
  return out;
}

// ---- embedding ------------------------------------------------------------------------------
TEST(CudaOps, EmbeddingMatchesDequantize) {
  std::mt19937 rng(3);
  for (const GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_K,
                              GgmlType::Q6_K}) {
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

}  // namespace
}  // namespace fathom
