// BlockPool: the blocks that block tables and the prefix cache point at.
//
// A block of cache group g (cache_spec.h) covers `positions_per_block` consecutive positions
// of one request and holds one page per layer of g, all taken from g's bucket pool. Layers of
// a kind therefore share block ids (a request has one block table per group, not per layer);
// the page of layer slot s of block b is block_pages(g, b)[s]. Blocks are reference counted:
// each block-table entry and each prefix-cache entry that names a block holds one reference,
// and the block's pages go back to their pool when the count drops to zero.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kvcache/cache_spec.h"
#include "kvcache/page_pool.h"

namespace dsv4 {

using BlockId = std::int32_t;
inline constexpr BlockId kNoBlock = -1;

// The pages of the blocks allocated since the last BlockPool::take_changes(): what an
// executor's own copy of the page table (page of layer slot s of block b of group g) needs to
// stay current. Plans name a block only while it is allocated, so freed blocks need no entry.
struct PageTableChanges {
  struct Group {
    std::vector<BlockId> blocks;  // ascending, each once
    std::vector<PageId> pages;    // [blocks.size() * layers]: block i's pages at [i * layers, (i + 1) * layers)
  };
  std::vector<Group> groups;      // one per cache group (CacheSpec order)

  bool empty() const {
    for (const Group& g : groups)
      if (!g.blocks.empty()) return false;
    return true;
  }
};

class BlockPool {
 public:
  // `pages_per_bucket[i]` pages of size spec.buckets[i].
  BlockPool(const CacheSpec& spec, const std::vector<std::int64_t>& pages_per_bucket);

  int num_buckets() const { return static_cast<int>(pools_.size()); }
  const PagePool& pool(int bucket) const { return pools_[static_cast<std::size_t>(bucket)]; }
  int bucket_of(int group) const { return groups_[static_cast<std::size_t>(group)].bucket; }
  std::int64_t pages_per_block(int group) const { return groups_[static_cast<std::size_t>(group)].layers; }

  // A new block with one reference, or kNoBlock when its bucket lacks the pages.
  BlockId allocate(int group);
  void incref(int group, BlockId block);
  void decref(int group, BlockId block);  // frees the block and its pages at zero
  std::int32_t ref_count(int group, BlockId block) const;  // 0 for a free id
  std::span<const PageId> block_pages(int group, BlockId block) const;
  std::int64_t live_blocks(int group) const { return groups_[static_cast<std::size_t>(group)].live; }
  BlockId block_id_bound(int group) const;  // every id ever handed out is below this
  // The most blocks group g can ever hold at once (its bucket's pages / pages per block): an
  // upper bound of block_id_bound, for sizing page tables.
  std::int64_t max_blocks(int group) const;

  // The blocks allocated since the previous call that are still allocated, with their pages.
  PageTableChanges take_changes();

 private:
  struct GroupBlocks {
    int bucket = 0;
    std::int64_t layers = 0;
    std::vector<PageId> pages;          // block b's pages at [b * layers, (b + 1) * layers)
    std::vector<std::int32_t> refs;     // per block id; 0 = free id
    std::vector<BlockId> free_ids;
    std::int64_t live = 0;
  };
  GroupBlocks& checked(int group, BlockId block);
  const GroupBlocks& checked(int group, BlockId block) const;

  std::vector<PagePool> pools_;
  std::vector<GroupBlocks> groups_;
  std::vector<std::vector<BlockId>> allocated_since_;  // per group, for take_changes
  std::vector<PageId> scratch_;
};

}  // namespace dsv4
