// The CUDA launchers' argument checks (a fault path, not numerics: those are the op-test grid's,
// tests/kernel/test_backend_ops.cpp): shapes, types and arguments a kernel does not support return
// cudaErrorInvalidValue before anything is launched. Run through kernels/cuda/emu.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kernels/cuda/embedding.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/paged_decode_attention.h"
#include "kernels/cuda/quant_gemv.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/swa_attention.h"
#include "kernels/cuda/swa_mass.h"
#include "tests/kernel/cuda_device_kv.h"

namespace fathom {
namespace {

using testing::DeviceBuffer;
using testing::DeviceKv;

TEST(CudaRejects, DenseUnsupportedShapes) {
  PagedKvView kv;
  kv.n_kv_heads = 2;
  kv.head_dim = 257;
  AttentionArgs args;
  args.n_q = 1;
  args.n_heads = 4;
  const cuda::DecodeAttentionPlan plan = cuda::plan_paged_decode_attention(kv, args);
  EXPECT_EQ(cuda::paged_decode_attention(kv, args, plan, nullptr, nullptr), cudaErrorInvalidValue);
  kv.head_dim = 64;
  args.n_heads = 3;  // not a multiple of n_kv_heads
  EXPECT_EQ(cuda::paged_decode_attention(kv, args, plan, nullptr, nullptr), cudaErrorInvalidValue);
  args.n_heads = 4;
  kv.dtype = KvDtype::kI8;  // INT8 without its row parameters
  EXPECT_EQ(cuda::paged_decode_attention(kv, args, cuda::plan_paged_decode_attention(kv, args), nullptr, nullptr),
            cudaErrorInvalidValue);
}

TEST(CudaRejects, SwaBadArguments) {
  std::mt19937 rng(3);
  const testing::PagedKvFixture f = testing::make_paged_kv(64, 2, 16, KvDtype::kF16, 20, 2, rng);
  DeviceKv dkv(f);
  const PagedKvView kv = dkv.view(f);
  DeviceBuffer<float> q(4 * 64), out(4 * 64), w(8), ws(4096);
  DeviceBuffer<int32_t> kept(std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7});
  DecodeArgs args{q.ptr, out.ptr, 4, 19, 0.125f};
  const cuda::SwaPlan plan = cuda::plan_swa_attention(kv, args, 8);
  EXPECT_EQ(cuda::swa_attention(kv, args, nullptr, plan, w.ptr, ws.ptr, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::swa_attention(kv, args, kept.ptr, cuda::plan_swa_attention(kv, args, 0), w.ptr, ws.ptr, nullptr),
            cudaErrorInvalidValue);
  args.n_heads = 3;  // not a multiple of the kv heads
  EXPECT_EQ(cuda::swa_attention(kv, args, kept.ptr, plan, w.ptr, ws.ptr, nullptr), cudaErrorInvalidValue);
}

TEST(CudaRejects, SwaMassBadArguments) {
  DeviceBuffer<float> m(4), ws(12);
  DeviceBuffer<int32_t> k(4);
  EXPECT_EQ(cuda::swa_select(m.ptr, 4, 1, 0, 2, ws.ptr, k.ptr, nullptr), cudaErrorInvalidValue);  // k_local 0
  EXPECT_EQ(cuda::swa_select(m.ptr, 4, 1, 2, 3, ws.ptr, k.ptr, nullptr), cudaErrorInvalidValue);  // k_global > older
  EXPECT_EQ(cuda::swa_select(m.ptr, 4, -1, 2, 1, ws.ptr, k.ptr, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::swa_fold(m.ptr, 4, 0.5f, nullptr, m.ptr, 2, nullptr), cudaErrorInvalidValue);
}

TEST(CudaRejects, RopeDims) {
  float dummy = 0;
  EXPECT_EQ(cuda::rope(&dummy, nullptr, 1, 8, 1, 8, 3, false, nullptr, nullptr, nullptr), cudaErrorInvalidValue);  // odd
  EXPECT_EQ(cuda::rope(&dummy, nullptr, 1, 8, 1, 8, 10, false, nullptr, nullptr, nullptr), cudaErrorInvalidValue);  // > head_dim
}

TEST(CudaRejects, EmbeddingTypesAndDims) {
  EXPECT_EQ(cuda::embedding_lookup(nullptr, GgmlType::Q4_0, 1, 32, nullptr, 1, 1.0f, nullptr, nullptr),
            cudaErrorInvalidValue);  // a type it does not decode
  EXPECT_EQ(cuda::embedding_lookup(nullptr, GgmlType::Q8_0, 1, 48, nullptr, 1, 1.0f, nullptr, nullptr),
            cudaErrorInvalidValue);  // not a whole number of blocks
}

TEST(CudaRejects, QuantGemvShapes) {
  DeviceBuffer<float> dx(256);
  EXPECT_EQ(cuda::quant_gemv(GgmlType::Q4_K, dx.ptr, 1, 256, dx.ptr, cuda::kQuantGemvMaxRows + 1, dx.ptr, nullptr),
            cudaErrorInvalidValue);  // n_x
  EXPECT_EQ(cuda::quant_gemv(GgmlType::Q4_K, dx.ptr, 1, 96, dx.ptr, 1, dx.ptr, nullptr), cudaErrorInvalidValue);  // k
  EXPECT_EQ(cuda::quant_gemv(GgmlType::Q4_0, dx.ptr, 1, 256, dx.ptr, 1, dx.ptr, nullptr), cudaErrorInvalidValue);  // type
}

TEST(CudaRejects, GemmLeadingDimension) {
  cuda::GemmHandle* handle = nullptr;
  ASSERT_EQ(cuda::gemm_create(&handle), cudaSuccess);
  EXPECT_EQ(cuda::gemm_f16(handle, nullptr, 3, nullptr, 4, nullptr, 4, 1, 4, 4, nullptr), cudaErrorInvalidValue);  // lda < k
  cuda::gemm_destroy(handle);
}

TEST(CudaRejects, SamplingNullArguments) {
  EXPECT_EQ(cuda::sample_top_k_top_p(nullptr, 3, 4, 1, nullptr, nullptr, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace fathom
