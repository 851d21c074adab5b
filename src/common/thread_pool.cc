#include "common/thread_pool.h"

#include <stdexcept>
#include <string>

namespace dsv4 {
namespace {

// Set while this thread runs a chunk of some pool's job: nested calls then run inline.
thread_local bool t_inside_job = false;

}  // namespace

ThreadPool::ThreadPool(int num_threads) : size_(num_threads) {
  if (num_threads < 1) {
    throw std::invalid_argument("ThreadPool: need at least 1 thread, got " + std::to_string(num_threads));
  }
  errors_.resize(static_cast<std::size_t>(size_));
  workers_.reserve(static_cast<std::size_t>(size_ - 1));
  for (int w = 1; w < size_; ++w) workers_.emplace_back([this, w] { worker_loop(w); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::run_chunk(int chunk) noexcept {
  const std::int64_t n = end_ - begin_;
  const std::int64_t lo = begin_ + n * chunk / size_;
  const std::int64_t hi = begin_ + n * (chunk + 1) / size_;
  const bool was_inside = t_inside_job;
  t_inside_job = true;
  try {
    for (std::int64_t i = lo; i < hi; ++i) (*fn_)(i);
  } catch (...) {
    errors_[static_cast<std::size_t>(chunk)] = std::current_exception();
  }
  t_inside_job = was_inside;
}

void ThreadPool::worker_loop(int worker) {
  std::uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    run_chunk(worker);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(std::int64_t begin, std::int64_t end, const std::function<void(std::int64_t)>& fn) {
  if (end <= begin) return;
  if (size_ == 1 || t_inside_job || end - begin == 1) {
    for (std::int64_t i = begin; i < end; ++i) fn(i);
    return;
  }
  std::lock_guard<std::mutex> call_lock(call_mutex_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    begin_ = begin;
    end_ = end;
    fn_ = &fn;
    for (std::exception_ptr& e : errors_) e = nullptr;
    pending_ = size_ - 1;
    ++generation_;
  }
  start_cv_.notify_all();
  run_chunk(0);
  {
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, [&] { return pending_ == 0; });
    fn_ = nullptr;
  }
  for (const std::exception_ptr& e : errors_) {
    if (e) std::rethrow_exception(e);
  }
}

void parallel_for(ThreadPool* pool, std::int64_t begin, std::int64_t end, const std::function<void(std::int64_t)>& fn) {
  if (pool == nullptr) {
    for (std::int64_t i = begin; i < end; ++i) fn(i);
    return;
  }
  pool->parallel_for(begin, end, fn);
}

}  // namespace dsv4
