// BlockPool: block ids per cache group over the shared bucket page pools.
#include "kvcache/block_pool.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "common/error.h"

namespace dsv4 {

BlockPool::BlockPool(const CacheSpec& spec, const std::vector<std::int64_t>& pages_per_bucket) {
  if (pages_per_bucket.size() != spec.buckets.size()) {
    fail("block pool: {} page counts given for {} buckets", pages_per_bucket.size(), spec.buckets.size());
  }
  for (std::size_t i = 0; i < spec.buckets.size(); ++i) pools_.emplace_back(spec.buckets[i], pages_per_bucket[i]);
  for (const CacheGroup& g : spec.groups) {
    GroupBlocks blocks;
    blocks.bucket = g.bucket;
    blocks.layers = g.num_layers();
    groups_.push_back(std::move(blocks));
  }
  allocated_since_.resize(groups_.size());
}

BlockId BlockPool::allocate(int group) {
  GroupBlocks& g = groups_.at(static_cast<std::size_t>(group));
  scratch_.clear();
  if (!pools_[static_cast<std::size_t>(g.bucket)].take(g.layers, scratch_)) return kNoBlock;
  BlockId id;
  if (!g.free_ids.empty()) {
    id = g.free_ids.back();
    g.free_ids.pop_back();
  } else {
    id = static_cast<BlockId>(g.refs.size());
    g.refs.push_back(0);
    g.pages.resize(g.pages.size() + static_cast<std::size_t>(g.layers));
  }
  std::copy(scratch_.begin(), scratch_.end(), g.pages.begin() + static_cast<std::ptrdiff_t>(id * g.layers));
  g.refs[static_cast<std::size_t>(id)] = 1;
  ++g.live;
  allocated_since_[static_cast<std::size_t>(group)].push_back(id);
  return id;
}

BlockPool::GroupBlocks& BlockPool::checked(int group, BlockId block) {
  GroupBlocks& g = groups_.at(static_cast<std::size_t>(group));
  if (block < 0 || static_cast<std::size_t>(block) >= g.refs.size() || g.refs[static_cast<std::size_t>(block)] <= 0) {
    throw std::logic_error("BlockPool: group " + std::to_string(group) + " block " + std::to_string(block) +
                           " is not allocated");
  }
  return g;
}

const BlockPool::GroupBlocks& BlockPool::checked(int group, BlockId block) const {
  return const_cast<BlockPool*>(this)->checked(group, block);
}

void BlockPool::incref(int group, BlockId block) { ++checked(group, block).refs[static_cast<std::size_t>(block)]; }

void BlockPool::decref(int group, BlockId block) {
  GroupBlocks& g = checked(group, block);
  if (--g.refs[static_cast<std::size_t>(block)] > 0) return;
  PagePool& pool = pools_[static_cast<std::size_t>(g.bucket)];
  for (std::int64_t s = 0; s < g.layers; ++s) pool.give(g.pages[static_cast<std::size_t>(block * g.layers + s)]);
  g.free_ids.push_back(block);
  --g.live;
}

std::int32_t BlockPool::ref_count(int group, BlockId block) const {
  const GroupBlocks& g = groups_.at(static_cast<std::size_t>(group));
  if (block < 0 || static_cast<std::size_t>(block) >= g.refs.size()) return 0;
  return g.refs[static_cast<std::size_t>(block)];
}

std::span<const PageId> BlockPool::block_pages(int group, BlockId block) const {
  const GroupBlocks& g = checked(group, block);
  return {g.pages.data() + block * g.layers, static_cast<std::size_t>(g.layers)};
}

BlockId BlockPool::block_id_bound(int group) const {
  return static_cast<BlockId>(groups_.at(static_cast<std::size_t>(group)).refs.size());
}

std::int64_t BlockPool::max_blocks(int group) const {
  const GroupBlocks& g = groups_.at(static_cast<std::size_t>(group));
  return g.layers == 0 ? 0 : pools_[static_cast<std::size_t>(g.bucket)].num_pages() / g.layers;
}

PageTableChanges BlockPool::take_changes() {
  PageTableChanges changes;
  changes.groups.resize(groups_.size());
  for (std::size_t gi = 0; gi < groups_.size(); ++gi) {
    std::vector<BlockId>& ids = allocated_since_[gi];
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    const GroupBlocks& g = groups_[gi];
    PageTableChanges::Group& out = changes.groups[gi];
    for (BlockId id : ids) {
      if (g.refs[static_cast<std::size_t>(id)] <= 0) continue;  // allocated and freed again
      out.blocks.push_back(id);
      const auto first = g.pages.begin() + static_cast<std::ptrdiff_t>(id * g.layers);
      out.pages.insert(out.pages.end(), first, first + static_cast<std::ptrdiff_t>(g.layers));
    }
    ids.clear();
  }
  return changes;
}

}  // namespace dsv4
