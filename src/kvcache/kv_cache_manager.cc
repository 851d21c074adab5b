// KvCacheManager: admission, allocation, commit (prefix registration + window sliding),
// release, step views and the invariant checker (kv_cache_manager.h).
#include "kvcache/kv_cache_manager.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "common/error.h"

namespace dsv4 {
namespace {

[[noreturn]] void broken(const std::string& what) { throw std::logic_error("KvCacheManager: " + what); }

constexpr std::int64_t kMaxPositions = 0x7fffffff;  // int32 positions and slots in step views

std::size_t ix(std::int64_t i) { return static_cast<std::size_t>(i); }

}  // namespace

KvCacheManager::KvCacheManager(CacheSpec spec, const std::vector<std::int64_t>& pages_per_bucket, bool prefix_caching)
    : spec_(std::move(spec)), pool_(spec_, pages_per_bucket), cache_(spec_, pool_), prefix_caching_(prefix_caching) {
  // Step views carry slots as int32 (step_view.h).
  for (int g = 0; g < spec_.num_groups(); ++g) {
    const std::int64_t slots = pool_.max_blocks(g) * spec_.groups[ix(g)].entries_per_block();
    if (slots > kMaxPositions) {
      fail("KV cache: {} pages give {} {} slots, more than int32 slot numbers address (2^31 - 1); use fewer pages",
           pages_per_bucket[ix(pool_.bucket_of(g))], slots, cache_kind_name(spec_.groups[ix(g)].kind));
    }
  }
}

PageTableChanges KvCacheManager::take_page_changes() { return pool_.take_changes(); }

SequenceCache& KvCacheManager::seq(SeqId id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) broken(fmt::format("no sequence {}", id));
  return it->second;
}

const SequenceCache& KvCacheManager::sequence(SeqId id) const { return const_cast<KvCacheManager*>(this)->seq(id); }

std::int64_t KvCacheManager::add_sequence(SeqId id, std::span<const std::int32_t> prompt) {
  if (seqs_.count(id) != 0) broken(fmt::format("sequence {} added twice", id));
  SequenceCache& s = seqs_[id];
  s.tables.resize(ix(spec_.num_groups()));
  if (!prefix_caching_ || prompt.empty()) return 0;
  const std::vector<PrefixEntryId> chain = cache_.match(prompt, static_cast<std::int64_t>(prompt.size()) - 1);
  for (std::size_t k = 0; k < chain.size(); ++k) {
    cache_.acquire(chain[k]);
    const PrefixCache::Entry& e = cache_.entry(chain[k]);
    s.prefix_entries.push_back(chain[k]);
    s.block_hashes.push_back(e.hash);
    std::vector<const std::vector<PrefixCache::BlockRef>*> parts = {&e.core};
    if (k + 1 == chain.size()) parts.push_back(&e.tail);  // only the last block's tail is needed
    for (const auto* refs : parts) {
      for (const PrefixCache::BlockRef& ref : *refs) {
        pool_.incref(ref.group, ref.block);
        s.tables[ix(ref.group)].set(ref.index, ref.block);
      }
    }
  }
  const std::int64_t hit = static_cast<std::int64_t>(chain.size()) * kLogicalBlockTokens;
  s.tokens.assign(prompt.begin(), prompt.begin() + hit);
  s.num_computed = s.num_allocated = hit;
  return hit;
}

KvCacheManager::Need KvCacheManager::need_for(const SequenceCache& s, std::int64_t num_tokens,
                                              std::int64_t min_commit) const {
  if (num_tokens < 0 || min_commit > num_tokens) broken(fmt::format("bad step: {} tokens, min_commit {}", num_tokens, min_commit));
  Need need;
  need.pages.assign(spec_.buckets.size(), 0);
  if (num_tokens == 0) return need;
  const std::int64_t start = s.num_computed, end = s.num_computed + num_tokens;
  const std::int64_t certain_end = start + (min_commit < 0 ? num_tokens : min_commit);
  for (int g = 0; g < spec_.num_groups(); ++g) {
    const CacheGroup& group = spec_.groups[ix(g)];
    // Position ranges the step stores in this group.
    std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
    if (!group.is_compressor_state()) {
      ranges.emplace_back(start, end);
    } else {
      ranges.emplace_back(std::max(start, group.keep_from(certain_end)), end);
      if (prefix_caching_) {
        for (std::int64_t b = (start / kLogicalBlockTokens + 1) * kLogicalBlockTokens; b <= end; b += kLogicalBlockTokens) {
          ranges.emplace_back(std::max(start, group.keep_from(b)), b);
        }
      }
      std::sort(ranges.begin(), ranges.end());
    }
    const std::int64_t per_block = group.positions_per_block;
    std::int64_t next = 0;  // first block index not yet considered
    for (const auto& [lo, hi] : ranges) {
      if (lo >= hi) continue;
      for (std::int64_t i = std::max(next, lo / per_block); i <= (hi - 1) / per_block; ++i) {
        if (s.tables[ix(g)].at(i) == kNoBlock) {
          need.blocks.emplace_back(g, i);
          need.pages[ix(pool_.bucket_of(g))] += pool_.pages_per_block(g);
        }
        next = i + 1;
      }
    }
  }
  return need;
}

