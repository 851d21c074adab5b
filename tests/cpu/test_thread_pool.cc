// ThreadPool: static contiguous partition, results independent of the thread count, inline
// execution for size 1 and nested calls, exceptions carried back to the caller.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "common/thread_pool.h"

namespace dsv4 {
namespace {

TEST(ThreadPool, EveryIndexOnceAndSameResultForAnySize) {
  std::vector<double> reference;
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    std::vector<int> hits(1000, 0);
    std::vector<double> values(1000);
    pool.parallel_for(0, 1000, [&](std::int64_t i) {
      hits[static_cast<std::size_t>(i)] += 1;
      double v = 0;
      for (int k = 0; k <= i; ++k) v += 1.0 / (k + 1);
      values[static_cast<std::size_t>(i)] = v;
    });
    for (int h : hits) EXPECT_EQ(h, 1);
    if (reference.empty()) reference = values;
    EXPECT_EQ(values, reference);
  }
}

TEST(ThreadPool, OffsetRangesAndEmptyRanges) {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> hits(20);
  pool.parallel_for(5, 17, [&](std::int64_t i) { hits[static_cast<std::size_t>(i)]++; });
  for (int i = 0; i < 20; ++i) EXPECT_EQ(hits[static_cast<std::size_t>(i)].load(), (i >= 5 && i < 17) ? 1 : 0) << i;
  int calls = 0;
  pool.parallel_for(4, 4, [&](std::int64_t) { ++calls; });
  pool.parallel_for(4, 2, [&](std::int64_t) { ++calls; });
  EXPECT_EQ(calls, 0);
}

TEST(ThreadPool, ContiguousChunksOnDistinctThreads) {
  ThreadPool pool(4);
  std::vector<std::thread::id> who(8);
  pool.parallel_for(0, 8, [&](std::int64_t i) { who[static_cast<std::size_t>(i)] = std::this_thread::get_id(); });
  // chunk w = [2w, 2w+2): pairs share a thread, chunk 0 runs on the caller.
  EXPECT_EQ(who[0], std::this_thread::get_id());
  std::set<std::thread::id> distinct;
  for (int c = 0; c < 4; ++c) {
    EXPECT_EQ(who[static_cast<std::size_t>(2 * c)], who[static_cast<std::size_t>(2 * c + 1)]);
    distinct.insert(who[static_cast<std::size_t>(2 * c)]);
  }
  EXPECT_EQ(distinct.size(), 4u);
}

TEST(ThreadPool, SizeOneRunsInline) {
  ThreadPool pool(1);
  std::vector<std::thread::id> who(5);
  pool.parallel_for(0, 5, [&](std::int64_t i) { who[static_cast<std::size_t>(i)] = std::this_thread::get_id(); });
  for (const auto& id : who) EXPECT_EQ(id, std::this_thread::get_id());
}

TEST(ThreadPool, NestedCallsRunInline) {
  ThreadPool pool(2);
  std::vector<std::atomic<int>> hits(16);
  pool.parallel_for(0, 4, [&](std::int64_t i) {
    pool.parallel_for(0, 4, [&](std::int64_t j) { hits[static_cast<std::size_t>(i * 4 + j)]++; });
  });
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
}

TEST(ThreadPool, ExceptionsReachTheCaller) {
  ThreadPool pool(3);
  EXPECT_THROW(pool.parallel_for(0, 30,
                                 [](std::int64_t i) {
                                   if (i == 25) throw std::runtime_error("boom");
                                 }),
               std::runtime_error);
  // The pool still works afterwards.
  std::atomic<int> n{0};
  pool.parallel_for(0, 30, [&](std::int64_t) { n++; });
  EXPECT_EQ(n.load(), 30);
  EXPECT_THROW(ThreadPool(0), std::invalid_argument);
}

TEST(ThreadPool, NullPoolHelperLoops) {
  std::vector<int> hits(7, 0);
  parallel_for(nullptr, 0, 7, [&](std::int64_t i) { hits[static_cast<std::size_t>(i)]++; });
  for (int h : hits) EXPECT_EQ(h, 1);
}

}  // namespace
}  // namespace dsv4
