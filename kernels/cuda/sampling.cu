// Sampling without a sort. Launch: grid (rows), block 256 (8 warps), __launch_bounds__(256, 4):
// without the minimum ptxas chose 40 registers and spilt (sm_80). Every pass below is a
// strided sweep of the row (coalesced) followed by a block reduction, so a row of V logits
// costs a few O(V / 256) sweeps per thread and no O(V log V) work:
//   1. argmax of (key, −id) packed in 64 bits: warp shuffles + shared memory. Greedy ends here.
//   2. top-k threshold: radix select on the 32-bit keys, 8 bits per pass (4 passes), with a
//      256-bin shared histogram of counts: the k-th key τ_k and how many tokens equal to τ_k
//      (lowest ids) complete the k.
//   3. top-p threshold: the same radix select over weights instead of counts (64-bit integer
//      atomics in shared memory: exact, so the result does not depend on atomic order), on the
//      candidates of step 2 only: τ_p and the number of tokens at τ_p (lowest ids first).
//   4. the draw: the row in tiles of 256 consecutive ids, a block prefix sum of the tie ranks
//      and one of the weights per tile, stop at the first tile where the running sum passes r.
// Integer weights make GPU, emulator and the CPU reference agree token for token: the only
// float operations are expf and the products, identical wherever expf is (on a real GPU expf
// may differ by an ulp from glibc's, moving a weight by ~2^8 of its 2^32 scale).
// Cost: step 1 + (k: 4) + (p: 1 + 4) + 1 + step 4 sweeps; a single block per row, so a batch
// of one row uses one SM: a split-vocabulary variant is the next step for small batches.
#include "kernels/cuda/sampling.h"

