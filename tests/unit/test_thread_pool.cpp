// ThreadPool: parallel_for covers its range once in grain-aligned ranges; for_each_chunk runs every chunk exactly once
// for any thread and chunk count, and a thread that stalls has its share taken by the others.
#include "kernels/cpu/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
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
