#pragma once
// The one include of every kernels/cuda/*.cu file.
//   nvcc (__CUDACC__): the real CUDA headers, FATHOM_LAUNCH = <<<...>>>.
//   host compiler:     a header-only emulation of the CUDA execution model (see README.md in
//                      this directory for the supported subset and how it is emulated).
// Anything outside the subset is simply not declared, so a kernel using it fails to compile
// under emulation instead of misbehaving.

// Dynamic shared memory: FATHOM_DYNAMIC_SHARED(float, smem); declares `float* smem` pointing at
// the launch's dynamic shared bytes (16-byte aligned). Plain `extern __shared__` is rejected
// by the emulator.
#ifdef __CUDACC__

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

// `#pragma unroll` spelled so that the host compiler (which warns on it) never sees it.
#define FATHOM_UNROLL _Pragma("unroll")
#define FATHOM_LAUNCH(kernel, grid, block, shmem_bytes, stream, ...) \
  kernel<<<(grid), (block), (shmem_bytes), (stream)>>>(__VA_ARGS__)
#define FATHOM_DYNAMIC_SHARED(type, name)                        \
  extern __shared__ __align__(16) unsigned char fathom_dyn_smem[]; \
  type* name = reinterpret_cast<type*>(fathom_dyn_smem)

#else  // host-compiler emulation

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#define FATHOM_CUDA_EMULATION 1

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define FATHOM_UNROLL
// Every thread of a block runs as a fiber on the same OS thread, and concurrently running blocks
// are on different OS threads, so a function-local `static thread_local` is exactly one copy per
// running block. `extern __shared__` becomes `extern static thread_local` and fails to compile.
#define __shared__ static thread_local