AllocResult KvCacheManager::check(const SequenceCache& s, const Need& need) const {
  const int buckets = pool_.num_buckets();
  std::vector<std::int64_t> available(ix(buckets));
  bool short_anywhere = false;
  for (int b = 0; b < buckets; ++b) {
    available[ix(b)] = pool_.pool(b).num_free() + (prefix_caching_ ? cache_.idle_pages(b) : 0);
    short_anywhere |= available[ix(b)] < need.pages[ix(b)];
  }
  if (!short_anywhere) return {};
  if (prefix_caching_) {
    const std::vector<std::int64_t> tails = cache_.droppable_tail_pages();
    for (int b = 0; b < buckets; ++b) available[ix(b)] += tails[ix(b)];
  }
  // Out of pages: say whether waiting (someone else frees or is preempted) can ever help.
  for (int b = 0; b < buckets; ++b) {
    std::int64_t held = 0;
    for (int g = 0; g < spec_.num_groups(); ++g) {
      if (pool_.bucket_of(g) != b) continue;
      const auto& blocks = s.tables[ix(g)].blocks;
      held += pool_.pages_per_block(g) * static_cast<std::int64_t>(std::count_if(
                                            blocks.begin(), blocks.end(), [](BlockId x) { return x != kNoBlock; }));
    }
    const std::int64_t total = pool_.pool(b).num_pages();
    if (held + need.pages[ix(b)] > total) {
      return {AllocStatus::kNeverFits,
              fmt::format("this request alone needs {} pages of {} B (bucket {}) at {} positions; the pool has {}",
                          held + need.pages[ix(b)], spec_.buckets[ix(b)], b, s.num_computed, total)};
    }
  }
  for (int b = 0; b < buckets; ++b) {
    if (available[ix(b)] < need.pages[ix(b)]) {
      return {AllocStatus::kNoSpace,
              fmt::format("needs {} more pages of {} B (bucket {}); {} free, {} reclaimable from the prefix cache",
                          need.pages[ix(b)], spec_.buckets[ix(b)], b, pool_.pool(b).num_free(),
                          available[ix(b)] - pool_.pool(b).num_free())};
    }
  }
  return {};
}

AllocResult KvCacheManager::can_allocate(SeqId id, std::int64_t num_tokens, std::int64_t min_commit) const {
  const SequenceCache& s = sequence(id);
  return check(s, need_for(s, num_tokens, min_commit));
}

AllocResult KvCacheManager::allocate(SeqId id, std::int64_t num_tokens, std::int64_t min_commit) {
  SequenceCache& s = seq(id);
  const Need need = need_for(s, num_tokens, min_commit);
  AllocResult result = check(s, need);
  if (!result.ok()) {
    ++stats_.failed_allocations;
    return result;
  }
  std::vector<std::int64_t> deficit(spec_.buckets.size());
  bool short_anywhere = false;
  for (int b = 0; b < pool_.num_buckets(); ++b) {
    deficit[ix(b)] = need.pages[ix(b)] - pool_.pool(b).num_free();
    short_anywhere |= deficit[ix(b)] > 0;
  }
  if (short_anywhere && !cache_.reclaim(deficit)) broken("prefix cache reclaimed less than it promised");
  for (const auto& [g, index] : need.blocks) {
    const BlockId block = pool_.allocate(g);
    if (block == kNoBlock) broken("page pool ran dry after a successful check");
    s.tables[ix(g)].set(index, block);
  }
  s.num_allocated = std::max(s.num_allocated, s.num_computed + num_tokens);
  return result;
}

