// The CUDA emulator (kernels/cuda/emu) against the execution-model guarantees kernels rely on.
#include "kernels/cuda/emu/cuda_emu.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

constexpr unsigned kFull = 0xffffffffu;

// Every thread writes its slot, syncs, then reads every other slot of the block (twice, with a
// second phase that overwrites, so a missing barrier would show stale or mixed values).
__global__ void barrier_kernel(int* out, int n) {
  __shared__ int slots[256];
  const int t = static_cast<int>(threadIdx.x);
  slots[t] = t * 3 + static_cast<int>(blockIdx.x);
  __syncthreads();
  int sum = 0;
  for (int i = 0; i < n; ++i) sum += slots[i];
  __syncthreads();
  slots[n - 1 - t] = sum;
  __syncthreads();
  out[blockIdx.x * n + t] = slots[t];
}

TEST(CudaEmu, BarrierMakesEveryWriteVisibleToTheWholeBlock) {
  for (int n : {1, 32, 33, 96, 256}) {
    const int blocks = 5;
    std::vector<int> out(blocks * n, -1);
    FATHOM_LAUNCH(barrier_kernel, dim3(blocks), dim3(n), 0, nullptr, out.data(), n);
    for (int b = 0; b < blocks; ++b) {
      const int expected = 3 * n * (n - 1) / 2 + b * n;
      for (int t = 0; t < n; ++t) ASSERT_EQ(out[b * n + t], expected) << "n=" << n << " block " << b << " thread " << t;
    }
  }
}

__global__ void shuffle_kernel(int* xor_out, int* down_out, int* idx_out, int* up_out, float* sum_out) {
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  const int base = warp * 32 * 5;  // per lane: 5 masks/offsets each
  for (int k = 0; k < 5; ++k) {
    const int off = 1 << k;
    xor_out[base + k * 32 + lane] = __shfl_xor_sync(kFull, lane * 10 + warp, off);
    down_out[base + k * 32 + lane] = __shfl_down_sync(kFull, lane * 10 + warp, off);
    up_out[base + k * 32 + lane] = __shfl_up_sync(kFull, lane * 10 + warp, off);
  }
  idx_out[threadIdx.x] = __shfl_sync(kFull, lane * 10 + warp, (lane * 7 + 3) % 32);
  float v = static_cast<float>(lane + 1);
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(kFull, v, off);
  sum_out[threadIdx.x] = v;
}

TEST(CudaEmu, ShufflesReachEveryLane) {
  const int warps = 3, n = warps * 32;
  std::vector<int> x(warps * 160), d(warps * 160), u(warps * 160), idx(n);
  std::vector<float> s(n);
  FATHOM_LAUNCH(shuffle_kernel, dim3(2), dim3(n), 0, nullptr, x.data(), d.data(), idx.data(), u.data(), s.data());
  for (int w = 0; w < warps; ++w) {
    for (int k = 0; k < 5; ++k) {
      const int off = 1 << k;
      for (int lane = 0; lane < 32; ++lane) {
        const int i = w * 160 + k * 32 + lane;
        EXPECT_EQ(x[i], (lane ^ off) * 10 + w);
        EXPECT_EQ(d[i], (lane + off < 32 ? lane + off : lane) * 10 + w) << "down lane " << lane << " by " << off;
        EXPECT_EQ(u[i], (lane >= off ? lane - off : lane) * 10 + w) << "up lane " << lane << " by " << off;
      }
    }
    for (int lane = 0; lane < 32; ++lane) {
      EXPECT_EQ(idx[w * 32 + lane], ((lane * 7 + 3) % 32) * 10 + w);
      EXPECT_EQ(s[w * 32 + lane], 528.0f);  // 1 + ... + 32 in every lane
    }
  }
}

__global__ void width_kernel(int* out) {
  const int lane = static_cast<int>(threadIdx.x);
  out[lane] = __shfl_sync(kFull, lane, 0, 8);  // broadcast from the first lane of each 8-group
  out[32 + lane] = __shfl_down_sync(kFull, lane, 4, 8);
}

TEST(CudaEmu, ShuffleWidthSegmentsTheWarp) {
  std::vector<int> out(64);
  FATHOM_LAUNCH(width_kernel, dim3(1), dim3(32), 0, nullptr, out.data());
  for (int lane = 0; lane < 32; ++lane) {
    EXPECT_EQ(out[lane], lane & ~7);
    EXPECT_EQ(out[32 + lane], (lane % 8) + 4 < 8 ? lane + 4 : lane);
  }
}

