// PrefixCache: full 256-position logical blocks, hashed as a chain, kept for reuse by later
// requests with the same prefix (SPEC.md section 6; the shape of nano-vllm's block_manager).
//
// An entry is logical block b of some token sequence, keyed by
//   hash_b = XXH64(hash_{b-1} (8 bytes LE) + the block's 256 token ids (int32 LE)), hash_{-1} = 0,
// and it keeps references to:
//   core  one block per compressed group (c4 KV, c128 KV, indexer keys) for block b;
//   tail  for each sliding group, the blocks covering [keep_from(B), B), B = 256 (b + 1):
//         the window KV of positions B-127..B-1 and the compressor state at B (for c4 the
//         previous 4 positions, for c128 nothing) -- exactly what continuing at B needs
//         (SPEC.md 3.3). The tail survives the owner sliding its window past it.
// A hit at boundary B uses the core of blocks 0..b and the tail of block b only, so a
// tail can be dropped under memory pressure without breaking longer hits.
//
// A hit checks every block's tokens and parent hash (no trust in the hash alone) and ends
// at the deepest matching entry that still has its tail, never past `max_tokens`.
//
// Eviction, in this order, only when a request cannot otherwise get its pages:
//   1. idle entries (no live sequence uses them), least recently used first. Sequences
//      release their entries deepest block first, so children leave before parents;
//   2. tails of entries that live sequences use, least recently used first: the tail blocks
//      only the cache holds are freed at once (e.g. the compressor state a producer has
//      already slid past), the rest when their sequences slide past them.
// Live sequences' own blocks are never taken; after that the scheduler must preempt.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "kvcache/block_pool.h"
#include "kvcache/cache_spec.h"
#include "kvcache/sequence_cache.h"

namespace dsv4 {

struct PrefixCacheStats {
  std::int64_t queries = 0;        // lookups (one per new or resumed request)
  std::int64_t query_tokens = 0;   // prompt tokens looked up
  std::int64_t hit_tokens = 0;     // tokens served from the cache
  std::int64_t inserted = 0;       // entries created
  std::int64_t evicted = 0;        // entries evicted
  std::int64_t tails_dropped = 0;  // tails dropped from entries in use

  double hit_rate() const { return query_tokens == 0 ? 0.0 : static_cast<double>(hit_tokens) / query_tokens; }
};

class PrefixCache {
 public:
  struct BlockRef {
    int group = 0;
    std::int64_t index = 0;  // block index in the group's table
    BlockId block = kNoBlock;
  };
  struct Entry {
    std::uint64_t hash = 0;
    std::uint64_t parent = 0;
    std::int64_t logical_block = 0;
    std::vector<std::int32_t> tokens;  // the block's 256 token ids
    std::vector<BlockRef> core;
    std::vector<BlockRef> tail;
    bool has_tail = false;
    std::int32_t users = 0;            // live sequences referencing this entry
    std::uint64_t last_use = 0;        // logical clock of the last acquire or release
    std::vector<std::int64_t> pages;   // pages per bucket held by core + tail
    std::list<PrefixEntryId>::iterator lru;  // valid while idle (users == 0)
    bool live = false;                 // the slot holds an entry
  };

  PrefixCache(const CacheSpec& spec, BlockPool& pool);
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  static std::uint64_t chain_hash(std::uint64_t parent, std::span<const std::int32_t> tokens);

  // Entries of the longest cached prefix of `tokens` that is a multiple of 256 and at most
  // `max_tokens` long, ending at an entry with a tail (may be empty). Counts the lookup.
  std::vector<PrefixEntryId> match(std::span<const std::int32_t> tokens, std::int64_t max_tokens);

  // Registers a full block, taking a reference to each of `core` and `tail`, as an idle
  // entry; nullopt (nothing taken) when an entry with this hash already exists.
  std::optional<PrefixEntryId> insert(std::uint64_t hash, std::uint64_t parent, std::int64_t logical_block,
                                      std::span<const std::int32_t> tokens, std::vector<BlockRef> core,
                                      std::vector<BlockRef> tail);
  void acquire(PrefixEntryId id);  // a live sequence starts using it
  void release(PrefixEntryId id);  // ... stops; at zero users it becomes the most recent idle entry

  // Pages (per bucket) that eviction could free now: idle entries, then droppable tails.
  std::int64_t idle_pages(int bucket) const { return idle_pages_[static_cast<std::size_t>(bucket)]; }
  std::vector<std::int64_t> droppable_tail_pages() const;
  // Evicts (in the order above) until `deficit[bucket]` more pages are free in every bucket;
  // returns false if it ran out of things to evict.
  bool reclaim(std::vector<std::int64_t> deficit);
  void evict_all_idle();

  const Entry& entry(PrefixEntryId id) const { return entries_[static_cast<std::size_t>(id)]; }
  std::int64_t size() const { return static_cast<std::int64_t>(by_hash_.size()); }
  std::int64_t entry_id_bound() const { return static_cast<std::int64_t>(entries_.size()); }
  const PrefixCacheStats& stats() const { return stats_; }
  const std::list<PrefixEntryId>& idle_lru() const { return idle_; }  // least recent first

 private:
  void evict(PrefixEntryId id);
  std::vector<std::int64_t> tail_freeable_pages(const Entry& e) const;  // per bucket, in-use entries only
  void drop_tail(Entry& e);
  std::int64_t block_pages(const BlockRef& ref) const;

  const CacheSpec* spec_;
  BlockPool* pool_;
  std::vector<Entry> entries_;
  std::vector<PrefixEntryId> free_ids_;
  std::unordered_map<std::uint64_t, PrefixEntryId> by_hash_;
  std::list<PrefixEntryId> idle_;  // idle entries, least recently used first
  std::vector<std::int64_t> idle_pages_;
  std::uint64_t clock_ = 0;
  PrefixCacheStats stats_;
};

}  // namespace dsv4