void KvCacheManager::register_full_blocks(SequenceCache& s) {
  while (static_cast<std::int64_t>(s.block_hashes.size() + 1) * kLogicalBlockTokens <= s.num_computed) {
    const std::int64_t b = static_cast<std::int64_t>(s.block_hashes.size());
    const std::uint64_t parent = b == 0 ? 0 : s.block_hashes.back();
    const std::span<const std::int32_t> tokens(s.tokens.data() + b * kLogicalBlockTokens, kLogicalBlockTokens);
    const std::uint64_t hash = PrefixCache::chain_hash(parent, tokens);
    s.block_hashes.push_back(hash);
    const std::int64_t boundary = (b + 1) * kLogicalBlockTokens;
    std::vector<PrefixCache::BlockRef> core, tail;
    for (int g = 0; g < spec_.num_groups(); ++g) {
      const CacheGroup& group = spec_.groups[ix(g)];
      const std::int64_t per_block = group.positions_per_block;
      const std::int64_t first = group.sliding ? group.keep_from(boundary) / per_block : b;
      const std::int64_t last = group.sliding ? (boundary - 1) / per_block : b;
      for (std::int64_t i = first; i <= last; ++i) {
        const BlockId block = s.tables[ix(g)].at(i);
        if (block == kNoBlock) broken(fmt::format("{} block {} missing when registering logical block {}", cache_kind_name(group.kind), i, b));
        (group.sliding ? tail : core).push_back({g, i, block});
      }
    }
    if (auto id = cache_.insert(hash, parent, b, tokens, std::move(core), std::move(tail))) {
      cache_.acquire(*id);
      s.prefix_entries.push_back(*id);
    }
  }
}

void KvCacheManager::commit(SeqId id, std::span<const std::int32_t> token_ids) {
  SequenceCache& s = seq(id);
  const std::int64_t n = static_cast<std::int64_t>(token_ids.size());
  if (s.num_computed + n > s.num_allocated) {
    broken(fmt::format("sequence {} commits {} positions past its allocation ({} + {} > {})", id, n, s.num_computed, n,
                       s.num_allocated));
  }
  s.tokens.insert(s.tokens.end(), token_ids.begin(), token_ids.end());
  s.num_computed += n;
  for (int g = 0; g < spec_.num_groups(); ++g) {
    const CacheGroup& group = spec_.groups[ix(g)];
    if (!group.is_compressor_state()) continue;  // the other groups store every scheduled position
    const std::int64_t per_block = group.positions_per_block;
    for (std::int64_t i = group.keep_from(s.num_computed) / per_block; i * per_block < s.num_computed; ++i) {
      if (s.tables[ix(g)].at(i) == kNoBlock) {
        broken(fmt::format("sequence {} committed {} positions but its {} block {} was never stored (fewer than min_commit?)",
                           id, s.num_computed, cache_kind_name(group.kind), i));
      }
    }
  }
  if (prefix_caching_) register_full_blocks(s);
  for (int g = 0; g < spec_.num_groups(); ++g) {
    const CacheGroup& group = spec_.groups[ix(g)];
    if (!group.sliding) continue;
    for (BlockId block : s.tables[ix(g)].release_below(group.keep_from(s.num_computed) / group.positions_per_block)) {
      pool_.decref(g, block);
      ++stats_.released_sliding_blocks;
    }
  }
}

void KvCacheManager::free(SeqId id) {
  SequenceCache& s = seq(id);
  for (int g = 0; g < spec_.num_groups(); ++g) {
    for (BlockId block : s.tables[ix(g)].blocks) {
      if (block != kNoBlock) pool_.decref(g, block);
    }
  }
  // Deepest block first, so the idle LRU evicts children before their parents.
  for (auto it = s.prefix_entries.rbegin(); it != s.prefix_entries.rend(); ++it) cache_.release(*it);
  seqs_.erase(id);
}

void KvCacheManager::preempt(SeqId id) {
  ++stats_.preemptions;
  free(id);
}

std::int64_t KvCacheManager::slot(SeqId id, int group, std::int64_t position) const {
  return slot_of(spec_.groups.at(ix(group)), sequence(id).tables.at(ix(group)), position);
}

