// KvCacheManager: the hybrid paged KV cache of SPEC.md section 6, host-side bookkeeping
// only. It owns the bucket pools (BlockPool), the prefix cache and every request's block
// tables, and answers the scheduler's questions: does this step fit, which slots does each
// token write, what may be freed.
//
// A request's life:
//   add_sequence(id, prompt)   reuses the longest cached prefix at a 256 boundary (at most
//                              prompt - 1 tokens, so one token is always computed); returns it
//   allocate(id, n[, min_commit])
//                              slots for positions [computed, computed + n), all or nothing;
//                              evicts prefix-cache entries if it must; when pages run out it
//                              returns kNoSpace (preempt someone, retry) or kNeverFits (this
//                              request alone exceeds the pools) with a reason
//   step_view(slices)          slot mappings and block tables for the executors
//   take_page_changes()        the pages of blocks allocated since the last call, for the
//                              executors' copies of the page table
//   commit(id, token_ids)      those positions are written: registers newly full logical
//                              blocks in the prefix cache and releases window/state blocks
//                              that fell out of every window. May commit fewer than allocated
//                              but at least min_commit (speculative decoding: min_commit = 1);
//                              the rest is rewritten later.
//   free(id) / preempt(id)     drops everything (a preempted request is re-added later and
//                              recomputed, possibly from its own cached prefix)
//
// What a step writes: the window KV of every token (attention reads the step's own tokens
// through the cache, so a long chunk holds its window blocks until commit), every completed
// compressed entry, and the compressor state only of the positions that are still needed
// once at least min_commit tokens are committed, plus (with prefix caching) the state at
// each 256 boundary the step crosses. Other state slots are -1: the executor pools the
// step's own tokens from the step's projections and reads only earlier positions' state
// from the cache.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kvcache/block_pool.h"
#include "kvcache/cache_spec.h"
#include "kvcache/prefix_cache.h"
#include "kvcache/sequence_cache.h"
#include "kvcache/step_view.h"

namespace dsv4 {

enum class AllocStatus { kOk, kNoSpace, kNeverFits };

struct AllocResult {
  AllocStatus status = AllocStatus::kOk;
  std::string reason;  // empty when ok
  bool ok() const { return status == AllocStatus::kOk; }
};

// Where an entry's bytes are: offsets from the start of its bucket's memory (pages of
// CacheSpec::buckets[bucket] bytes, page p at p * page_bytes).
struct EntryAddress {
  int bucket = 0;
  PageId page = 0;
  std::int64_t data_offset = 0;
  std::int64_t scale_offset = 0;  // == end of the page's data area when the format has no scales
};

struct KvCacheStats {
  std::int64_t preemptions = 0;
  std::int64_t failed_allocations = 0;
  std::int64_t released_sliding_blocks = 0;  // window/state blocks freed as sequences slid
};

class KvCacheManager {
 public:
  // `pages_per_bucket[i]` pages of spec.buckets[i] bytes (memory_plan.h sizes them).
  KvCacheManager(CacheSpec spec, const std::vector<std::int64_t>& pages_per_bucket, bool prefix_caching = true);
  KvCacheManager(const KvCacheManager&) = delete;
  KvCacheManager& operator=(const KvCacheManager&) = delete;

  std::int64_t add_sequence(SeqId id, std::span<const std::int32_t> prompt);
  // min_commit: how many of the tokens will surely be committed (-1: all of them).
  AllocResult can_allocate(SeqId id, std::int64_t num_tokens, std::int64_t min_commit = -1) const;
  AllocResult allocate(SeqId id, std::int64_t num_tokens, std::int64_t min_commit = -1);
  void commit(SeqId id, std::span<const std::int32_t> token_ids);
  void free(SeqId id);
  void preempt(SeqId id);

  StepView step_view(std::span<const StepSlice> slices) const;
  // The pages of blocks allocated since the last call (BlockPool::take_changes): whoever hands
  // a plan to an executor takes them first, so the executor's page table covers every block
  // the plan names.
  PageTableChanges take_page_changes();
  std::int64_t slot(SeqId id, int group, std::int64_t position) const;  // -1 if none
  // The bytes of `slot` (a slot_mapping value >= 0) for layer `layer_slot` of the group.
  EntryAddress entry_address(int group, std::int64_t slot, std::int64_t layer_slot) const;

  bool has_sequence(SeqId id) const { return seqs_.count(id) != 0; }
  const SequenceCache& sequence(SeqId id) const;
  const CacheSpec& spec() const { return spec_; }
  const BlockPool& blocks() const { return pool_; }
  PrefixCache& prefix_cache() { return cache_; }
  const PrefixCache& prefix_cache() const { return cache_; }
  bool prefix_caching() const { return prefix_caching_; }
  const KvCacheStats& stats() const { return stats_; }
  std::int64_t free_pages(int bucket) const { return pool_.pool(bucket).num_free(); }
  std::int64_t used_pages(int bucket) const { return pool_.pool(bucket).num_used(); }

  // Recounts every reference and page from scratch and throws std::logic_error naming the
  // first violation: a page in two blocks, a reference count that differs from its holders,
  // a live position without a block, a slid-out block still held, idle cache entries whose
  // blocks someone else holds, page counts that do not add up. For tests.
  void check_invariants() const;

 private:
  struct Need {
    std::vector<std::pair<int, std::int64_t>> blocks;  // (group, block index) to allocate
    std::vector<std::int64_t> pages;                   // per bucket
  };
  SequenceCache& seq(SeqId id);
  Need need_for(const SequenceCache& s, std::int64_t num_tokens, std::int64_t min_commit) const;
  AllocResult check(const SequenceCache& s, const Need& need) const;
  void register_full_blocks(SequenceCache& s);

  CacheSpec spec_;
  BlockPool pool_;
  PrefixCache cache_;
  bool prefix_caching_;
  std::unordered_map<SeqId, SequenceCache> seqs_;
  KvCacheStats stats_;
};

}  // namespace dsv4
