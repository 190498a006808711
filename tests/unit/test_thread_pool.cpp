// ThreadPool: parallel_for covers its range once in grain-aligned ranges; for_each_chunk runs every chunk exactly once
// for any thread and chunk count, and a thread that stalls has its share taken by the others; the
// Serial stand-in runs the same shares and ranges on the calling thread.
#include "kernels/cpu/thread_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <chrono>
#include <thread>
#include <utility>
#include <vector>

namespace fathom {
namespace {

TEST(ThreadPool, ParallelForCoversTheRangeOnce) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    for (int64_t n : {1, 2, 7, 64, 1000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      std::atomic<bool> ok{true};
      pool.parallel_for(
          n, [&](int64_t b, int64_t e, int t) {
            if (b % 3 != 0 || (e % 3 != 0 && e != n) || t < 0 || t >= threads) ok = false;  // grain, thread index
            for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
          },
          3);
      EXPECT_TRUE(ok.load()) << threads << " threads, n " << n;
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[static_cast<size_t>(i)].load(), 1) << threads << " " << n << " " << i;
    }
  }
}

TEST(ThreadPool, ForEachChunkRunsEveryChunkExactlyOnce) {
  for (int threads : {1, 2, 3, 4, 7}) {
    ThreadPool pool(threads);
    for (int64_t chunks : {0, 1, 2, 3, 6, 7, 100, 1001}) {
      for (int rep = 0; rep < 20; ++rep) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(chunks));
        pool.for_each_chunk(chunks, [&](int64_t c, int) { hits[static_cast<size_t>(c)].fetch_add(1); });
        for (int64_t c = 0; c < chunks; ++c)
          ASSERT_EQ(hits[static_cast<size_t>(c)].load(), 1) << threads << " threads, " << chunks << " chunks, chunk " << c;
      }
    }
  }
}

// The Serial stand-in runs every chunk once, on the calling thread, in order, each with the
// index of the thread whose share holds it (chunk c of n on t threads: t·n/threads ≤ c); run_on_all
// runs fn(t, threads) for every t; parallel_for gives the pool's ranges.
TEST(ThreadPool, SerialStandInRunsEveryShareOnTheCaller) {
  const std::thread::id caller = std::this_thread::get_id();
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool serial(ThreadPool::Serial{}, threads), pool(threads);
    EXPECT_EQ(serial.size(), threads);
    for (int64_t chunks : {0, 1, 2, 7, 100}) {
      std::vector<int64_t> seen;
      serial.for_each_chunk(chunks, [&](int64_t c, int t) {
        EXPECT_EQ(std::this_thread::get_id(), caller);
        EXPECT_TRUE(chunks == 1 ? t == 0 : chunks * t / threads <= c && c < chunks * (t + 1) / threads)
            << threads << " threads, chunk " << c << " of " << chunks << " on thread " << t;
        seen.push_back(c);
      });
      ASSERT_EQ(static_cast<int64_t>(seen.size()), chunks);
      for (int64_t c = 0; c < chunks; ++c) EXPECT_EQ(seen[static_cast<size_t>(c)], c);
      // The same ranges as the real pool's parallel_for.
      std::vector<std::pair<int64_t, int64_t>> ranges_serial, ranges_pool;
      std::mutex m;
      serial.parallel_for(chunks, [&](int64_t b, int64_t e, int) { ranges_serial.emplace_back(b, e); }, 3);
      pool.parallel_for(chunks, [&](int64_t b, int64_t e, int) {
        std::lock_guard<std::mutex> lock(m);
        ranges_pool.emplace_back(b, e);
      }, 3);
      std::sort(ranges_pool.begin(), ranges_pool.end());
      EXPECT_EQ(ranges_serial, ranges_pool) << threads << " threads, n " << chunks;
    }
    std::vector<int> ran;
    serial.run_on_all([&](int t, int n) {
      EXPECT_EQ(n, threads);
      EXPECT_EQ(std::this_thread::get_id(), caller);
      ran.push_back(t);
    });
    std::vector<int> all(threads);
    for (int t = 0; t < threads; ++t) all[t] = t;
    EXPECT_EQ(ran, all);
  }
}

// The calling thread owns the first share; it stalls on its first chunk, so the worker finishes
// its own share and must take the caller's remaining chunks.
TEST(ThreadPool, ForEachChunkStealsFromAStalledThread) {
  ThreadPool pool(2);
  const int64_t chunks = 40;
  const std::thread::id caller = std::this_thread::get_id();
  std::vector<std::atomic<int>> by_worker(chunks);
  std::atomic<int> total{0};
  pool.for_each_chunk(chunks, [&](int64_t c, int) {
    if (c == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (std::this_thread::get_id() != caller) by_worker[static_cast<size_t>(c)].store(1);
    total.fetch_add(1);
  });
  EXPECT_EQ(total.load(), chunks);
  int stolen = 0;
  for (int64_t c = 1; c < chunks / 2; ++c) stolen += by_worker[static_cast<size_t>(c)].load();
  EXPECT_GT(stolen, chunks / 4) << "the worker should have taken most of the stalled caller's share";
}

}  // namespace
}  // namespace fathom