namespace fathom::cuda {
namespace sampling_detail {  // named: the kernels' names stay unique across the .cu files

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr float kGreedyTemperature = 1e-5f;
using u64 = unsigned long long;

__device__ __forceinline__ uint32_t float_bits(float f) {
#ifdef __CUDACC__
  return __float_as_uint(f);
#else
  return fathom_emu::f32_bits(f);
#endif
}
__device__ __forceinline__ float bits_float(uint32_t u) {
#ifdef __CUDACC__
  return __uint_as_float(u);
#else
  return fathom_emu::bits_f32(u);
#endif
}

// Order-preserving key of a logit (NaN as -inf); every key of a real logit is > 0.
__device__ __forceinline__ uint32_t key_of(float x) {
  const uint32_t b = float_bits(x != x ? -INFINITY : x);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float float_of(uint32_t key) {
  return bits_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

__device__ __forceinline__ u64 weight(float x, float max_logit, float inv_t) {
  const float e = expf(((x != x ? -INFINITY : x) - max_logit) * inv_t);
  return static_cast<u64>(e * 4294967296.0f);
}

// Block-wide reductions and scan of u64 (every thread calls; all threads get the result).
__device__ __forceinline__ u64 block_max(u64 v, u64* warp_buf) {
  for (int o = 16; o > 0; o >>= 1) {
    const u64 t = __shfl_xor_sync(kFullMask, v, o);
    v = t > v ? t : v;
  }
  if (threadIdx.x % 32 == 0) warp_buf[threadIdx.x / 32] = v;
  __syncthreads();
  u64 all = 0;
  for (int w = 0; w < kWarps; ++w) all = warp_buf[w] > all ? warp_buf[w] : all;
  __syncthreads();  // warp_buf is reused by the next collective
  return all;
}

__device__ __forceinline__ u64 block_sum(u64 v, u64* warp_buf) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  if (threadIdx.x % 32 == 0) warp_buf[threadIdx.x / 32] = v;
  __syncthreads();
  u64 all = 0;
  for (int w = 0; w < kWarps; ++w) all += warp_buf[w];
  __syncthreads();
  return all;
}

// Inclusive prefix sum over the block in thread order; *total gets the block's sum.
__device__ __forceinline__ u64 block_scan(u64 v, u64* warp_buf, u64* total) {
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  for (int o = 1; o < 32; o <<= 1) {
    const u64 t = __shfl_up_sync(kFullMask, v, o);
    if (lane >= o) v += t;
  }
  if (lane == 31) warp_buf[warp] = v;
  __syncthreads();
  u64 before = 0, all = 0;
  for (int w = 0; w < kWarps; ++w) {
    before += w < warp ? warp_buf[w] : 0;
    all += warp_buf[w];
  }
  __syncthreads();
  *total = all;
  return before + v;
}

struct Threshold {
  uint32_t key;  // τ: tokens with key > τ are in
  u64 need;      // count mode: how many tokens equal to τ complete the set; mass mode: weight still needed
};

// Radix select from the top: the key τ where the running count (kMass false) or weight (true)
// over keys in descending order reaches `need`, among tokens with key > floor_key plus
// floor_ties tokens at floor_key (count mode passes floor 0 / 0: every token).
template <bool kMass>
__device__ __forceinline__ Threshold radix_select(const float* x, int vocab, float max_logit, float inv_t, uint32_t floor_key,
                                  u64 floor_ties, u64 need, u64* hist, uint32_t* s_key, u64* s_need) {
  const int tid = static_cast<int>(threadIdx.x);
  uint32_t prefix = 0, mask = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = tid; b < 256; b += kThreads) hist[b] = 0;
    __syncthreads();
    for (int i = tid; i < vocab; i += kThreads) {
      const float v = x[i];
      const uint32_t k = key_of(v);
      if (k > floor_key && (k & mask) == prefix)
        atomicAdd(&hist[(k >> shift) & 255u], kMass ? weight(v, max_logit, inv_t) : u64{1});
    }
    __syncthreads();
    if (tid == 0) {
      if (floor_ties > 0 && (floor_key & mask) == prefix)
        hist[(floor_key >> shift) & 255u] += floor_ties * (kMass ? weight(float_of(floor_key), max_logit, inv_t) : 1);
      u64 above = 0;
      int b = 255;
      for (; b > 0 && above + hist[b] < need; --b) above += hist[b];
      *s_key = prefix | (static_cast<uint32_t>(b) << shift);
      *s_need = need - above;
    }
    __syncthreads();
    prefix = *s_key;
    need = *s_need;
    mask |= 255u << shift;
  }
  return {prefix, need};
}

// grid (rows), block (kThreads)
__global__ void __launch_bounds__(kThreads, 4) sample_kernel(const float* __restrict__ logits, int64_t row_stride,
                                                          int vocab, const SampleParams* __restrict__ params,
                                                          int32_t* __restrict__ out) {
  __shared__ u64 hist[256];
  __shared__ u64 warp_buf[kWarps];
  __shared__ uint32_t s_key;
  __shared__ u64 s_need;
  __shared__ int s_found;
  const int tid = static_cast<int>(threadIdx.x);
  const float* x = logits + static_cast<int64_t>(blockIdx.x) * row_stride;
  const SampleParams p = params[blockIdx.x];

  // 1. argmax, lowest id on ties.
  u64 best = 0;
  for (int i = tid; i < vocab; i += kThreads) {
    const u64 packed = (static_cast<u64>(key_of(x[i])) << 32) | (0xffffffffu - static_cast<uint32_t>(i));
    best = packed > best ? packed : best;
  }
  best = block_max(best, warp_buf);
  const int argmax = static_cast<int>(0xffffffffu - static_cast<uint32_t>(best & 0xffffffffu));
  const float max_logit = float_of(static_cast<uint32_t>(best >> 32));
  if (!(p.temperature >= kGreedyTemperature) || p.top_k == 1 || !(max_logit > -INFINITY && max_logit < INFINITY)) {
    if (tid == 0) out[blockIdx.x] = argmax;
    return;
  }
  const float inv_t = 1.0f / p.temperature;

  // The current set: tokens with key > tau, plus the first n_ties (by id) with key == tau.
  uint32_t tau = 0;
  u64 n_ties = 0;
  if (p.top_k > 0 && p.top_k < vocab) {  // 2.
    const Threshold t = radix_select<false>(x, vocab, max_logit, inv_t, 0, 0, static_cast<u64>(p.top_k), hist,
                                            &s_key, &s_need);
    tau = t.key;
    n_ties = t.need;
  }
  u64 above = 0;  // weight of the tokens with key > tau
  for (int i = tid; i < vocab; i += kThreads) {
    const float v = x[i];
    if (key_of(v) > tau) above += weight(v, max_logit, inv_t);
  }
  above = block_sum(above, warp_buf);
  u64 total = above + n_ties * weight(float_of(tau), max_logit, inv_t);
  if (p.top_p < 1.0f) {  // 3.
    const double t = static_cast<double>(p.top_p) * (1.0 - 1e-6) * static_cast<double>(total);
    const u64 target = t < 1.0 ? 1 : static_cast<u64>(t);
    const Threshold th =
        radix_select<true>(x, vocab, max_logit, inv_t, tau, n_ties, target, hist, &s_key, &s_need);
    const u64 w_tau = weight(float_of(th.key), max_logit, inv_t);  // > 0: its bin reached the target
    tau = th.key;
    // ceil(need / w_tau) without a 64-bit division (a called subroutine with a stack frame on
    // the device): both are < 2^53, so the double quotient is within one of the answer.
    n_ties = static_cast<u64>(static_cast<double>(th.need) / static_cast<double>(w_tau));
    while (n_ties * w_tau < th.need) ++n_ties;
    while (n_ties > 0 && (n_ties - 1) * w_tau >= th.need) --n_ties;
    above = 0;
    for (int i = tid; i < vocab; i += kThreads) {
      const float v = x[i];
      if (key_of(v) > tau) above += weight(v, max_logit, inv_t);
    }
    above = block_sum(above, warp_buf);
    total = above + n_ties * w_tau;
  }

  // 4. The draw, in id order.
  const double rd = p.uniform * static_cast<double>(total);
  u64 r = rd < 0.0 ? 0 : static_cast<u64>(rd);
  if (r >= total) r = total - 1;
  if (tid == 0) s_found = -1;
  __syncthreads();
  u64 carry_mass = 0, carry_ties = 0;
  for (int base = 0; base < vocab; base += kThreads) {
    const int i = base + tid;
    const float v = i < vocab ? x[i] : -INFINITY;
    const uint32_t k = i < vocab ? key_of(v) : 0;
    const u64 tie = (i < vocab && k == tau && n_ties > 0) ? 1 : 0;
    u64 tie_total, mass_total;
    const u64 rank = carry_ties + block_scan(tie, warp_buf, &tie_total) - tie;
    const bool in = i < vocab && (k > tau || (tie && rank < n_ties));
    const u64 w = in ? weight(v, max_logit, inv_t) : 0;
    const u64 incl = carry_mass + block_scan(w, warp_buf, &mass_total);
    if (w > 0 && incl > r && incl - w <= r) s_found = i;  // exactly one thread of the row
    carry_ties += tie_total;
    carry_mass += mass_total;
    __syncthreads();
    if (s_found >= 0) break;
  }
  if (tid == 0) out[blockIdx.x] = s_found >= 0 ? s_found : argmax;
}

}  // namespace sampling_detail

cudaError_t sample_top_k_top_p(const float* logits, int64_t row_stride, int32_t vocab, int32_t rows,
                               const SampleParams* params, int32_t* out, cudaStream_t stream) {
  using namespace sampling_detail;
  if (rows == 0) return cudaSuccess;
  if (rows < 0 || vocab <= 0 || vocab == 0x7fffffff || row_stride < vocab) return cudaErrorInvalidValue;
  FATHOM_LAUNCH(sample_kernel, dim3(static_cast<unsigned>(rows)), dim3(kThreads), 0, stream, logits, row_stride,
                vocab, params, out);
  return cudaGetLastError();
}

}  // namespace fathom::cuda
