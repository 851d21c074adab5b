// CacheSpec construction: cache kinds per layer, entry formats, and the bucket rule
// documented in cache_spec.h.
#include "kvcache/cache_spec.h"

#include <algorithm>
#include <functional>

#include "common/error.h"

namespace dsv4 {
namespace {

std::int64_t round_up(std::int64_t x, std::int64_t unit) { return (x + unit - 1) / unit * unit; }
std::int64_t ceil_div(std::int64_t x, std::int64_t y) { return (x + y - 1) / y; }

// Entries of a compressed kind in one logical block.
constexpr std::int64_t kC4Entries = kLogicalBlockTokens / 4;     // 64
constexpr std::int64_t kC128Entries = kLogicalBlockTokens / 128;  // 2

// The largest power of two P <= 256 with P * bytes <= page (0 if even one position is too big).
std::int64_t positions_fitting(std::int64_t bytes_per_position, std::int64_t page) {
  for (std::int64_t p = kLogicalBlockTokens; p >= 1; p /= 2) {
    if (p * bytes_per_position <= page) return p;
  }
  return 0;
}

}  // namespace

KvCacheDtype parse_kv_cache_dtype(std::string_view name) {
  if (name == "bf16") return KvCacheDtype::kBf16;
  if (name == "fp8") return KvCacheDtype::kFp8;
  fail("kv cache dtype: expected bf16 or fp8, found '{}'", name);
}

IndexerCacheDtype parse_indexer_cache_dtype(std::string_view name) {
  if (name == "bf16") return IndexerCacheDtype::kBf16;
  if (name == "fp8") return IndexerCacheDtype::kFp8;
  if (name == "fp4") return IndexerCacheDtype::kFp4;
  fail("indexer cache dtype: expected bf16, fp8 or fp4, found '{}'", name);
}

std::string_view cache_dtype_name(KvCacheDtype dtype) {
  return dtype == KvCacheDtype::kFp8 ? "fp8" : "bf16";
}

std::string_view cache_dtype_name(IndexerCacheDtype dtype) {
  switch (dtype) {
    case IndexerCacheDtype::kBf16: return "bf16";
    case IndexerCacheDtype::kFp8: return "fp8";
    case IndexerCacheDtype::kFp4: return "fp4";
  }
  return "?";
}

std::string_view cache_kind_name(CacheKind kind) {
  switch (kind) {
    case CacheKind::kWindowKv: return "window_kv";
    case CacheKind::kCsaKv: return "csa_kv";
    case CacheKind::kHcaKv: return "hca_kv";
    case CacheKind::kIndexerKv: return "indexer_kv";
    case CacheKind::kCsaState: return "csa_state";
    case CacheKind::kIndexerState: return "indexer_state";
    case CacheKind::kHcaState: return "hca_state";
  }
  return "?";
}

std::string_view cache_kind_title(CacheKind kind) {
  switch (kind) {
    case CacheKind::kWindowKv: return "window KV";
    case CacheKind::kCsaKv: return "c4 main KV";
    case CacheKind::kHcaKv: return "c128 main KV";
    case CacheKind::kIndexerKv: return "c4 indexer keys";
    case CacheKind::kCsaState: return "c4 compressor state";
    case CacheKind::kIndexerState: return "c4 indexer compressor state";
    case CacheKind::kHcaState: return "c128 compressor state";
  }
  return "?";
}

bool is_compressed_kind(CacheKind kind) {
  return kind == CacheKind::kCsaKv || kind == CacheKind::kHcaKv || kind == CacheKind::kIndexerKv;
}

EntryFormat main_kv_format(const ModelConfig& config, KvCacheDtype dtype) {
  const std::int64_t rope = config.qk_rope_head_dim;
  const std::int64_t nope = config.head_dim - rope;
  if (dtype == KvCacheDtype::kBf16) return {config.head_dim * 2, 0};
  const MainKvFp8Layout fp8{nope, rope};
  return {nope + rope * 2, round_up(fp8.scale_count(), 8)};
}

EntryFormat indexer_kv_format(const ModelConfig& config, IndexerCacheDtype dtype) {
  const std::int64_t dims = config.index_head_dim;
  switch (dtype) {
    case IndexerCacheDtype::kBf16: return {dims * 2, 0};
    case IndexerCacheDtype::kFp8: return {dims, ceil_div(dims, 128) * 4};
    case IndexerCacheDtype::kFp4: return {ceil_div(dims, 2), ceil_div(dims, 32)};
  }
  return {};
}

EntryFormat compressor_state_format(std::int64_t coff, std::int64_t head_dim) {
  return {CompressorStateLayout{coff * head_dim}.bytes(), 0};
}

std::int64_t CacheGroup::keep_from(std::int64_t computed) const {
  if (!sliding) return 0;
  return std::max<std::int64_t>(0, computed / keep_align * keep_align - keep_extent);
}

std::int64_t CacheGroup::layer_slot(std::int64_t layer) const {
  auto it = std::lower_bound(layers.begin(), layers.end(), layer);
  if (it == layers.end() || *it != layer) return -1;
  return it - layers.begin();
}

int CacheSpec::group_of(CacheKind kind) const {
  for (int g = 0; g < num_groups(); ++g) {
    if (groups[static_cast<std::size_t>(g)].kind == kind) return g;
  }
  return -1;
}

const CacheGroup& CacheSpec::group(CacheKind kind) const {
  int g = group_of(kind);
  if (g < 0) fail("cache spec: this model has no {} cache", cache_kind_name(kind));
  return groups[static_cast<std::size_t>(g)];
}

CacheSpec CacheSpec::build(const ModelConfig& config, const CacheOptions& options) {
  CacheSpec spec;
  spec.options = options;
  spec.num_main_layers = config.num_hidden_layers;
  spec.num_layers = config.num_hidden_layers + (options.mtp_layers ? config.num_nextn_predict_layers : 0);
  if (config.num_hidden_layers <= 0) fail("cache spec: num_hidden_layers must be positive, found {}", config.num_hidden_layers);
  if (static_cast<std::int64_t>(config.compress_ratios.size()) < spec.num_layers) {
    fail("cache spec: compress_ratios has {} entries, expected at least {} (layers + MTP blocks)",
         config.compress_ratios.size(), spec.num_layers);
  }
  if (config.qk_rope_head_dim <= 0 || config.head_dim <= config.qk_rope_head_dim) {
    fail("cache spec: need 0 < qk_rope_head_dim < head_dim, found {} and {}", config.qk_rope_head_dim,
         config.head_dim);
  }
  if (config.sliding_window < 1 || config.sliding_window > kLogicalBlockTokens) {
    fail("cache spec: sliding_window must be in [1, {}] (a window must fit in one logical block), found {}",
         kLogicalBlockTokens, config.sliding_window);
  }

  std::array<std::vector<std::int64_t>, kNumCacheKinds> layers_of;
  auto add = [&](CacheKind kind, std::int64_t layer) { layers_of[static_cast<std::size_t>(kind)].push_back(layer); };
  for (std::int64_t layer = 0; layer < spec.num_layers; ++layer) {
    const std::int64_t r = config.compress_ratios[static_cast<std::size_t>(layer)];
    add(CacheKind::kWindowKv, layer);
    if (r == 4) {
      add(CacheKind::kCsaKv, layer);
      add(CacheKind::kIndexerKv, layer);
      add(CacheKind::kCsaState, layer);
      add(CacheKind::kIndexerState, layer);
    } else if (r == 128) {
      add(CacheKind::kHcaKv, layer);
      add(CacheKind::kHcaState, layer);
    } else if (r != 0) {
      fail("cache spec: compress_ratios[{}] = {}, expected 0, 4 or 128", layer, r);
    }
  }
  const bool has_csa = !layers_of[static_cast<std::size_t>(CacheKind::kCsaKv)].empty();
  const bool has_hca = !layers_of[static_cast<std::size_t>(CacheKind::kHcaKv)].empty();
  if (has_csa && config.index_head_dim <= 0) fail("cache spec: CSA layers need index_head_dim > 0, found {}", config.index_head_dim);

  const EntryFormat main = main_kv_format(config, options.kv_dtype);
  const EntryFormat index = indexer_kv_format(config, options.indexer_dtype);
  spec.alignment = main.data_bytes;
  const std::int64_t main_page = round_up(kC4Entries * main.entry_bytes(), spec.alignment);
  const std::int64_t index_page = has_csa ? round_up(kC4Entries * index.entry_bytes(), spec.alignment) : 0;
  const std::int64_t c128_page = has_hca ? round_up(kC128Entries * main.entry_bytes(), spec.alignment) : 0;
  for (std::int64_t page : {main_page, index_page, c128_page}) {
    if (page > 0 && std::find(spec.buckets.begin(), spec.buckets.end(), page) == spec.buckets.end()) {
      spec.buckets.push_back(page);
    }
  }
  std::sort(spec.buckets.begin(), spec.buckets.end(), std::greater<>());
  auto bucket_of = [&](std::int64_t page) {
    return static_cast<int>(std::find(spec.buckets.begin(), spec.buckets.end(), page) - spec.buckets.begin());
  };

  for (CacheKind kind : kAllCacheKinds) {
    CacheGroup g;
    g.kind = kind;
    g.layers = layers_of[static_cast<std::size_t>(kind)];
    if (g.layers.empty()) continue;
    std::int64_t home = main_page;  // the bucket of the cache this kind feeds
    switch (kind) {
      case CacheKind::kWindowKv:
        g.format = main;
        g.sliding = true;
        g.keep_align = 1;
        g.keep_extent = config.sliding_window - 1;  // the query at n reads n-win+1 .. n
        break;
      case CacheKind::kCsaKv:
        g.format = main;
        g.tokens_per_entry = 4;
        break;
      case CacheKind::kHcaKv:
        g.format = main;
        g.tokens_per_entry = 128;
        home = c128_page;
        break;
      case CacheKind::kIndexerKv:
        g.format = index;
        g.tokens_per_entry = 4;
        home = index_page;
        break;
      case CacheKind::kCsaState:
      case CacheKind::kIndexerState:
        // The pending block and the previous block's 4 positions (their first halves feed
        // the next entry): positions >= 4*floor(n/4) - 4.
        g.format = compressor_state_format(2, kind == CacheKind::kCsaState ? config.head_dim : config.index_head_dim);
        g.sliding = true;
        g.keep_align = 4;
        g.keep_extent = 4;
        if (kind == CacheKind::kIndexerState) home = index_page;
        break;
      case CacheKind::kHcaState:
        // Only the pending 128-block: positions >= 128*floor(n/128).
        g.format = compressor_state_format(1, config.head_dim);
        g.sliding = true;
        g.keep_align = 128;
        g.keep_extent = 0;
        home = c128_page;
        break;
    }
    if (g.sliding) {
      std::int64_t positions = positions_fitting(g.format.entry_bytes(), home);
      if (positions == 0) {
        home = spec.buckets.front();
        positions = positions_fitting(g.format.entry_bytes(), home);
      }
      if (positions == 0) {
        fail("cache spec: one position of {} ({} B) does not fit the largest page ({} B)", cache_kind_name(kind),
             g.format.entry_bytes(), home);
      }
      g.positions_per_block = positions;
    }
    g.bucket = bucket_of(home);
    g.page_bytes = home;
    spec.groups.push_back(std::move(g));
  }
  return spec;
}

}  // namespace dsv4
