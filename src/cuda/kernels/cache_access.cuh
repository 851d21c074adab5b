// Addressing of cache entries from the kernels: slot -> block -> page (the device page table)
// -> the entry's data and scale bytes (kvcache/entry_layout.h: a page holds all entries' data,
// then all entries' scales). Same layout as the CPU executor's pages, byte for byte.
#pragma once

#include <cstdint>

#include "cuda/device.h"
#include "cuda/device_step.h"

namespace dsv4::gpu {

struct EntryBytes {
  std::uint8_t* data;
  std::uint8_t* scales;
};

__device__ __forceinline__ EntryBytes entry_bytes(const DeviceCacheGroup& g, std::int64_t slot, int layer_slot) {
  const std::int64_t block = slot / g.entries_per_block, entry = slot % g.entries_per_block;
  const std::int64_t page = g.page_table[block * g.layers + layer_slot];
  std::uint8_t* base = g.pool + page * g.page_bytes;
  return {base + entry * g.data_bytes, base + static_cast<std::int64_t>(g.entries_per_block) * g.data_bytes + entry * g.scale_bytes};
}

// Slot of `index` (a position for sliding groups, an entry for compressed groups) of row `row`
// through its block table (executor/step_plan.cc table_slot); -1 when not held.
__device__ __forceinline__ std::int64_t table_slot(const DeviceCacheGroup& g, int row, std::int64_t index) {
  const std::int64_t k = index / g.entries_per_block - g.table_base[row];
  const std::int64_t begin = g.table_start[row], end = g.table_start[row + 1];
  if (index < 0 || k < 0 || begin + k >= end) return -1;
  const std::int32_t block = g.block_ids[begin + k];
  if (block < 0) return -1;
  return static_cast<std::int64_t>(block) * g.entries_per_block + index % g.entries_per_block;
}

}  // namespace dsv4::gpu