// ---------------------------------------------------------------------------------------------
// Vector and index types.
struct uint3 {
  unsigned int x = 0, y = 0, z = 0;
};
struct dim3 {
  unsigned int x = 1, y = 1, z = 1;
  constexpr dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct alignas(8) float2 {
  float x, y;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(16) int4 {
  int x, y, z, w;
};
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }

// Set by the scheduler before it resumes a fiber (all fibers of a block share the OS thread).
inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline thread_local dim3 blockDim;
inline thread_local dim3 gridDim;
constexpr int warpSize = 32;

// ---------------------------------------------------------------------------------------------
// Half and bfloat16: storage types with explicit conversions only (no arithmetic operators:
// kernels convert to float, compute, convert back).
struct __half {
  uint16_t x;
};
struct __nv_bfloat16 {
  uint16_t x;
};

namespace fathom_emu {

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// IEEE binary16, round to nearest even; NaN stays NaN (quiet), overflow -> inf.
inline uint16_t f32_to_f16_bits(float f) {
  const uint32_t u = f32_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // < 2^-25: rounds to 0
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;  // value = mant * 2^(exp-150); half unit is 2^-24
    uint32_t h = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  uint32_t h = ((abs >> 13) - (112u << 10));  // rebias exponent 127 -> 15
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // carry may roll into the exponent
  return static_cast<uint16_t>(sign | h);
}

inline float f16_bits_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    const float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

inline uint16_t f32_to_bf16_bits(float f) {
  const uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

}  // namespace fathom_emu

inline __half __float2half(float f) { return {fathom_emu::f32_to_f16_bits(f)}; }
inline __half __float2half_rn(float f) { return __float2half(f); }
inline float __half2float(__half h) { return fathom_emu::f16_bits_to_f32(h.x); }
inline __nv_bfloat16 __float2bfloat16(float f) { return {fathom_emu::f32_to_bf16_bits(f)}; }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __float2bfloat16(f); }
inline float __bfloat162float(__nv_bfloat16 b) { return fathom_emu::bits_f32(static_cast<uint32_t>(b.x) << 16); }

// ---------------------------------------------------------------------------------------------
// Math: <cmath> supplies expf, logf, sqrtf, fmaxf, fminf, fabsf, tanhf, ... as on the device.
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
// Device min/max of integers (floats use fminf/fmaxf).
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
template <typename T>
inline T __ldg(const T* p) {
  return *p;
}

// ---------------------------------------------------------------------------------------------
// Scheduler: a block's threads are ucontext fibers on one OS thread; blocks are spread over a
// few OS threads. A fiber runs until it reaches a synchronisation point (__syncthreads or a warp
// collective) and then yields to the scheduler, which resumes a warp when all its live lanes wait
// at a warp collective and the block when all its live threads wait at __syncthreads.
namespace fathom_emu {

// Switching fibers. glibc's swapcontext saves and restores the signal mask with a system call
// on every switch (rt_sigprocmask): measured at ~90% of an emulated forward pass. On x86-64 a
// switch is six callee-saved registers and the stack pointer, nothing else (the fibers never
// change MXCSR or the x87 control word, and never take signals of their own).
#if defined(__x86_64__)
// Saves the callee-saved registers on the current stack, stores its pointer in *save_sp,
// switches to new_sp and pops what a previous switch (or fiber_stack) left there.
__attribute__((naked, noinline)) inline void switch_stack(void** /*save_sp*/, void* /*new_sp*/) {
  __asm__ volatile(
      "pushq %rbp\n\tpushq %rbx\n\tpushq %r12\n\tpushq %r13\n\tpushq %r14\n\tpushq %r15\n\t"
      "movq %rsp, (%rdi)\n\tmovq %rsi, %rsp\n\t"
      "popq %r15\n\tpopq %r14\n\tpopq %r13\n\tpopq %r12\n\tpopq %rbx\n\tpopq %rbp\n\tret\n\t");
}
// A new fiber's stack: six zero registers, then `entry` as the return address, placed so that
// `entry` starts with the stack aligned as after a call (rsp ≡ 8 mod 16). entry must not return.
inline void* fiber_stack(char* base, size_t bytes, void (*entry)()) {
  auto top = reinterpret_cast<uintptr_t>(base + bytes) & ~uintptr_t{15};
  auto* sp = reinterpret_cast<void**>(top) - 8;
  for (int i = 0; i < 6; ++i) sp[i] = nullptr;
  sp[6] = reinterpret_cast<void*>(entry);
  sp[7] = nullptr;
  return sp;
}
struct Context {
  void* sp = nullptr;
};
inline void switch_to(Context& from, Context& to) { switch_stack(&from.sp, to.sp); }
#else
struct Context {
  ucontext_t ctx;
};
inline void switch_to(Context& from, Context& to) { swapcontext(&from.ctx, &to.ctx); }
#endif

enum class FiberState { kReady, kWarpSync, kBlockSync, kDone };

struct Fiber {
  Context ctx;
  FiberState state = FiberState::kReady;
  uint3 tid;
};

struct BlockRunner {
  static constexpr size_t kStackBytes = 128 * 1024;
  Context sched_ctx;
  std::vector<Fiber> fibers;
  std::vector<std::unique_ptr<char[]>> stacks;
  std::vector<unsigned char> dyn_smem;  // this block's dynamic shared memory
  const std::function<void()>* body = nullptr;
  int current = 0;
  // Warp exchange: two buffers alternate so a fast lane cannot overwrite a value before every
  // lane of the previous collective has read it.
  std::vector<uint64_t> exchange;  // [n_warps][2][32]
  std::vector<uint32_t> warp_seq;  // per warp: collectives completed