__global__ void ballot_kernel(unsigned* out, int* any_all) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  out[threadIdx.x] = __ballot_sync(kFull, lane % 3 == 0);
  any_all[threadIdx.x * 2] = __any_sync(kFull, lane == 31);
  any_all[threadIdx.x * 2 + 1] = __all_sync(kFull, lane < 31);
}

TEST(CudaEmu, BallotAndVotes) {
  std::vector<unsigned> out(64);
  std::vector<int> any_all(128);
  FATHOM_LAUNCH(ballot_kernel, dim3(1), dim3(64), 0, nullptr, out.data(), any_all.data());
  unsigned expected = 0;
  for (int lane = 0; lane < 32; lane += 3) expected |= 1u << lane;
  for (int t = 0; t < 64; ++t) {
    EXPECT_EQ(out[t], expected);
    EXPECT_EQ(any_all[2 * t], 1);
    EXPECT_EQ(any_all[2 * t + 1], 0);
  }
}

__global__ void atomic_kernel(int64_t* sum, int* max_v, float* fsum) {
  const int id = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  for (int i = 0; i < 4; ++i) {
    atomicAdd(sum, static_cast<int64_t>(id + 1));
    atomicMax(max_v, (id * 7919) % 10007);
    atomicAdd(fsum, 1.0f);
    if (i % 2 == 0) __syncthreads();  // interleave the fibers of a block between atomics
  }
}

TEST(CudaEmu, AtomicsUnderContention) {
  const int blocks = 64, threads = 128, n = blocks * threads;
  int64_t sum = 0;
  int max_v = -1;
  float fsum = 0;
  FATHOM_LAUNCH(atomic_kernel, dim3(blocks), dim3(threads), 0, nullptr, &sum, &max_v, &fsum);
  EXPECT_EQ(sum, 4 * static_cast<int64_t>(n) * (n + 1) / 2);
  int expected_max = 0;
  for (int id = 0; id < n; ++id) expected_max = std::max(expected_max, (id * 7919) % 10007);
  EXPECT_EQ(max_v, expected_max);
  EXPECT_EQ(fsum, 4.0f * n);  // integers below 2^24 add exactly in any order
}

// Each block fills its shared array with its own id, yields at barriers many times (so blocks on
// other OS threads run meanwhile), and checks nothing else wrote into it.
__global__ void isolation_kernel(int* bad) {
  __shared__ int tile[64];
  const int t = static_cast<int>(threadIdx.x), b = static_cast<int>(blockIdx.x);
  for (int round = 0; round < 20; ++round) {
    tile[t] = b * 1000 + round;
    __syncthreads();
    for (int i = 0; i < 64; ++i) {
      if (tile[i] != b * 1000 + round) atomicAdd(bad, 1);
    }
    __syncthreads();
  }
}

TEST(CudaEmu, SharedMemoryIsPerBlock) {
  int bad = 0;
  FATHOM_LAUNCH(isolation_kernel, dim3(16), dim3(64), 0, nullptr, &bad);
  EXPECT_EQ(bad, 0);
}

__global__ void dynamic_shared_kernel(float* out, int n) {
  FATHOM_DYNAMIC_SHARED(float, buf);
  const int t = static_cast<int>(threadIdx.x);
  for (int i = t; i < n; i += static_cast<int>(blockDim.x)) buf[i] = static_cast<float>(i + blockIdx.x);
  __syncthreads();
  for (int i = t; i < n; i += static_cast<int>(blockDim.x)) out[blockIdx.x * n + i] = buf[n - 1 - i];
}

TEST(CudaEmu, DynamicSharedMemory) {
  const int n = 1000, blocks = 3;
  std::vector<float> out(blocks * n);
  FATHOM_LAUNCH(dynamic_shared_kernel, dim3(blocks), dim3(96), n * sizeof(float), nullptr, out.data(), n);
  for (int b = 0; b < blocks; ++b) {
    for (int i = 0; i < n; ++i) ASSERT_EQ(out[b * n + i], static_cast<float>(n - 1 - i + b));
  }
}

