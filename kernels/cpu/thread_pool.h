#pragma once
// A fixed pool of worker threads for data-parallel kernels.
// The calling thread works too (it is thread 0). Work is handed out from per-thread shares
// (for_each_chunk; parallel_for is built on it). Workers spin briefly between jobs (decode
// issues hundreds of small jobs per token, so a condition-variable wake-up per job would cost
// more than the job), then sleep on a condition variable when idle.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace fathom {

class ThreadPool {
 public:
  // fn(begin, end, thread_index) covers [begin, end) of the range.
  using RangeFn = std::function<void(int64_t begin, int64_t end, int thread)>;

  explicit ThreadPool(int threads);
  // A stand-in with no workers that reports `threads` as its size and runs every job on the
  // calling thread: each share of for_each_chunk in turn (thread t's chunks with index t), each
  // thread of run_on_all in turn. Kernels split their work as on a real pool of that size, and
  // since no kernel's output depends on which thread runs a chunk or in what order (each merges
  // per-chunk partials in chunk order), their results are bitwise the real pool's. For running
  // small jobs side by side, one on each thread of a real pool (CpuBackend::attend_decodes).
  // Jobs must not wait for each other's progress (a run_on_all barrier would never open).
  struct Serial {};
  ThreadPool(Serial, int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return threads_; }
  // Covers [0, n) with fn over disjoint ranges whose boundaries are multiples of `grain` (except
  // the end): up to 4 ranges per thread, handed out as for_each_chunk does, so a thread that is
  // descheduled for a while holds up at most its current range. fn may run several times on
  // the same thread (accumulate per-thread results, do not overwrite them). Blocks until every
  // range is done. Not reentrant.
  void parallel_for(int64_t n, const RangeFn& fn, int64_t grain = 1);
  // Runs fn(thread_index, size()) once on every thread.
  void run_on_all(const std::function<void(int thread, int threads)>& fn);
  // Runs fn(c, thread index) for every c in [0, chunks), each exactly once. Thread t first takes
  // the chunks of its own contiguous share in order (a counter only it touches until it runs
  // dry: no cache line bouncing between cores per chunk, and consecutive chunks keep the
  // hardware prefetcher streaming), then helps the others by taking chunks from their shares.
  // Blocks until done.
  void for_each_chunk(int64_t chunks, const std::function<void(int64_t chunk, int thread)>& fn);

 private:
  void worker_loop(int index);

  // One thread's share of a for_each_chunk: [next, end), on its own cache line.
  struct alignas(64) Share {
    std::atomic<int64_t> next{0};
    int64_t end = 0;
  };

  int threads_;
  bool serial_ = false;  // the Serial stand-in
  std::vector<std::thread> workers_;
  std::unique_ptr<Share[]> shares_;
  const std::function<void(int, int)>* job_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  std::condition_variable wake_;
};

// One turn of a spin-wait (`turn` counts from 1): a pause, and every 64th turn a yield — when more
// threads are runnable than there are cores, a pure spin keeps the thread being waited for off the
// CPU.
void spin_turn(int turn);

// Per-group countdowns for "the thread that runs a group's last chunk finishes the group" (inside
// for_each_chunk): arrive(g) is true for exactly one call per group, the last, and its acq_rel
// decrement makes the writes of the group's earlier chunks, from any thread, visible to it.
class LastArrival {
 public:
  template <typename CountOf>  // count_of(g): chunks in group g
  LastArrival(size_t groups, CountOf count_of) : left_(new std::atomic<int32_t>[groups]) {
    for (size_t g = 0; g < groups; ++g) left_[g].store(static_cast<int32_t>(count_of(g)), std::memory_order_relaxed);
  }
  bool arrive(size_t g) { return left_[g].fetch_sub(1, std::memory_order_acq_rel) == 1; }

 private:
  std::unique_ptr<std::atomic<int32_t>[]> left_;
};

}  // namespace fathom