  static void entry();
  void run_block(const std::function<void()>& fn, dim3 block, size_t shmem);
};

inline thread_local BlockRunner* tls_runner = nullptr;

inline void fail(const char* what) {
  std::fprintf(stderr, "cuda_emu: %s\n", what);
  std::abort();
}

// Leaves the current fiber (its state already set): straight to the next ready fiber after it
// when there is one — the order the scheduler's loop would resume them in, with one switch
// instead of two — else back to the scheduler.
inline void leave_fiber(BlockRunner* r) {
  const int me = r->current, n = static_cast<int>(r->fibers.size());
  for (int j = me + 1; j < n; ++j) {
    if (r->fibers[j].state != FiberState::kReady) continue;
    r->current = j;
    threadIdx = r->fibers[j].tid;
    switch_to(r->fibers[me].ctx, r->fibers[j].ctx);
    return;
  }
  switch_to(r->fibers[me].ctx, r->sched_ctx);
}

inline void BlockRunner::entry() {
  BlockRunner* r = tls_runner;
  (*r->body)();
  r->fibers[r->current].state = FiberState::kDone;
  leave_fiber(r);
  fail("a finished fiber was resumed");
}

inline void yield_as(FiberState s) {
  BlockRunner* r = tls_runner;
  if (r == nullptr) fail("synchronisation outside a kernel launch");
  r->fibers[r->current].state = s;
  leave_fiber(r);
}

inline void BlockRunner::run_block(const std::function<void()>& fn, dim3 block, size_t shmem) {
  const int n = static_cast<int>(block.x * block.y * block.z);
  const int n_warps = (n + 31) / 32;
  body = &fn;
  if (stacks.size() < static_cast<size_t>(n)) {
    while (stacks.size() < static_cast<size_t>(n)) stacks.emplace_back(new char[kStackBytes]);
  }
  fibers.assign(n, Fiber{});
  exchange.assign(static_cast<size_t>(n_warps) * 64, 0);
  warp_seq.assign(n_warps, 0);
  dyn_smem.assign(shmem + 16, 0xcd);  // poisoned, as uninitialised shared memory would be
  for (int i = 0; i < n; ++i) {
    Fiber& f = fibers[i];
    f.tid = {static_cast<unsigned>(i % block.x), static_cast<unsigned>((i / block.x) % block.y),
             static_cast<unsigned>(i / (block.x * block.y))};
#if defined(__x86_64__)
    f.ctx.sp = fiber_stack(stacks[i].get(), kStackBytes, &BlockRunner::entry);
#else
    getcontext(&f.ctx.ctx);
    f.ctx.ctx.uc_stack.ss_sp = stacks[i].get();
    f.ctx.ctx.uc_stack.ss_size = kStackBytes;
    f.ctx.ctx.uc_link = nullptr;
    makecontext(&f.ctx.ctx, &BlockRunner::entry, 0);
#endif
  }
  auto resume = [&](int i) {
    current = i;
    threadIdx = fibers[i].tid;
    fibers[i].state = FiberState::kReady;
    switch_to(sched_ctx, fibers[i].ctx);
  };
  for (;;) {
    bool progressed = false, all_done = true;
    // Threads that are ready run first (the start, and lanes released by a warp collective).
    for (int i = 0; i < n; ++i) {
      if (fibers[i].state == FiberState::kReady) {
        resume(i);
        progressed = true;
      }
    }
    // Warps whose live lanes all wait at a collective.
    for (int w = 0; w < n_warps; ++w) {
      const int lo = w * 32, hi = std::min(n, lo + 32);
      bool any = false, all = true;
      for (int i = lo; i < hi; ++i) {
        if (fibers[i].state == FiberState::kWarpSync) any = true;
        else if (fibers[i].state != FiberState::kDone) all = false;
      }
      if (any && all) {
        for (int i = lo; i < hi; ++i) {
          if (fibers[i].state == FiberState::kWarpSync) fibers[i].state = FiberState::kReady;
        }
        ++warp_seq[w];
        progressed = true;
      }
    }
    if (progressed) continue;
    // The block barrier: all live threads at __syncthreads.
    bool any_block = false, all_block = true;
    for (int i = 0; i < n; ++i) {
      if (fibers[i].state != FiberState::kDone) all_done = false;
      if (fibers[i].state == FiberState::kBlockSync) any_block = true;
      else if (fibers[i].state != FiberState::kDone) all_block = false;
    }
    if (all_done) break;
    if (any_block && all_block) {
      for (Fiber& f : fibers) {
        if (f.state == FiberState::kBlockSync) f.state = FiberState::kReady;
      }
      continue;
    }
    fail("deadlock: divergent __syncthreads or a warp collective not reached by every live lane");
  }
}

// Exchange one 64-bit payload per lane through the warp; returns the payload of `src` lane
// (src < 0 or beyond the block: own value).
inline uint64_t warp_exchange(uint64_t mine, int src_lane) {
  BlockRunner* r = tls_runner;
  if (r == nullptr) fail("warp collective outside a kernel launch");
  const int me = r->current, warp = me / 32, lane = me % 32;
  uint64_t* buf = &r->exchange[(static_cast<size_t>(warp) * 2 + (r->warp_seq[warp] & 1u)) * 32];
  buf[lane] = mine;
  yield_as(FiberState::kWarpSync);
  const int src = warp * 32 + src_lane;
  if (src_lane < 0 || src_lane >= 32 || src >= static_cast<int>(r->fibers.size())) return mine;
  // The buffer index was taken before the yield; warp_seq has advanced since.
  return buf[src_lane];
}

inline int lane_id() { return tls_runner->current % 32; }

template <typename T>
inline uint64_t to_payload(T v) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "shuffle payload must be <= 8 bytes");
  uint64_t u = 0;
  std::memcpy(&u, &v, sizeof(T));
  return u;
}
template <typename T>
inline T from_payload(uint64_t u) {
  T v;
  std::memcpy(&v, &u, sizeof(T));
  return v;
}