__global__ void index_kernel(int* out) {
  const int block = static_cast<int>(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
  const int thread = static_cast<int>(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
  out[block * static_cast<int>(blockDim.x * blockDim.y * blockDim.z) + thread] += 1;
}

TEST(CudaEmu, EveryGridAndBlockIndexRunsOnce) {
  const dim3 grid(3, 2, 2), block(5, 3, 2);
  std::vector<int> out(12 * 30, 0);
  FATHOM_LAUNCH(index_kernel, grid, block, 0, nullptr, out.data());
  for (int v : out) ASSERT_EQ(v, 1);
}

// Half a warp waits at the block barrier while the other half waits at a shuffle: neither can
// complete. (Threads that have exited count as arrived, as on sm_70+, so that case is not one.)
__global__ void divergent_barrier_kernel(int* out) {
  int v = static_cast<int>(threadIdx.x);
  if (threadIdx.x % 32 < 16) {
    __syncthreads();
  } else {
    v = __shfl_xor_sync(kFull, v, 1);
  }
  out[threadIdx.x] = v;
}

TEST(CudaEmuDeathTest, DivergentBarrierAbortsInsteadOfHanging) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  std::vector<int> out(64);
  EXPECT_DEATH(FATHOM_LAUNCH(divergent_barrier_kernel, dim3(1), dim3(64), 0, nullptr, out.data()), "deadlock");
}

float bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(CudaEmu, HalfConversionsRoundToNearestEven) {
  struct Case {
    float in;
    uint16_t half;
  };
  const Case cases[] = {
      {0.0f, 0x0000},
      {-0.0f, 0x8000},
      {1.0f, 0x3c00},
      {-2.0f, 0xc000},
      {65504.0f, 0x7bff},                    // largest half
      {65519.0f, 0x7bff},                    // below the rounding midpoint
      {65520.0f, 0x7c00},                    // midpoint to an even "next" value: inf
      {1e10f, 0x7c00},
      {std::numeric_limits<float>::infinity(), 0x7c00},
      {-std::numeric_limits<float>::infinity(), 0xfc00},
      {1.0f + 1.0f / 2048, 0x3c00},          // tie between 0x3c00 and 0x3c01: even
      {1.0f + 3.0f / 2048, 0x3c02},          // tie between 0x3c01 and 0x3c02: even
      {1.0f + 1.0f / 2048 + 1.0f / 65536, 0x3c01},  // just above the tie
      {bits(0x33800000), 0x0001},            // 2^-24: smallest subnormal
      {bits(0x33000000), 0x0000},            // 2^-25: tie with 0, rounds to even 0
      {bits(0x33000001), 0x0001},            // just above: 1 ulp
      {bits(0x33c00000), 0x0002},            // 1.5 * 2^-24: tie, rounds to even 2
      {bits(0x387fc000), 0x03ff},            // largest subnormal
      {bits(0x387fe000), 0x0400},            // tie above it: rounds up into the normals
      {6.1035156e-05f, 0x0400},              // 2^-14: smallest normal
      {0.1f, 0x2e66},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(__float2half(c.in).x, c.half) << "in=" << c.in;
  }
  EXPECT_EQ(__float2half(std::nanf("")).x & 0x7e00, 0x7e00);
  EXPECT_TRUE(std::isnan(__half2float(__half{0x7e00})));
  EXPECT_TRUE(std::isnan(__half2float(__half{0x7c01})));
  EXPECT_EQ(__half2float(__half{0x7c00}), std::numeric_limits<float>::infinity());
  EXPECT_EQ(__half2float(__half{0x0001}), std::ldexp(1.0f, -24));
  EXPECT_EQ(__half2float(__half{0x03ff}), std::ldexp(1023.0f, -24));
  EXPECT_EQ(__half2float(__half{0xbc00}), -1.0f);
  EXPECT_TRUE(std::signbit(__half2float(__half{0x8000})));
  // Every finite half survives the round trip.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00) continue;
    ASSERT_EQ(__float2half(__half2float(__half{static_cast<uint16_t>(h)})).x, h);
  }
}

