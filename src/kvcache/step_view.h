// StepView: the cache addressing of one step, per cache group -- the part of the step plan
// (DESIGN.md) that the KV cache manager fills and both executors read.
//
// Rows are the step's sequences; row r computes positions [row_start[r], row_start[r] +
// tokens of r). For each cache group:
//   slot_mapping[t]  where step token t writes its entry (sequence_cache.h: slot =
//                    block * entries_per_block + entry), -1 when it writes nothing there;
//   block table      row r's blocks: block index table_base[r] + k is
//                    block_ids[table_start[r] + k] (kNoBlock = not held). Compressed groups
//                    start at 0; sliding groups at the first block the row's step can read.
// Layer slot s of block b lives on page BlockPool::block_pages(g, b)[s] of the group's bucket;
// executors keep their own copy of that page table, fed by BlockPool::take_changes().
#pragma once

#include <cstdint>
#include <vector>

#include "kvcache/block_pool.h"
#include "kvcache/cache_spec.h"

namespace dsv4 {

using SeqId = std::int64_t;

// One sequence's share of a step: its next `num_tokens` positions.
struct StepSlice {
  SeqId seq = 0;
  std::int64_t num_tokens = 0;
};

// Flat int32 arrays, so that a GPU executor can copy them in one transfer (positions stay
// below 2^31 and the KV cache manager checks that every slot fits too).
struct GroupStepView {
  CacheKind kind = CacheKind::kWindowKv;
  std::vector<std::int32_t> slot_mapping;   // [tokens]
  std::vector<std::int32_t> table_base;     // [rows]
  std::vector<std::int32_t> table_start;    // [rows + 1]
  std::vector<BlockId> block_ids;
};

struct StepView {
  std::vector<SeqId> seqs;                  // [rows] (host only)
  std::vector<std::int32_t> row_start;      // [rows] first position computed by the row
  std::vector<std::int32_t> token_start;    // [rows + 1] row r's tokens are [token_start[r], token_start[r+1])
  std::vector<std::int32_t> positions;      // [tokens]
  std::vector<GroupStepView> groups;        // [groups], CacheSpec order
};

}  // namespace dsv4
