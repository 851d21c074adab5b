// PageTable: the executors' copy of the block -> page map (page_table.h).
#include "executor/page_table.h"

#include <fmt/format.h>

#include <stdexcept>

namespace dsv4 {

PageTable::PageTable(const CacheSpec& spec, std::span<const std::int64_t> pages_per_bucket) {
  if (pages_per_bucket.size() != spec.buckets.size()) {
    throw std::logic_error(fmt::format("page table: {} page counts for {} buckets", pages_per_bucket.size(), spec.buckets.size()));
  }
  for (const CacheGroup& g : spec.groups) {
    const std::int64_t pages = pages_per_bucket[static_cast<std::size_t>(g.bucket)];
    const std::int64_t blocks = g.num_layers() == 0 ? 0 : pages / g.num_layers();
    max_blocks_.push_back(blocks);
    layers_.push_back(g.num_layers());
    bucket_.push_back(g.bucket);
    bucket_pages_.push_back(pages);
    tables_.emplace_back(static_cast<std::size_t>(blocks * g.num_layers()), PageId{-1});
  }
}

void PageTable::apply(const PageTableChanges& changes) {
  if (changes.groups.size() != tables_.size()) {
    throw std::logic_error(fmt::format("page table: changes for {} groups, the table has {}", changes.groups.size(), tables_.size()));
  }
  for (std::size_t g = 0; g < tables_.size(); ++g) {
    const PageTableChanges::Group& c = changes.groups[g];
    const auto layers = static_cast<std::size_t>(layers_[g]);
    if (c.pages.size() != c.blocks.size() * layers) throw std::logic_error("page table: pages do not match the blocks");
    for (std::size_t i = 0; i < c.blocks.size(); ++i) {
      const BlockId b = c.blocks[i];
      if (b < 0 || b >= max_blocks_[g]) throw std::logic_error(fmt::format("page table: block {} outside [0, {})", b, max_blocks_[g]));
      for (std::size_t s = 0; s < layers; ++s) {
        const PageId p = c.pages[i * layers + s];
        if (p < 0 || p >= bucket_pages_[g]) throw std::logic_error(fmt::format("page table: page {} outside [0, {})", p, bucket_pages_[g]));
        tables_[g][static_cast<std::size_t>(b) * layers + s] = p;
      }
    }
  }
}

PageId PageTable::page(int group, BlockId block, std::int64_t layer_slot) const {
  const auto g = static_cast<std::size_t>(group);
  if (block < 0 || block >= max_blocks_[g] || layer_slot < 0 || layer_slot >= layers_[g]) {
    throw std::logic_error(fmt::format("page table: no block {} layer slot {} in group {}", block, layer_slot, group));
  }
  const PageId p = tables_[g][static_cast<std::size_t>(block * layers_[g] + layer_slot)];
  if (p < 0) throw std::logic_error(fmt::format("page table: block {} of group {} was never given pages", block, group));
  return p;
}

}  // namespace dsv4
