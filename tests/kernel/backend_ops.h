#pragma once
// The op-test grid (tests/kernel/test_backend_ops.cpp) and its CUDA backend: host inputs in, host
// results out, and no CUDA type in this header, so the grid compiles once with the host compiler
// whichever runtime the runner was built against. tests/kernel/backend_ops_cuda.cu implements it
// from one source twice:
//   test_backend_ops       the host compiler against kernels/cuda/emu, linked with fathom_cuda_emu
//                          (the backend "cuda_emu": always present);
//   test_backend_ops_cuda  nvcc against the CUDA runtime, linked with fathom_cuda_kernels, built
//                          where nvcc exists (the backend "cuda": present when the runtime reports
//                          a device, chosen at run time).
// Every call uploads its inputs, launches, synchronises and downloads; a CUDA error throws
// std::runtime_error naming the launch.
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/ggml_type.h"
#include "kernels/paged_kv.h"
#include "kernels/ref/hip.h"
#include "tests/kernel/paged_kv_fixture.h"

namespace fathom::grid {

struct CudaDevice {
  std::string name;      // "cuda_emu" or "cuda"
  bool emulated = false;
  bool present = false;  // the emulator: always; a device: cudaGetDeviceCount() > 0
  std::string detail;    // the device's name, or why there is none
};
CudaDevice cuda_device();

// Global-memory bytes of a launch, as its launcher's formula says and as the emulator counted the
// grid's loads and stores (attention_common.h; has_counted is false on a device).
struct Bytes {
  int64_t kv_read = 0, other_read = 0, written = 0;
};
struct LaunchBytes {
  Bytes formula, counted;
  bool has_counted = false;
};

// The fixture's pool on the device, seen as the view f.view(k_t, v_sum) sees it (k_moments always).
struct KvPlanes {
  bool k_t = true, v_sum = true;
};

// ---- attention ------------------------------------------------------------------------------

// cuda::paged_decode_attention. a.q: [n_q][n_heads][d] host; a.sinks: [n_heads] host or null.
std::vector<float> cuda_dense(const testing::PagedKvFixture& f, KvPlanes planes, const AttentionArgs& a,
                              int32_t keys_per_split, LaunchBytes* bytes);

struct SparqLaunch {
  int32_t k = 128, l = -1, r = -1;
  bool reallocation = true, key_spread = false;
  int32_t score_keys_per_split = 1024, attend_keys_per_split = 64;
};
struct CudaSparqResult {
  std::vector<float> out;
  int32_t k = 0, l = 0, r = 0;
  std::vector<std::vector<int32_t>> i1, i2;  // [n_kv_heads] as the workspace holds them
  std::vector<float> alpha;                  // [n_heads]
  LaunchBytes bytes;
};
// cuda::sparq_decode_attention for the decode query a (a.q host).
CudaSparqResult cuda_sparq(const testing::PagedKvFixture& f, KvPlanes planes, const DecodeArgs& a, const SparqLaunch& c);

struct CudaHipResult {
  bool dense = true;
  std::vector<std::vector<int32_t>> block_starts;  // [n_heads] (empty when dense)
  std::vector<float> out;
  LaunchBytes estimate, attend;  // estimate.formula: the launcher's upper bound
};
// cuda::hip_estimate_mask at est (est.q host), then cuda::hip_sparse_attention at a with that mask.
CudaHipResult cuda_hip(const testing::PagedKvFixture& f, KvPlanes planes, const DecodeArgs& est, const DecodeArgs& a,
                   const ref::HipParams& p, int32_t keys_per_split);

struct CudaSwaResult {
  std::vector<float> out, weights;  // weights: [kept.size()]
  LaunchBytes bytes;
};
// cuda::swa_attention over the caller's kept positions.
CudaSwaResult cuda_swa(const testing::PagedKvFixture& f, KvPlanes planes, const DecodeArgs& a,
                   const std::vector<int32_t>& kept, int32_t keys_per_split);
// cuda::swa_select and cuda::swa_fold (SWA's mass on the device).
std::vector<int32_t> cuda_swa_select(const std::vector<float>& mass, int32_t radius, int32_t k_local, int32_t k_global);
std::vector<float> cuda_swa_fold(const std::vector<float>& mass, float keep, const std::vector<int32_t>& kept,
                                 const std::vector<float>& weights);

// cuda::bifurcated_attention: sequence i attends [0, pos[i]] through tables[i] over the pool,
// each segment's keys [begin, end) read once for its members through tables[members[0]].
// q: [n_seqs][n_heads][d]; sinks: [n_heads] or empty.
struct BifSegment {
  int32_t begin = 0, end = 0;
  std::vector<int32_t> members;
};
std::vector<float> cuda_bifurcated(const testing::PagedKvFixture& pool, const std::vector<std::vector<int32_t>>& tables,
                                   const std::vector<BifSegment>& segments, const std::vector<int32_t>& pos,
                                   const std::vector<float>& q, int32_t n_heads, LogitScale scale,
                                   const std::vector<float>& sinks, int32_t keys_per_split, LaunchBytes* bytes);

// ---- element-wise and row ops ----------------------------------------------------------------

// cuda::rms_norm over rows of n (in place: y is x's buffer).
std::vector<float> cuda_rms_norm(const std::vector<float>& x, const std::vector<float>& w, int64_t rows, int64_t n,
                                 float eps, bool in_place);
// cuda::glu over gate[offset, offset + n) and up[offset, ...); returns the output buffer (gate's size,
// written from offset; in place: gate's buffer).
enum class GluKind { kSwiGlu, kGeGluTanh, kSwiGluOai };
std::vector<float> cuda_glu(GluKind kind, const std::vector<float>& gate, const std::vector<float>& up, int64_t offset,
                            int64_t n, bool in_place);
// cuda::rope on x ([n_tokens] rows of token_stride floats), cos / sin: [cache rows][rope_dim / 2].
std::vector<float> cuda_rope(const std::vector<float>& x, const std::vector<int32_t>& pos, int64_t token_stride,
                             int32_t n_heads, int32_t head_dim, int32_t rope_dim, bool neox, const std::vector<float>& cos,
                             const std::vector<float>& sin);
// cuda::embedding_lookup: [ids.size()][dim].
std::vector<float> cuda_embedding(const std::vector<uint8_t>& table, GgmlType type, int64_t n_rows, int64_t dim,
                                  const std::vector<int32_t>& ids, float scale);
// cuda::embedding_lookup_f16: the f16 bits, [ids.size()][dim].
std::vector<uint16_t> cuda_embedding_f16(const std::vector<uint8_t>& table, GgmlType type, int64_t n_rows, int64_t dim,
                                         const std::vector<int32_t>& ids, float scale);
// cuda::convert_f32_to_f16: the f16 bits.
std::vector<uint16_t> cuda_to_f16(const std::vector<float>& x);
// cuda::quant_gemv: y [n_x][n_out] = x [n_x][k] · Wᵀ.
std::vector<float> cuda_quant_gemv(GgmlType type, const std::vector<uint8_t>& w, int64_t n_out, int64_t k,
                                   const std::vector<float>& x, int32_t n_x);
// cuda::gemm_{f16,bf16} (cuBLAS, or its stand-in under the emulator) or gemm_*_tiled: a, b as the
// storage type's bits; c: the output buffer's initial contents ([m][ldc]), returned after the call.
std::vector<float> cuda_gemm(bool bf16, bool tiled, const std::vector<uint16_t>& a, int64_t lda,
                             const std::vector<uint16_t>& b, int64_t ldb, const std::vector<float>& c, int64_t ldc,
                             int32_t m, int32_t n, int32_t k);

// cuda::sample_top_k_top_p, one token per row of `logits` ([rows][row_stride]).
struct SampleParams {
  float temperature = 1.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  double uniform = 0.0;
};
std::vector<int32_t> cuda_sample(const std::vector<float>& logits, int64_t row_stride, int32_t vocab,
                                 const std::vector<SampleParams>& params);

// ---- KV append ------------------------------------------------------------------------------

enum class KvStore { kF32, kF16, kBF16, kI8 };
// One cache layer's planes on the host, laid out as cuda::KvCacheLayer's.
struct KvLayer {
  KvStore dtype = KvStore::kF32;
  int32_t block_size = 16, n_kv_heads = 0, head_dim = 0;
  std::vector<uint8_t> k, v, k_t;
  std::vector<KvInt8Row> k_rows, v_rows;  // INT8 only
  std::vector<float> v_sum, k_moments;
};
// A batch as cuda::KvAppendBatch takes it: token i's K at kv[i·token_stride], V at + v_offset.
struct KvBatch {
  std::vector<float> kv;
  int64_t token_stride = 0, v_offset = 0;
  std::vector<int32_t> positions, seq_token_start, block_tables, running_row;
  int32_t table_stride = 0, journal_rows = 0;  // journal_rows: rows of the running journal
};
struct KvAppendResult {
  KvLayer after;                     // the planes after cuda::kv_append
  std::vector<float> journal;        // the running planes it journaled
  std::vector<float> v_sum_rolled, k_moments_rolled;  // after cuda::kv_set_running(rollback_block, journal row 0)
  std::vector<float> running_read;   // cuda::kv_get_running(rollback_block) after that
};
KvAppendResult cuda_kv_append(const KvLayer& layer, const KvBatch& batch, int32_t rollback_block);

}  // namespace fathom::grid
