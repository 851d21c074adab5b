// PagePool: the equal-sized pages of one bucket (cache_spec.h). Every cache kind whose
// pages have this size draws from the same pool, so memory freed by one kind serves any
// other: there is no per-kind pool and no fragmentation across pools. Page p of a pool
// lives at byte offset p * page_bytes of the bucket's memory; this class only counts.
#pragma once

#include <cstdint>
#include <vector>

namespace dsv4 {

using PageId = std::int32_t;

class PagePool {
 public:
  PagePool(std::int64_t page_bytes, std::int64_t num_pages);

  std::int64_t page_bytes() const { return page_bytes_; }
  std::int64_t num_pages() const { return num_pages_; }
  std::int64_t num_free() const { return static_cast<std::int64_t>(free_.size()); }
  std::int64_t num_used() const { return num_pages_ - num_free(); }

  // Takes `n` pages; all or nothing (returns false and takes none when fewer are free).
  bool take(std::int64_t n, std::vector<PageId>& out);
  void give(PageId page);  // returns a page taken earlier
  bool is_free(PageId page) const { return !in_use_[static_cast<std::size_t>(page)]; }

 private:
  std::int64_t page_bytes_;
  std::int64_t num_pages_;
  std::vector<PageId> free_;  // a stack: the most recently freed page is reused first
  std::vector<bool> in_use_;
};

}  // namespace dsv4