TEST(CudaEmu, Bfloat16ConversionsRoundToNearestEven) {
  EXPECT_EQ(__float2bfloat16(1.0f).x, 0x3f80);
  EXPECT_EQ(__float2bfloat16(-2.0f).x, 0xc000);
  EXPECT_EQ(__float2bfloat16(bits(0x3f808000)).x, 0x3f80);  // tie: even
  EXPECT_EQ(__float2bfloat16(bits(0x3f818000)).x, 0x3f82);  // tie: even (up)
  EXPECT_EQ(__float2bfloat16(bits(0x3f808001)).x, 0x3f81);
  EXPECT_EQ(__float2bfloat16(bits(0x7f7fffff)).x, 0x7f80);  // max float rounds to inf
  EXPECT_EQ(__float2bfloat16(std::numeric_limits<float>::infinity()).x, 0x7f80);
  EXPECT_EQ(__float2bfloat16(-std::numeric_limits<float>::infinity()).x, 0xff80);
  EXPECT_TRUE(std::isnan(__bfloat162float(__float2bfloat16(std::nanf("")))));
  EXPECT_TRUE(std::isnan(__bfloat162float(__float2bfloat16(bits(0x7f800001)))));  // NaN payload in low bits
  EXPECT_EQ(__bfloat162float(__nv_bfloat16{0x4049}), 3.140625f);
}

TEST(CudaEmu, MemoryApi) {
  float* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, 100 * sizeof(float)), cudaSuccess);
  std::vector<float> host(100), back(100, -1);
  for (int i = 0; i < 100; ++i) host[i] = static_cast<float>(i);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  EXPECT_EQ(cudaMemcpyAsync(dev, host.data(), 400, cudaMemcpyHostToDevice, stream), cudaSuccess);
  EXPECT_EQ(cudaMemset(dev + 50, 0, 40), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(back.data(), dev, 400, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(back[i], i >= 50 && i < 60 ? 0.0f : static_cast<float>(i));
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  EXPECT_EQ(cudaFree(dev), cudaSuccess);
}

// A copy on a non-blocking stream waits in its queue until something synchronises with the
// stream, as it runs concurrently on a GPU: a kernel on the default stream that does not wait
// for it reads the old bytes; one that waits (an event) reads the new ones.
__global__ void read_first(const float* src, float* dst) { *dst = *src; }

TEST(CudaEmu, NonBlockingStreamCopiesRunWhenWaitedFor) {
  float *pinned = nullptr, *dev = nullptr, *out = nullptr;
  ASSERT_EQ(cudaHostAlloc(&pinned, 4 * sizeof(float), cudaHostAllocMapped), cudaSuccess);
  void* mapped = nullptr;
  ASSERT_EQ(cudaHostGetDevicePointer(&mapped, pinned, 0), cudaSuccess);
  EXPECT_EQ(mapped, pinned);  // the emulated device reads host memory in place
  ASSERT_EQ(cudaMalloc(&dev, 4 * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&out, sizeof(float)), cudaSuccess);
  pinned[0] = 1.0f;
  dev[0] = -1.0f;
  cudaStream_t copy;
  cudaEvent_t copied;
  ASSERT_EQ(cudaStreamCreateWithFlags(&copy, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(dev, pinned, sizeof(float), cudaMemcpyHostToDevice, copy), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(copied, copy), cudaSuccess);
  pinned[0] = 2.0f;  // the copy has not run yet: it will see this value
  FATHOM_LAUNCH(read_first, dim3(1), dim3(1), 0, nullptr, dev, out);
  float got = 0.0f;
  cudaMemcpy(&got, out, sizeof(float), cudaMemcpyDeviceToHost);
  EXPECT_EQ(got, -1.0f) << "a default-stream kernel that did not wait saw the copy";
  ASSERT_EQ(cudaStreamWaitEvent(nullptr, copied, 0), cudaSuccess);
  FATHOM_LAUNCH(read_first, dim3(1), dim3(1), 0, nullptr, dev, out);
  cudaMemcpy(&got, out, sizeof(float), cudaMemcpyDeviceToHost);
  EXPECT_EQ(got, 2.0f);
  // Operations after the event stay queued until the stream is synchronised.
  ASSERT_EQ(cudaMemsetAsync(dev, 0, sizeof(float), copy), cudaSuccess);
  EXPECT_EQ(dev[0], 2.0f);
  ASSERT_EQ(cudaStreamSynchronize(copy), cudaSuccess);
  EXPECT_EQ(dev[0], 0.0f);
  EXPECT_EQ(cudaEventDestroy(copied), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(copy), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);
  cudaFree(dev);
  cudaFree(out);
}

}  // namespace