template <typename Kernel, typename... Args>
void launch(dim3 grid, dim3 block, size_t shmem, Kernel kernel, Args... args) {
  const int threads = static_cast<int>(block.x * block.y * block.z);
  if (threads <= 0 || threads > 1024) fail("block size must be 1..1024 threads");
  const std::function<void()> body = [&] { kernel(args...); };
  const int64_t n_blocks = static_cast<int64_t>(grid.x) * grid.y * grid.z;
  // At least two OS threads whenever there are two blocks, so atomics and shared-memory
  // isolation are exercised by genuinely concurrent blocks.
  const int hw = static_cast<int>(std::max(2u, std::min(4u, std::thread::hardware_concurrency())));
  const int n_workers = static_cast<int>(std::min<int64_t>(hw, n_blocks));
  std::atomic<int64_t> next{0};
  auto worker = [&] {
    BlockRunner runner;
    tls_runner = &runner;
    blockDim = block;
    gridDim = grid;
    for (int64_t b; (b = next.fetch_add(1)) < n_blocks;) {
      blockIdx = {static_cast<unsigned>(b % grid.x), static_cast<unsigned>((b / grid.x) % grid.y),
                  static_cast<unsigned>(b / (static_cast<int64_t>(grid.x) * grid.y))};
      runner.run_block(body, block, shmem);
    }
    tls_runner = nullptr;
  };
  std::vector<std::thread> pool;
  for (int i = 1; i < n_workers; ++i) pool.emplace_back(worker);
  if (n_workers > 0) worker();
  for (std::thread& t : pool) t.join();
}

inline void* dynamic_shared() {
  BlockRunner* r = tls_runner;
  if (r == nullptr) fail("dynamic shared memory outside a kernel launch");
  const uintptr_t p = reinterpret_cast<uintptr_t>(r->dyn_smem.data());
  return reinterpret_cast<void*>((p + 15) & ~uintptr_t{15});
}

}  // namespace fathom_emu

#define FATHOM_DYNAMIC_SHARED(type, name) type* name = reinterpret_cast<type*>(::fathom_emu::dynamic_shared())

inline void __syncthreads() { fathom_emu::yield_as(fathom_emu::FiberState::kBlockSync); }
inline void __syncwarp(unsigned = 0xffffffffu) { fathom_emu::warp_exchange(0, -1); }