EntryAddress KvCacheManager::entry_address(int group, std::int64_t slot, std::int64_t layer_slot) const {
  const CacheGroup& g = spec_.groups.at(ix(group));
  const PageLayout layout = g.layout();
  const auto block = static_cast<BlockId>(slot / layout.entries);
  const std::int64_t entry = slot % layout.entries;
  const auto pages = pool_.block_pages(group, block);
  if (layer_slot < 0 || layer_slot >= static_cast<std::int64_t>(pages.size())) {
    broken(fmt::format("{} has no layer slot {}", cache_kind_name(g.kind), layer_slot));
  }
  const PageId page = pages[ix(layer_slot)];
  const std::int64_t base = static_cast<std::int64_t>(page) * layout.page_bytes;
  return {g.bucket, page, base + layout.data_offset(entry), base + layout.scale_offset(entry)};
}

StepView KvCacheManager::step_view(std::span<const StepSlice> slices) const {
  StepView view;
  view.token_start.push_back(0);
  view.groups.resize(ix(spec_.num_groups()));
  for (int g = 0; g < spec_.num_groups(); ++g) {
    view.groups[ix(g)].kind = spec_.groups[ix(g)].kind;
    view.groups[ix(g)].table_start.push_back(0);
  }
  for (const StepSlice& slice : slices) {
    const SequenceCache& s = sequence(slice.seq);
    const std::int64_t start = s.num_computed, end = start + slice.num_tokens;
    if (slice.num_tokens < 0 || end > s.num_allocated) {
      broken(fmt::format("step view of sequence {}: positions [{}, {}) are not allocated", slice.seq, start, end));
    }
    if (end > kMaxPositions) broken(fmt::format("sequence {} reaches position {}, beyond 2^31 - 1", slice.seq, end));
    view.seqs.push_back(slice.seq);
    view.row_start.push_back(static_cast<std::int32_t>(start));
    for (std::int64_t t = start; t < end; ++t) view.positions.push_back(static_cast<std::int32_t>(t));
    view.token_start.push_back(static_cast<std::int32_t>(view.positions.size()));
    for (int g = 0; g < spec_.num_groups(); ++g) {
      const CacheGroup& group = spec_.groups[ix(g)];
      const BlockTable& table = s.tables[ix(g)];
      GroupStepView& out = view.groups[ix(g)];
      // Slots fit int32: the constructor checked max_blocks * entries_per_block.
      for (std::int64_t t = start; t < end; ++t) out.slot_mapping.push_back(static_cast<std::int32_t>(slot_of(group, table, t)));
      const std::int64_t first = group.keep_from(start) / group.positions_per_block;
      out.table_base.push_back(static_cast<std::int32_t>(first));
      for (std::int64_t i = first; i < table.end(); ++i) out.block_ids.push_back(table.at(i));
      out.table_start.push_back(static_cast<std::int32_t>(out.block_ids.size()));
    }
  }
  return view;
}

