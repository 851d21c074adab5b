// A shared allowance of bytes (the request bodies the server holds at once), taken in leases.
// A lease gives its bytes back when it is destroyed or reset; take() never blocks: it either
// fits now or returns an empty lease, so the caller can refuse at once (503) instead of queueing.
#pragma once

#include <atomic>
#include <cstddef>
#include <utility>

namespace dsv4::server {

class ByteBudget {
 public:
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& other) noexcept
        : budget_(std::exchange(other.budget_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
    Lease& operator=(Lease&& other) noexcept {
      if (this != &other) {
        reset();
        budget_ = std::exchange(other.budget_, nullptr);
        bytes_ = std::exchange(other.bytes_, 0);
      }
      return *this;
    }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() { reset(); }

    explicit operator bool() const { return budget_ != nullptr; }
    std::size_t bytes() const { return bytes_; }
    void reset() {
      if (budget_ != nullptr) budget_->used_.fetch_sub(bytes_);
      budget_ = nullptr;
      bytes_ = 0;
    }

   private:
    friend class ByteBudget;
    Lease(ByteBudget* budget, std::size_t bytes) : budget_(budget), bytes_(bytes) {}
    ByteBudget* budget_ = nullptr;
    std::size_t bytes_ = 0;
  };

  explicit ByteBudget(std::size_t limit) : limit_(limit) {}
  ByteBudget(const ByteBudget&) = delete;
  ByteBudget& operator=(const ByteBudget&) = delete;

  // `bytes` of the allowance, or an empty lease when they do not fit beside the leases held now.
  // (A lease of 0 bytes is still a lease: it always fits.)
  Lease take(std::size_t bytes) {
    std::size_t used = used_.load();
    do {
      if (bytes > limit_ || used > limit_ - bytes) return {};
    } while (!used_.compare_exchange_weak(used, used + bytes));
    return Lease(this, bytes);
  }

  std::size_t limit() const { return limit_; }
  std::size_t used() const { return used_.load(); }

 private:
  std::size_t limit_;
  std::atomic<std::size_t> used_{0};
};

}  // namespace dsv4::server
