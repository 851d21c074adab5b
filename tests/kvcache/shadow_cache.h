// Test helper: a shadow of the cache memory. Every page entry holds a 64-bit "content key"
// instead of kv bytes. A step writes, at each token's slot in every layer, a key derived
// from the token ids up to the entry's last position; verifying a sequence reads back every
// entry it still needs and compares. Two sequences with the same prefix write the same
// keys, so prefix hits verify too, while any page handed out twice, freed too early or
// overwritten under a reader shows up as a mismatch.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "kvcache/kv_cache_manager.h"

namespace dsv4::test {

inline std::uint64_t mix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// keys[p] identifies tokens[0..p].
inline std::vector<std::uint64_t> prefix_keys(std::span<const std::int32_t> tokens) {
  std::vector<std::uint64_t> keys(tokens.size());
  std::uint64_t k = 0x1234;
  for (std::size_t p = 0; p < tokens.size(); ++p) keys[p] = k = mix64(k ^ (static_cast<std::uint64_t>(tokens[p]) + 1));
  return keys;
}

class ShadowCache {
 public:
  explicit ShadowCache(const KvCacheManager& m) : m_(&m) {
    for (const CacheGroup& g : m.spec().groups) stride_ = std::max(stride_, g.entries_per_block());
    for (int b = 0; b < m.blocks().num_buckets(); ++b) {
      mem_.emplace_back(static_cast<std::size_t>(m.blocks().pool(b).num_pages() * stride_), 0);
    }
  }

  // Writes every slot of the step; content(row, position) is the key of the token that the
  // row computes at that position.
  void write(const StepView& view, const std::function<std::uint64_t(std::size_t, std::int64_t)>& content) {
    for (std::size_t g = 0; g < view.groups.size(); ++g) {
      const CacheGroup& group = m_->spec().groups[g];
      for (std::size_t row = 0; row < view.seqs.size(); ++row) {
        for (auto t = view.token_start[row]; t < view.token_start[row + 1]; ++t) {
          const std::int64_t slot = view.groups[g].slot_mapping[static_cast<std::size_t>(t)];
          if (slot < 0) continue;
          const std::uint64_t key = content(row, view.positions[static_cast<std::size_t>(t)]);
          const auto block = static_cast<BlockId>(slot / group.entries_per_block());
          const auto pages = m_->blocks().block_pages(static_cast<int>(g), block);
          for (std::size_t s = 0; s < pages.size(); ++s) {
            cell(group.bucket, pages[s], slot % group.entries_per_block()) = mix64(key ^ mix64(g * 1000 + s));
          }
        }
      }
    }
  }

  // "" when every entry `id` still needs holds the key of `keys` (the sequence's real
  // tokens); otherwise the first mismatch. `full` checks all compressed entries, else only
  // the newest logical block's (windows and states are always checked whole).
  std::string verify(SeqId id, std::span<const std::uint64_t> keys, bool full) const {
    const SequenceCache& s = m_->sequence(id);
    for (int g = 0; g < m_->spec().num_groups(); ++g) {
      const CacheGroup& group = m_->spec().groups[static_cast<std::size_t>(g)];
      const BlockTable& table = s.tables[static_cast<std::size_t>(g)];
      auto check = [&](std::int64_t entry, std::int64_t last_position) -> std::string {
        const std::int64_t slot = entry_slot(group, table, entry);
        if (slot < 0) return fmt::format("seq {} {} entry {}: no slot", id, cache_kind_name(group.kind), entry);
        const auto block = static_cast<BlockId>(slot / group.entries_per_block());
        const auto pages = m_->blocks().block_pages(g, block);
        for (std::size_t l = 0; l < pages.size(); ++l) {
          if (m_->blocks().pool(group.bucket).is_free(pages[l])) {
            return fmt::format("seq {} {} entry {}: page {} is free", id, cache_kind_name(group.kind), entry, pages[l]);
          }
          const std::uint64_t want = mix64(keys[static_cast<std::size_t>(last_position)] ^ mix64(static_cast<std::uint64_t>(g) * 1000 + l));
          const std::uint64_t got = mem_[static_cast<std::size_t>(group.bucket)]
                                        [static_cast<std::size_t>(pages[l] * stride_ + slot % group.entries_per_block())];
          if (got != want) {
            return fmt::format("seq {} {} entry {} layer slot {}: content overwritten or never written", id,
                               cache_kind_name(group.kind), entry, l);
          }
        }
        return "";
      };
      if (group.sliding) {
        for (std::int64_t p = group.keep_from(s.num_computed); p < s.num_computed; ++p) {
          if (auto e = check(p, p); !e.empty()) return e;
        }
      } else {
        const std::int64_t r = group.tokens_per_entry, entries = s.num_computed / r;
        const std::int64_t per_block = group.entries_per_block();
        const std::int64_t last_block = entries == 0 ? 0 : (entries - 1) / per_block * per_block;
        for (std::int64_t j = full ? 0 : last_block; j < entries; ++j) {
          if (auto e = check(j, (j + 1) * r - 1); !e.empty()) return e;
        }
      }
    }
    return "";
  }

 private:
  std::uint64_t& cell(int bucket, PageId page, std::int64_t entry) {
    return mem_[static_cast<std::size_t>(bucket)][static_cast<std::size_t>(page * stride_ + entry)];
  }

  const KvCacheManager* m_;
  std::int64_t stride_ = 1;
  std::vector<std::vector<std::uint64_t>> mem_;
};

}  // namespace dsv4::test