// Warp shuffles and votes. `mask` must name every live lane of the warp (the emulator makes all
// live lanes participate); `width` is a power of two <= 32 as on the device.
template <typename T>
inline T __shfl_sync(unsigned, T var, int src_lane, int width = 32) {
  const int lane = fathom_emu::lane_id();
  const int src = (lane & ~(width - 1)) + (src_lane & (width - 1));
  return fathom_emu::from_payload<T>(fathom_emu::warp_exchange(fathom_emu::to_payload(var), src));
}
template <typename T>
inline T __shfl_xor_sync(unsigned, T var, int lane_mask, int width = 32) {
  const int lane = fathom_emu::lane_id();
  int src = lane ^ lane_mask;
  if ((src & ~(width - 1)) != (lane & ~(width - 1))) src = lane;
  return fathom_emu::from_payload<T>(fathom_emu::warp_exchange(fathom_emu::to_payload(var), src));
}
template <typename T>
inline T __shfl_down_sync(unsigned, T var, unsigned delta, int width = 32) {
  const int lane = fathom_emu::lane_id();
  const int src = (lane & (width - 1)) + static_cast<int>(delta) >= width ? lane : lane + static_cast<int>(delta);
  return fathom_emu::from_payload<T>(fathom_emu::warp_exchange(fathom_emu::to_payload(var), src));
}
template <typename T>
inline T __shfl_up_sync(unsigned, T var, unsigned delta, int width = 32) {
  const int lane = fathom_emu::lane_id();
  const int src = (lane & (width - 1)) < static_cast<int>(delta) ? lane : lane - static_cast<int>(delta);
  return fathom_emu::from_payload<T>(fathom_emu::warp_exchange(fathom_emu::to_payload(var), src));
}
inline unsigned __ballot_sync(unsigned, int predicate) {
  // Each lane gathers every lane's predicate through 32 exchanges would be slow; instead every
  // lane publishes its bit and reads the whole warp's buffer after the collective.
  fathom_emu::BlockRunner* r = fathom_emu::tls_runner;
  const int me = r->current, warp = me / 32, lane = me % 32;
  uint64_t* buf = &r->exchange[(static_cast<size_t>(warp) * 2 + (r->warp_seq[warp] & 1u)) * 32];
  buf[lane] = predicate ? 1u : 0u;
  fathom_emu::yield_as(fathom_emu::FiberState::kWarpSync);
  const int live = std::min(32, static_cast<int>(r->fibers.size()) - warp * 32);
  unsigned bits = 0;
  for (int i = 0; i < live; ++i) bits |= static_cast<unsigned>(buf[i] & 1u) << i;
  return bits;
}
inline int __any_sync(unsigned mask, int predicate) { return __ballot_sync(mask, predicate) != 0; }
inline int __all_sync(unsigned mask, int predicate) {
  fathom_emu::BlockRunner* r = fathom_emu::tls_runner;
  const int warp = r->current / 32, live = std::min(32, static_cast<int>(r->fibers.size()) - warp * 32);
  const unsigned full = live == 32 ? 0xffffffffu : ((1u << live) - 1u);
  return __ballot_sync(mask, predicate) == full;
}

