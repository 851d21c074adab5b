// CacheSpec: which caches each layer needs, their entry formats, and the page-size buckets
// that all of them share (SPEC.md section 6). Built once from a ModelConfig.
//
// Cache kinds, from a layer's compress ratio r:
//   every layer   window KV       raw kv of the last `sliding_window` positions (sliding)
//   r = 4 (CSA)   c4 main KV      one entry per 4 positions
//                 indexer keys    one entry per 4 positions
//                 c4 state        compressor state (a, g) of the last 8 positions (sliding)
//                 indexer state   the indexer compressor's state, same window (sliding)
//   r = 128 (HCA) c128 main KV    one entry per 128 positions
//                 c128 state      compressor state of the current 128-block (sliding)
// All layers of one kind form one cache group: they share block ids (a block holds one page
// per layer of its group), so a request has at most seven block tables.
//
// Logical blocks: 256 positions for every kind. A compressed kind keeps one page per layer
// per logical block (64 c4 entries, 64 indexer entries, 2 c128 entries). A sliding kind
// keeps pages of `positions_per_block` positions (a power of two dividing 256), so a logical
// block spans 256 / positions_per_block of its blocks and only the live ones are held.
//
// Bucket rule (at most three page sizes for any config and dtype choice):
//   u = the data bytes of one main-KV entry (576 for fp8, 1024 for bf16). Every page size is
//       a multiple of u, so each pool is one tensor of u-byte rows.
//   The buckets are the pages of the compressed kinds, each rounded up to a multiple of u:
//       main   = 64 main-KV entries  (c4 main KV; always present: 64 window positions too)
//       index  = 64 indexer entries  (c4 indexer keys; only with CSA layers)
//       c128   = 2 main-KV entries   (c128 main KV; only with HCA layers)
//   equal sizes merge. Each sliding kind goes to the bucket of the cache it feeds (window KV
//   and c4 state -> main, indexer state -> index, c128 state -> c128) or, if not even one
//   position fits there, to the largest bucket; it takes the largest power-of-two number of
//   positions whose bytes fit the page. For V4 with fp8 main KV this gives vLLM's buckets
//   (37,440 B: c4 KV, window, c4 state, c128 state; 8,640 B (fp8 indexer) or 4,608 B (fp4):
//   indexer keys and indexer state; 1,728 B: c128 KV).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvcache/entry_layout.h"
#include "model/model_config.h"

namespace dsv4 {

inline constexpr std::int64_t kLogicalBlockTokens = 256;

enum class KvCacheDtype { kBf16, kFp8 };
enum class IndexerCacheDtype { kBf16, kFp8, kFp4 };

// "bf16" / "fp8" (/ "fp4"); anything else throws Error naming the accepted values.
KvCacheDtype parse_kv_cache_dtype(std::string_view name);
IndexerCacheDtype parse_indexer_cache_dtype(std::string_view name);
std::string_view cache_dtype_name(KvCacheDtype dtype);
std::string_view cache_dtype_name(IndexerCacheDtype dtype);

enum class CacheKind { kWindowKv, kCsaKv, kHcaKv, kIndexerKv, kCsaState, kIndexerState, kHcaState };
inline constexpr int kNumCacheKinds = 7;
inline constexpr std::array<CacheKind, kNumCacheKinds> kAllCacheKinds = {
    CacheKind::kWindowKv, CacheKind::kCsaKv,        CacheKind::kHcaKv,    CacheKind::kIndexerKv,
    CacheKind::kCsaState, CacheKind::kIndexerState, CacheKind::kHcaState};

std::string_view cache_kind_name(CacheKind kind);   // "window_kv", "csa_kv", ... (grep-able, JSON)
std::string_view cache_kind_title(CacheKind kind);  // "window KV", "c4 main KV", ... (for people)
bool is_compressed_kind(CacheKind kind);            // csa_kv, hca_kv, indexer_kv

// Entry formats (entry_layout.h documents the bytes).
EntryFormat main_kv_format(const ModelConfig& config, KvCacheDtype dtype);
EntryFormat indexer_kv_format(const ModelConfig& config, IndexerCacheDtype dtype);
EntryFormat compressor_state_format(std::int64_t coff, std::int64_t head_dim);

struct CacheOptions {
  KvCacheDtype kv_dtype = KvCacheDtype::kBf16;
  IndexerCacheDtype indexer_dtype = IndexerCacheDtype::kBf16;
  bool mtp_layers = true;  // give the MTP blocks (window-only) their window caches too
};

// One cache kind across all the layers that hold it.
struct CacheGroup {
  CacheKind kind = CacheKind::kWindowKv;
  std::vector<std::int64_t> layers;    // ascending; a block holds one page per layer, in this order
  std::int64_t tokens_per_entry = 1;   // 1 (window, states), 4 (c4, indexer), 128 (c128)
  std::int64_t positions_per_block = kLogicalBlockTokens;  // positions one block covers
  EntryFormat format;
  int bucket = 0;                      // index into CacheSpec::buckets
  std::int64_t page_bytes = 0;         // the bucket's size
  // Sliding kinds: positions < keep_from(n) are dead once n positions are computed, with
  // keep_from(n) = max(0, floor(n / keep_align) * keep_align - keep_extent).
  bool sliding = false;
  std::int64_t keep_align = 1;
  std::int64_t keep_extent = 0;

  std::int64_t entries_per_block() const { return positions_per_block / tokens_per_entry; }
  // Compressor state: a step stores only the positions later steps (or a prefix hit) need;
  // the step's own tokens are pooled from the step's projections.
  bool is_compressor_state() const { return sliding && kind != CacheKind::kWindowKv; }
  std::int64_t num_layers() const { return static_cast<std::int64_t>(layers.size()); }
  PageLayout layout() const { return {format, entries_per_block(), page_bytes}; }
  std::int64_t keep_from(std::int64_t computed) const;
  // Index of `layer` in `layers` (its page within a block); -1 if the layer lacks this kind.
  std::int64_t layer_slot(std::int64_t layer) const;
};

struct CacheSpec {
  CacheOptions options;
  std::int64_t num_layers = 0;         // layers with caches (main + MTP when options.mtp_layers)
  std::int64_t num_main_layers = 0;    // the decoder layers; layers above are MTP blocks
  std::int64_t alignment = 0;          // u: every page size is a multiple of it
  std::vector<std::int64_t> buckets;   // distinct page sizes, largest first (at most three)
  std::vector<CacheGroup> groups;      // the kinds present, in CacheKind order

  // Validates what the cache needs from the config (ratios 0/4/128, dims, window <= 256)
  // and throws Error naming the field otherwise.
  static CacheSpec build(const ModelConfig& config, const CacheOptions& options);

  int group_of(CacheKind kind) const;  // -1 when no layer has this kind
  const CacheGroup& group(CacheKind kind) const;  // throws when absent
  int num_groups() const { return static_cast<int>(groups.size()); }
};

}  // namespace dsv4
