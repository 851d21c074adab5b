// SequenceCache: what one request holds in the KV cache -- per cache group a block table,
// the token ids of its computed positions (for prefix hashing), and the prefix-cache
// entries it references. Also the slot rule that maps a position to where it is written.
//
// Block index i of group g covers positions [i * P, (i + 1) * P), P = positions_per_block.
// Compressed groups have P = 256 (block index = logical block); sliding groups drop the
// blocks that fell out of their window, so their table starts at `base`.
//
// Slots (what the executors write to): slot = block_id * entries_per_block + entry, where
// entry is the index of the written entry inside its block. A window or state token writes
// its own position (state: only where the manager allocated a block, see
// kv_cache_manager.h; elsewhere slot -1); a compressed token writes entry j = t / r only
// when it completes it (t % r == r - 1), and nothing (slot -1) otherwise. The bytes of
// entry e of layer slot s: page block_pages(g, block)[s] of the group's bucket, at
// CacheGroup::layout().data_offset(e) / scale_offset(e).
#pragma once

#include <cstdint>
#include <vector>

#include "kvcache/block_pool.h"
#include "kvcache/cache_spec.h"

namespace dsv4 {

struct BlockTable {
  std::int64_t base = 0;         // block index of blocks[0]
  std::vector<BlockId> blocks;   // kNoBlock = not allocated (or already released)

  std::int64_t end() const { return base + static_cast<std::int64_t>(blocks.size()); }
  BlockId at(std::int64_t index) const {
    return index < base || index >= end() ? kNoBlock : blocks[static_cast<std::size_t>(index - base)];
  }
  // Stores `block` at `index` (growing the table; an empty table starts at `index`).
  void set(std::int64_t index, BlockId block);
  // Removes and returns the blocks below `index` (kNoBlock entries are skipped).
  std::vector<BlockId> release_below(std::int64_t index);
};

// Slot of `position` in group `g` given its table; -1 when the token writes no entry there
// or the block is missing.
std::int64_t slot_of(const CacheGroup& g, const BlockTable& table, std::int64_t position);
// Slot of compressed entry `entry` (t / r) or, for sliding kinds, of position `entry`.
std::int64_t entry_slot(const CacheGroup& g, const BlockTable& table, std::int64_t entry);

using PrefixEntryId = std::int32_t;

struct SequenceCache {
  std::vector<std::int32_t> tokens;     // ids of positions [0, num_computed)
  std::int64_t num_computed = 0;        // positions whose caches are written and committed
  std::int64_t num_allocated = 0;       // positions [0, num_allocated) have slots
  std::vector<BlockTable> tables;       // one per cache group (CacheSpec order)
  std::vector<std::uint64_t> block_hashes;     // chain hash of each full logical block so far
  std::vector<PrefixEntryId> prefix_entries;   // entries it references (hit or registered)
};

}  // namespace dsv4