// Atomics (device-scope, relaxed as on the device; return the old value).
template <typename T>
inline T atomicAdd(T* address, T val) {
  return std::atomic_ref<T>(*address).fetch_add(val, std::memory_order_relaxed);
}
template <typename T>
inline T atomicMax(T* address, T val) {
  static_assert(std::is_integral_v<T>, "atomicMax: integer types only (as on the device)");
  std::atomic_ref<T> a(*address);
  T old = a.load(std::memory_order_relaxed);
  while (old < val && !a.compare_exchange_weak(old, val, std::memory_order_relaxed)) {
  }
  return old;
}
template <typename T>
inline T atomicMin(T* address, T val) {
  static_assert(std::is_integral_v<T>, "atomicMin: integer types only (as on the device)");
  std::atomic_ref<T> a(*address);
  T old = a.load(std::memory_order_relaxed);
  while (old > val && !a.compare_exchange_weak(old, val, std::memory_order_relaxed)) {
  }
  return old;
}
template <typename T>
inline T atomicExch(T* address, T val) {
  return std::atomic_ref<T>(*address).exchange(val, std::memory_order_relaxed);
}
template <typename T>
inline T atomicCAS(T* address, T compare, T val) {
  std::atomic_ref<T>(*address).compare_exchange_strong(compare, val, std::memory_order_relaxed);
  return compare;
}

// ---------------------------------------------------------------------------------------------
// Runtime API onto host memory. Launches run synchronously, so every stream is always idle.
enum cudaError_t { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorMemoryAllocation = 2 };
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4
};
// A stream. The default stream and streams from cudaStreamCreate run every operation at once (as
// if always idle). A stream created with cudaStreamNonBlocking is *deferred*: its copies and
// memsets wait in a queue until something synchronises with it (cudaStreamSynchronize, an event
// recorded on it being waited for or synchronised, cudaDeviceSynchronize, a kernel launched on
// it, its destruction) — as on a GPU, where a copy on a non-blocking stream runs concurrently with
// the default stream: a reader that does not wait for it sees the old bytes, and the tests see it
// too. Synchronous cudaMemcpy does not wait for non-blocking streams (as on the device).
struct fathom_emu_stream {
  bool deferred = false;
  std::vector<std::function<void()>> pending;
  uint64_t done = 0;  // operations run so far (events mark positions in this count)
  void run_until(uint64_t mark) {
    size_t i = 0;
    for (; i < pending.size() && done < mark; ++i, ++done) pending[i]();
    pending.erase(pending.begin(), pending.begin() + static_cast<std::ptrdiff_t>(i));
  }
  uint64_t enqueued() const { return done + pending.size(); }
};
using cudaStream_t = fathom_emu_stream*;
struct fathom_emu_event {
  cudaStream_t stream = nullptr;
  uint64_t mark = 0;
};
using cudaEvent_t = fathom_emu_event*;
constexpr unsigned cudaStreamDefault = 0, cudaStreamNonBlocking = 1;
constexpr unsigned cudaEventDefault = 0, cudaEventDisableTiming = 2;
constexpr unsigned cudaHostAllocDefault = 0, cudaHostAllocPortable = 1, cudaHostAllocMapped = 2;

namespace fathom_emu {
inline std::mutex& streams_mutex() {
  static std::mutex m;
  return m;
}
inline std::vector<cudaStream_t>& deferred_streams() {
  static std::vector<cudaStream_t> s;
  return s;
}
// How many times the host has waited for the device: synchronous copies to or from the host
// (cudaMemcpy runs after all work queued on the default stream; from pageable memory to the device
// it also waits for that work before staging), cudaFree (it synchronises the device) and stream,
// event and device synchronisations. Tests
// count them: while the host waits it queues nothing, and a GPU drains its queue.
inline std::atomic<uint64_t>& host_waits() {
  static std::atomic<uint64_t> n{0};
  return n;
}
// Runs `s`'s queued operations (no-op for the default stream and immediate streams).
inline void flush_stream(cudaStream_t s) {
  if (s != nullptr) s->run_until(s->enqueued());
}
inline void flush_all_streams() {
  std::vector<cudaStream_t> all;
  {
    std::lock_guard<std::mutex> lock(streams_mutex());
    all = deferred_streams();
  }
  for (cudaStream_t s : all) flush_stream(s);
}
// Runs `op` now, or queues it on a deferred stream.
inline void on_stream(cudaStream_t s, std::function<void()> op) {
  if (s != nullptr && s->deferred) {
    s->pending.push_back(std::move(op));
  } else {
    op();
  }
}
}  // namespace fathom_emu


