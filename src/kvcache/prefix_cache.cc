// PrefixCache: chained block hashes, token-checked hits, LRU eviction (prefix_cache.h).
#include "kvcache/prefix_cache.h"

#include <xxhash.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <stdexcept>
#include <string>

namespace dsv4 {

PrefixCache::PrefixCache(const CacheSpec& spec, BlockPool& pool)
    : spec_(&spec), pool_(&pool), idle_pages_(spec.buckets.size(), 0) {}

std::uint64_t PrefixCache::chain_hash(std::uint64_t parent, std::span<const std::int32_t> tokens) {
  // Little-endian bytes whatever the host: the parent hash, then each token id.
  std::array<unsigned char, 8 + 4 * kLogicalBlockTokens> fixed;
  std::vector<unsigned char> large;
  const std::size_t size = 8 + tokens.size() * 4;
  unsigned char* bytes = fixed.data();
  if (size > fixed.size()) {
    large.resize(size);
    bytes = large.data();
  }
  for (std::size_t i = 0; i < 8; ++i) bytes[i] = static_cast<unsigned char>(parent >> (8 * i));
  for (std::size_t t = 0; t < tokens.size(); ++t) {
    const auto v = static_cast<std::uint32_t>(tokens[t]);
    for (std::size_t i = 0; i < 4; ++i) bytes[8 + 4 * t + i] = static_cast<unsigned char>(v >> (8 * i));
  }
  return XXH64(bytes, size, 0);
}

std::vector<PrefixEntryId> PrefixCache::match(std::span<const std::int32_t> tokens, std::int64_t max_tokens) {
  ++stats_.queries;
  stats_.query_tokens += static_cast<std::int64_t>(tokens.size());
  max_tokens = std::min<std::int64_t>(max_tokens, static_cast<std::int64_t>(tokens.size()));
  std::vector<PrefixEntryId> chain;
  std::uint64_t parent = 0;
  for (std::int64_t b = 0; (b + 1) * kLogicalBlockTokens <= max_tokens; ++b) {
    auto block = tokens.subspan(static_cast<std::size_t>(b * kLogicalBlockTokens), kLogicalBlockTokens);
    const std::uint64_t hash = chain_hash(parent, block);
    auto it = by_hash_.find(hash);
    if (it == by_hash_.end()) break;
    const Entry& e = entries_[static_cast<std::size_t>(it->second)];
    if (e.parent != parent || e.logical_block != b || !std::equal(block.begin(), block.end(), e.tokens.begin())) break;
    chain.push_back(it->second);
    parent = hash;
  }
  while (!chain.empty() && !entries_[static_cast<std::size_t>(chain.back())].has_tail) chain.pop_back();
  stats_.hit_tokens += static_cast<std::int64_t>(chain.size()) * kLogicalBlockTokens;
  return chain;
}

std::int64_t PrefixCache::block_pages(const BlockRef& ref) const { return pool_->pages_per_block(ref.group); }

std::optional<PrefixEntryId> PrefixCache::insert(std::uint64_t hash, std::uint64_t parent, std::int64_t logical_block,
                                                 std::span<const std::int32_t> tokens, std::vector<BlockRef> core,
                                                 std::vector<BlockRef> tail) {
  if (by_hash_.count(hash) != 0) return std::nullopt;
  PrefixEntryId id;
  if (!free_ids_.empty()) {
    id = free_ids_.back();
    free_ids_.pop_back();
  } else {
    id = static_cast<PrefixEntryId>(entries_.size());
    entries_.emplace_back();
  }
  Entry& e = entries_[static_cast<std::size_t>(id)];
  e = Entry{};
  e.hash = hash;
  e.parent = parent;
  e.logical_block = logical_block;
  e.tokens.assign(tokens.begin(), tokens.end());
  e.core = std::move(core);
  e.tail = std::move(tail);
  e.has_tail = true;
  e.pages.assign(spec_->buckets.size(), 0);
  for (const auto* refs : {&e.core, &e.tail}) {
    for (const BlockRef& ref : *refs) {
      pool_->incref(ref.group, ref.block);
      e.pages[static_cast<std::size_t>(pool_->bucket_of(ref.group))] += block_pages(ref);
    }
  }
  e.live = true;
  e.last_use = ++clock_;
  e.lru = idle_.insert(idle_.end(), id);
  for (std::size_t b = 0; b < idle_pages_.size(); ++b) idle_pages_[b] += e.pages[b];
  by_hash_.emplace(hash, id);
  ++stats_.inserted;
  return id;
}

void PrefixCache::acquire(PrefixEntryId id) {
  Entry& e = entries_.at(static_cast<std::size_t>(id));
  if (!e.live) throw std::logic_error("PrefixCache::acquire: entry " + std::to_string(id) + " is not live");
  if (e.users++ == 0) {
    idle_.erase(e.lru);
    for (std::size_t b = 0; b < idle_pages_.size(); ++b) idle_pages_[b] -= e.pages[b];
  }
  e.last_use = ++clock_;
}

void PrefixCache::release(PrefixEntryId id) {
  Entry& e = entries_.at(static_cast<std::size_t>(id));
  if (!e.live || e.users <= 0) throw std::logic_error("PrefixCache::release: entry " + std::to_string(id) + " is not in use");
  e.last_use = ++clock_;
  if (--e.users == 0) {
    e.lru = idle_.insert(idle_.end(), id);
    for (std::size_t b = 0; b < idle_pages_.size(); ++b) idle_pages_[b] += e.pages[b];
  }
}

void PrefixCache::evict(PrefixEntryId id) {
  Entry& e = entries_[static_cast<std::size_t>(id)];
  idle_.erase(e.lru);
  for (std::size_t b = 0; b < idle_pages_.size(); ++b) idle_pages_[b] -= e.pages[b];
  for (const auto* refs : {&e.core, &e.tail}) {
    for (const BlockRef& ref : *refs) pool_->decref(ref.group, ref.block);
  }
  by_hash_.erase(e.hash);
  e = Entry{};
  free_ids_.push_back(id);
  ++stats_.evicted;
}

std::vector<std::int64_t> PrefixCache::tail_freeable_pages(const Entry& e) const {
  std::vector<std::int64_t> pages(spec_->buckets.size(), 0);
  if (!e.live || e.users == 0 || !e.has_tail) return pages;
  for (const BlockRef& ref : e.tail) {
    if (pool_->ref_count(ref.group, ref.block) == 1) pages[static_cast<std::size_t>(pool_->bucket_of(ref.group))] += block_pages(ref);
  }
  return pages;
}

void PrefixCache::drop_tail(Entry& e) {
  for (const BlockRef& ref : e.tail) {
    pool_->decref(ref.group, ref.block);
    e.pages[static_cast<std::size_t>(pool_->bucket_of(ref.group))] -= block_pages(ref);
  }
  e.tail.clear();
  e.has_tail = false;
  ++stats_.tails_dropped;
}

std::vector<std::int64_t> PrefixCache::droppable_tail_pages() const {
  std::vector<std::int64_t> pages(spec_->buckets.size(), 0);
  for (const Entry& e : entries_) {
    const std::vector<std::int64_t> freeable = tail_freeable_pages(e);
    for (std::size_t b = 0; b < pages.size(); ++b) pages[b] += freeable[b];
  }
  return pages;
}

bool PrefixCache::reclaim(std::vector<std::int64_t> deficit) {
  auto short_anywhere = [&] { return std::any_of(deficit.begin(), deficit.end(), [](std::int64_t d) { return d > 0; }); };
  auto useful = [&](const std::vector<std::int64_t>& pages) {
    for (std::size_t b = 0; b < deficit.size(); ++b) {
      if (deficit[b] > 0 && pages[b] > 0) return true;
    }
    return false;
  };
  auto credit = [&](const std::vector<std::int64_t>& pages) {
    for (std::size_t b = 0; b < deficit.size(); ++b) deficit[b] -= pages[b];
  };
  // 1. Idle entries, least recently used first.
  for (auto it = idle_.begin(); it != idle_.end() && short_anywhere();) {
    const PrefixEntryId id = *it++;
    const Entry& e = entries_[static_cast<std::size_t>(id)];
    if (!useful(e.pages)) continue;
    credit(e.pages);
    evict(id);
  }
  if (!short_anywhere()) return true;
  // 2. Tails of entries in use, least recently used first: their blocks that only the cache
  //    holds are freed now, the others when the sequences holding them slide past.
  std::vector<std::pair<std::uint64_t, PrefixEntryId>> candidates;  // (last use, entry)
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    if (entries_[i].live && entries_[i].users > 0 && entries_[i].has_tail) {
      candidates.emplace_back(entries_[i].last_use, static_cast<PrefixEntryId>(i));
    }
  }
  std::sort(candidates.begin(), candidates.end());
  for (const auto& [last_use, id] : candidates) {
    if (!short_anywhere()) break;
    const std::vector<std::int64_t> freeable = tail_freeable_pages(entries_[static_cast<std::size_t>(id)]);
    if (!useful(freeable)) continue;
    credit(freeable);
    drop_tail(entries_[static_cast<std::size_t>(id)]);
  }
  return !short_anywhere();
}

void PrefixCache::evict_all_idle() {
  while (!idle_.empty()) evict(idle_.front());
}

}  // namespace dsv4
