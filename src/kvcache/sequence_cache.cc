// BlockTable edits and the slot rule (sequence_cache.h).
#include "kvcache/sequence_cache.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace dsv4 {

void BlockTable::set(std::int64_t index, BlockId block) {
  if (blocks.empty()) base = index;
  if (index < base) {
    throw std::logic_error("BlockTable::set: index " + std::to_string(index) + " below base " + std::to_string(base));
  }
  if (index >= end()) blocks.resize(static_cast<std::size_t>(index - base + 1), kNoBlock);
  blocks[static_cast<std::size_t>(index - base)] = block;
}

std::vector<BlockId> BlockTable::release_below(std::int64_t index) {
  std::vector<BlockId> released;
  if (index <= base) return released;
  const std::int64_t n = std::min<std::int64_t>(index, end()) - base;
  for (std::int64_t i = 0; i < n; ++i) {
    if (blocks[static_cast<std::size_t>(i)] != kNoBlock) released.push_back(blocks[static_cast<std::size_t>(i)]);
  }
  blocks.erase(blocks.begin(), blocks.begin() + n);
  base = blocks.empty() ? index : base + n;
  return released;
}

std::int64_t entry_slot(const CacheGroup& g, const BlockTable& table, std::int64_t entry) {
  const std::int64_t per_block = g.entries_per_block();
  const BlockId block = table.at(entry / per_block);
  if (block == kNoBlock) return -1;
  return static_cast<std::int64_t>(block) * per_block + entry % per_block;
}

std::int64_t slot_of(const CacheGroup& g, const BlockTable& table, std::int64_t position) {
  if ((position + 1) % g.tokens_per_entry != 0) return -1;
  return entry_slot(g, table, position / g.tokens_per_entry);
}

}  // namespace dsv4
