// PageTable: an executor's own copy of which page holds layer slot s of block b of each cache
// group, kept current from the PageTableChanges every StepPlan carries. The CPU executor reads
// pages through it; the GPU executor keeps the same table in device memory and applies the same
// changes there. Sized once for the most blocks each group can hold (BlockPool::max_blocks).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kvcache/block_pool.h"
#include "kvcache/cache_spec.h"

namespace dsv4 {

class PageTable {
 public:
  PageTable() = default;
  // pages_per_bucket[i] pages of spec.buckets[i] bytes, as the KV cache manager was built.
  PageTable(const CacheSpec& spec, std::span<const std::int64_t> pages_per_bucket);

  // Records the pages of the changed blocks; throws std::logic_error on a block or page outside
  // the table's bounds (a plan built for another cache).
  void apply(const PageTableChanges& changes);

  // The page of layer slot `layer_slot` of `block` in group `group`; throws std::logic_error for
  // a block that was never given pages.
  PageId page(int group, BlockId block, std::int64_t layer_slot) const;

  std::int64_t max_blocks(int group) const { return max_blocks_[static_cast<std::size_t>(group)]; }
  std::int64_t layers(int group) const { return layers_[static_cast<std::size_t>(group)]; }
  // Group g's table, [max_blocks(g) * layers(g)], -1 where no block was given pages.
  std::span<const PageId> table(int group) const { return tables_[static_cast<std::size_t>(group)]; }

 private:
  std::vector<std::int64_t> max_blocks_, layers_, bucket_pages_;
  std::vector<int> bucket_;
  std::vector<std::vector<PageId>> tables_;
};

}  // namespace dsv4