inline cudaError_t cudaMalloc(void** p, size_t bytes) {
  *p = std::aligned_alloc(256, (bytes + 255) / 256 * 256 + 256);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
template <typename T>
inline cudaError_t cudaMalloc(T** p, size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(p), bytes);
}
inline cudaError_t cudaFree(void* p) {  // synchronises with the device, as cudaFree does
  if (p != nullptr) ++fathom_emu::host_waits();
  fathom_emu::flush_all_streams();
  std::free(p);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyHostToDevice) ++fathom_emu::host_waits();
  if (bytes) std::memmove(dst, src, bytes);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind,
                                   cudaStream_t stream = nullptr) {
  fathom_emu::on_stream(stream, [=] {
    if (bytes) std::memmove(dst, src, bytes);
  });
  return cudaSuccess;
}
inline cudaError_t cudaMemset(void* p, int value, size_t bytes) {
  std::memset(p, value, bytes);
  return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t stream = nullptr) {
  fathom_emu::on_stream(stream, [=] { cudaMemset(p, value, bytes); });
  return cudaSuccess;
}
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
  *s = new fathom_emu_stream;
  (*s)->deferred = (flags & cudaStreamNonBlocking) != 0;
  if ((*s)->deferred) {
    std::lock_guard<std::mutex> lock(fathom_emu::streams_mutex());
    fathom_emu::deferred_streams().push_back(*s);
  }
  return cudaSuccess;
}
inline cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }
inline cudaError_t cudaStreamDestroy(cudaStream_t s) {
  fathom_emu::flush_stream(s);
  {
    std::lock_guard<std::mutex> lock(fathom_emu::streams_mutex());
    auto& all = fathom_emu::deferred_streams();
    all.erase(std::remove(all.begin(), all.end(), s), all.end());
  }
  delete s;
  return cudaSuccess;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  ++fathom_emu::host_waits();
  fathom_emu::flush_stream(s);
  return cudaSuccess;
}
inline cudaError_t cudaDeviceSynchronize() {
  ++fathom_emu::host_waits();
  fathom_emu::flush_all_streams();
  return cudaSuccess;
}
inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) {
  *e = new fathom_emu_event;
  return cudaSuccess;
}
inline cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }
inline cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete e;
  return cudaSuccess;
}
// The event completes when the operations queued on `stream` so far have run.
inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t stream = nullptr) {
  e->stream = stream;
  e->mark = stream != nullptr ? stream->enqueued() : 0;
  return cudaSuccess;
}
inline cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  ++fathom_emu::host_waits();
  if (e->stream != nullptr) e->stream->run_until(e->mark);
  return cudaSuccess;
}
// Later work on `stream` waits for `e`: the event's operations run now (before anything queued
// on `stream` afterwards can run; not a host wait on a GPU).
inline cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t e, unsigned = 0) {
  if (e->stream != nullptr) e->stream->run_until(e->mark);
  return cudaSuccess;
}
// Page-locked host memory; the device reads it in place (the emulated device is the host).
inline cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned) { return cudaMalloc(p, bytes); }
template <typename T>
inline cudaError_t cudaHostAlloc(T** p, size_t bytes, unsigned flags) {
  return cudaHostAlloc(reinterpret_cast<void**>(p), bytes, flags);
}
inline cudaError_t cudaFreeHost(void* p) { return cudaFree(p); }
inline cudaError_t cudaHostGetDevicePointer(void** device, void* host, unsigned) {
  *device = host;
  return cudaSuccess;
}
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
  }
  return "unknown error";
}

// A launch runs at once, after the operations queued on its stream.
#define FATHOM_LAUNCH(kernel, grid, block, shmem_bytes, stream, ...) \
  (::fathom_emu::flush_stream(stream), ::fathom_emu::launch((grid), (block), (shmem_bytes), (kernel), __VA_ARGS__))

#endif  // __CUDACC__
