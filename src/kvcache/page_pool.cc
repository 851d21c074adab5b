// PagePool: a free list of equal pages with a double-free guard.
#include "kvcache/page_pool.h"

#include <limits>
#include <stdexcept>
#include <string>

#include "common/error.h"

namespace dsv4 {

PagePool::PagePool(std::int64_t page_bytes, std::int64_t num_pages)
    : page_bytes_(page_bytes), num_pages_(num_pages) {
  if (page_bytes <= 0 || num_pages < 0 || num_pages > std::numeric_limits<PageId>::max()) {
    fail("page pool: need page_bytes > 0 and 0 <= num_pages <= 2^31-1, found {} and {}", page_bytes, num_pages);
  }
  free_.reserve(static_cast<std::size_t>(num_pages));
  for (std::int64_t p = num_pages - 1; p >= 0; --p) free_.push_back(static_cast<PageId>(p));
  in_use_.assign(static_cast<std::size_t>(num_pages), false);
}

bool PagePool::take(std::int64_t n, std::vector<PageId>& out) {
  if (n > num_free()) return false;
  for (std::int64_t i = 0; i < n; ++i) {
    PageId page = free_.back();
    free_.pop_back();
    in_use_[static_cast<std::size_t>(page)] = true;
    out.push_back(page);
  }
  return true;
}

void PagePool::give(PageId page) {
  if (page < 0 || page >= num_pages_ || !in_use_[static_cast<std::size_t>(page)]) {
    throw std::logic_error("PagePool::give: page " + std::to_string(page) + " is not in use");
  }
  in_use_[static_cast<std::size_t>(page)] = false;
  free_.push_back(page);
}

}  // namespace dsv4
