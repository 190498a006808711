#include "kernels/cpu/thread_pool.h"

#include <algorithm>

#if defined(__x86_64__)
#include <immintrin.h>
#define FATHOM_PAUSE() _mm_pause()
#else
#define FATHOM_PAUSE() ((void)0)
#endif

namespace fathom {
namespace {
constexpr int kSpinIterations = 20000;  // ~ a hundred microseconds before sleeping
}

void spin_turn(int turn) {
  FATHOM_PAUSE();
  if (turn % 64 == 0) std::this_thread::yield();
}

ThreadPool::ThreadPool(int threads) : threads_(std::max(1, threads)), shares_(new Share[std::max(1, threads)]) {
  for (int i = 1; i < threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::ThreadPool(Serial, int threads) : threads_(std::max(1, threads)), serial_(true) {}  // no shares: never handed out

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_.store(true);
    generation_.fetch_add(1);
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    int spins = 0;
    // Spin for the next job, yielding now and then: when more threads are runnable than there
    // are cores, a pure spin keeps the caller (which holds the job's first range) off the CPU.
    while (generation_.load(std::memory_order_acquire) == seen && spins < kSpinIterations) spin_turn(++spins);
    if (generation_.load(std::memory_order_acquire) == seen) {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return generation_.load() != seen; });
    }
    seen = generation_.load(std::memory_order_acquire);
    if (stop_.load()) return;
    (*job_)(index, threads_);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::run_on_all(const std::function<void(int, int)>& fn) {
  if (serial_) {
    for (int t = 0; t < threads_; ++t) fn(t, threads_);
    return;
  }
  if (threads_ == 1) {
    fn(0, 1);
    return;
  }
  job_ = &fn;
  pending_.store(threads_ - 1, std::memory_order_release);
  {
    // Taking the lock orders the generation bump with sleepers' predicate check.
    std::lock_guard<std::mutex> lock(mutex_);
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  wake_.notify_all();
  fn(0, threads_);
  // Spin first (the usual case: workers finish within microseconds); yield when the wait is
  // long, e.g. when more threads than cores are runnable and a worker has been descheduled.
  for (int turn = 1; pending_.load(std::memory_order_acquire) != 0; ++turn) spin_turn(turn);
  job_ = nullptr;
}

void ThreadPool::for_each_chunk(int64_t chunks, const std::function<void(int64_t, int)>& fn) {
  if (chunks <= 0) return;
  if (serial_) {  // each thread's share in turn, as the real pool would first hand them out
    if (chunks == 1) {
      fn(0, 0);
      return;
    }
    for (int t = 0; t < threads_; ++t)
      for (int64_t c = chunks * t / threads_; c < chunks * (t + 1) / threads_; ++c) fn(c, t);
    return;
  }
  if (threads_ == 1 || chunks == 1) {
    for (int64_t c = 0; c < chunks; ++c) fn(c, 0);
    return;
  }
  for (int t = 0; t < threads_; ++t) {
    shares_[t].next.store(chunks * t / threads_, std::memory_order_relaxed);
    shares_[t].end = chunks * (t + 1) / threads_;
  }
  run_on_all([&](int t, int n) {
    for (int i = 0; i < n; ++i) {
      Share& s = shares_[(t + i) % n];
      for (int64_t c; (c = s.next.fetch_add(1, std::memory_order_relaxed)) < s.end;) fn(c, t);
    }
  });
}

void ThreadPool::parallel_for(int64_t n, const RangeFn& fn, int64_t grain) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t chunks = (n + grain - 1) / grain;
  const int64_t pieces = std::min<int64_t>(chunks, 4 * static_cast<int64_t>(threads_));
  if (threads_ == 1 || pieces == 1) {
    fn(0, n, 0);
    return;
  }
  for_each_chunk(pieces, [&](int64_t p, int t) {
    const int64_t b = chunks * p / pieces * grain, e = std::min(n, chunks * (p + 1) / pieces * grain);
    if (b < e) fn(b, e, t);
  });
}

}  // namespace fathom