void KvCacheManager::check_invariants() const {
  const int groups = spec_.num_groups();
  std::vector<std::vector<std::int64_t>> refs(ix(groups));
  for (int g = 0; g < groups; ++g) refs[ix(g)].assign(ix(pool_.block_id_bound(g)), 0);
  std::vector<std::int64_t> users(ix(cache_.entry_id_bound()), 0);

  for (const auto& [id, s] : seqs_) {
    if (static_cast<std::int64_t>(s.tokens.size()) != s.num_computed || s.num_computed > s.num_allocated) {
      broken(fmt::format("sequence {}: {} tokens, {} computed, {} allocated", id, s.tokens.size(), s.num_computed, s.num_allocated));
    }
    for (int g = 0; g < groups; ++g) {
      const CacheGroup& group = spec_.groups[ix(g)];
      const BlockTable& table = s.tables[ix(g)];
      const std::int64_t per_block = group.positions_per_block;
      const std::int64_t live_first = group.keep_from(s.num_computed) / per_block;
      const std::int64_t live_end = (s.num_allocated + per_block - 1) / per_block;
      // Every block a later step reads must exist; scheduled state positions may be holes.
      const std::int64_t required_end = ((group.is_compressor_state() ? s.num_computed : s.num_allocated) + per_block - 1) / per_block;
      for (std::int64_t i = table.base; i < table.end(); ++i) {
        const BlockId block = table.at(i);
        if (block == kNoBlock) continue;
        if (block >= pool_.block_id_bound(g)) broken(fmt::format("sequence {} names unknown {} block {}", id, cache_kind_name(group.kind), block));
        ++refs[ix(g)][ix(block)];
        if (i < live_first) broken(fmt::format("sequence {} still holds {} block index {} (live from {})", id, cache_kind_name(group.kind), i, live_first));
        if (i >= live_end) broken(fmt::format("sequence {} holds {} block index {} past its allocation", id, cache_kind_name(group.kind), i));
      }
      for (std::int64_t i = live_first; i < required_end; ++i) {
        if (table.at(i) == kNoBlock) broken(fmt::format("sequence {} lacks {} block index {} (live {}..{})", id, cache_kind_name(group.kind), i, live_first, required_end));
      }
    }
    for (PrefixEntryId e : s.prefix_entries) {
      if (e < 0 || e >= cache_.entry_id_bound() || !cache_.entry(e).live) broken(fmt::format("sequence {} uses dead prefix entry {}", id, e));
      ++users[ix(e)];
    }
  }

  std::vector<std::int64_t> idle_pages(spec_.buckets.size(), 0);
  std::int64_t idle_entries = 0;
  for (PrefixEntryId e = 0; e < cache_.entry_id_bound(); ++e) {
    const PrefixCache::Entry& entry = cache_.entry(e);
    if (!entry.live) continue;
    if (entry.users != users[ix(e)]) broken(fmt::format("prefix entry {} has {} users, {} sequences use it", e, entry.users, users[ix(e)]));
    for (const auto* part : {&entry.core, &entry.tail}) {
      for (const PrefixCache::BlockRef& ref : *part) {
        ++refs[ix(ref.group)][ix(ref.block)];
        if (entry.users == 0) idle_pages[ix(pool_.bucket_of(ref.group))] += pool_.pages_per_block(ref.group);
      }
    }
    if (entry.users == 0) ++idle_entries;
  }
  if (idle_entries != static_cast<std::int64_t>(cache_.idle_lru().size())) broken("idle LRU size differs from the idle entries");
  for (int b = 0; b < pool_.num_buckets(); ++b) {
    if (idle_pages[ix(b)] != cache_.idle_pages(b)) broken(fmt::format("bucket {}: idle pages {} counted, {} tracked", b, idle_pages[ix(b)], cache_.idle_pages(b)));
  }

  std::vector<std::vector<bool>> page_seen(ix(pool_.num_buckets()));
  std::vector<std::int64_t> pages_used(ix(pool_.num_buckets()), 0);
  for (int b = 0; b < pool_.num_buckets(); ++b) page_seen[ix(b)].assign(ix(pool_.pool(b).num_pages()), false);
  for (int g = 0; g < groups; ++g) {
    for (BlockId block = 0; block < pool_.block_id_bound(g); ++block) {
      const std::int64_t counted = refs[ix(g)][ix(block)];
      if (counted != pool_.ref_count(g, block)) {
        broken(fmt::format("{} block {}: ref count {}, {} holders", cache_kind_name(spec_.groups[ix(g)].kind), block, pool_.ref_count(g, block), counted));
      }
      if (counted == 0) continue;
      const int b = pool_.bucket_of(g);
      for (PageId page : pool_.block_pages(g, block)) {
        if (page_seen[ix(b)][ix(page)]) broken(fmt::format("bucket {} page {} belongs to two blocks", b, page));
        if (pool_.pool(b).is_free(page)) broken(fmt::format("bucket {} page {} is in a block and on the free list", b, page));
        page_seen[ix(b)][ix(page)] = true;
        ++pages_used[ix(b)];
      }
    }
  }
  for (int b = 0; b < pool_.num_buckets(); ++b) {
    if (pages_used[ix(b)] != pool_.pool(b).num_used()) {
      broken(fmt::format("bucket {}: {} pages in blocks, {} taken from the pool", b, pages_used[ix(b)], pool_.pool(b).num_used()));
    }
  }
  for (PrefixEntryId e : cache_.idle_lru()) {
    const PrefixCache::Entry& entry = cache_.entry(e);
    for (const auto* part : {&entry.core, &entry.tail}) {
      for (const PrefixCache::BlockRef& ref : *part) {
        if (pool_.ref_count(ref.group, ref.block) != 1) broken(fmt::format("idle prefix entry {} shares a block with a live sequence", e));
      }
    }
  }
}

}  // namespace dsv4
