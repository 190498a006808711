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

}  // namespace fathom::grid
