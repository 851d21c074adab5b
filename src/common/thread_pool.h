// A small fixed-size thread pool for the CPU reference ops (src/cpu/).
//
// parallel_for(begin, end, fn) splits [begin, end) into size() contiguous chunks of (almost)
// equal length -- chunk w is [begin + n*w/size, begin + n*(w+1)/size) -- runs chunk 0 on the
// calling thread and the others on the workers, and returns when all are done. The partition
// depends only on the range and size(), and callers compute every index independently (no
// shared reductions), so results never depend on the thread count or on timing.
// A pool of size 1 has no worker threads and runs everything inline. A parallel_for called
// from inside a running one (nested) runs inline too, so nesting cannot deadlock. Calls from
// different outside threads are serialized. The first exception thrown by fn (lowest chunk
// wins) is rethrown on the caller after all chunks finished.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace dsv4 {

class ThreadPool {
 public:
  // num_threads >= 1 (throws std::invalid_argument otherwise); includes the calling thread.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return size_; }

  // fn(i) for every i in [begin, end); nothing when end <= begin.
  void parallel_for(std::int64_t begin, std::int64_t end, const std::function<void(std::int64_t)>& fn);

 private:
  void worker_loop(int worker);
  void run_chunk(int chunk) noexcept;

  int size_;
  std::vector<std::thread> workers_;
  std::mutex call_mutex_;  // one parallel_for at a time

  std::mutex mutex_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  std::uint64_t generation_ = 0;  // bumped for every job
  int pending_ = 0;               // worker chunks not finished yet
  bool stop_ = false;

  // The current job (valid while pending_ > 0 or the caller runs chunk 0).
  std::int64_t begin_ = 0;
  std::int64_t end_ = 0;
  const std::function<void(std::int64_t)>* fn_ = nullptr;
  std::vector<std::exception_ptr> errors_;  // one slot per chunk
};

// pool->parallel_for(...), or a plain loop when pool is null.
void parallel_for(ThreadPool* pool, std::int64_t begin, std::int64_t end, const std::function<void(std::int64_t)>& fn);

}  // namespace dsv4
