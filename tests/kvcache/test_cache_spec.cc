// Cache kinds per layer, entry formats, byte layouts and the page-size bucket rule.
#include <gtest/gtest.h>

#include <random>

#include "common/error.h"
#include "kvcache/cache_spec.h"
#include "model/presets.h"

namespace dsv4 {
namespace {

CacheSpec spec_of(const ModelConfig& c, KvCacheDtype kv, IndexerCacheDtype idx) {
  CacheOptions o;
  o.kv_dtype = kv;
  o.indexer_dtype = idx;
  return CacheSpec::build(c, o);
}

TEST(CacheSpec, KindsPerLayerFollowCompressRatios) {
  const CacheSpec flash = CacheSpec::build(v4_flash_config(), {});
  EXPECT_EQ(flash.num_layers, 44);  // 43 + MTP
  EXPECT_EQ(flash.group(CacheKind::kWindowKv).num_layers(), 44);
  EXPECT_EQ(flash.group(CacheKind::kCsaKv).num_layers(), 21);
  EXPECT_EQ(flash.group(CacheKind::kIndexerKv).num_layers(), 21);
  EXPECT_EQ(flash.group(CacheKind::kCsaState).num_layers(), 21);
  EXPECT_EQ(flash.group(CacheKind::kIndexerState).num_layers(), 21);
  EXPECT_EQ(flash.group(CacheKind::kHcaKv).num_layers(), 20);
  EXPECT_EQ(flash.group(CacheKind::kHcaState).num_layers(), 20);
  EXPECT_EQ(flash.group(CacheKind::kCsaKv).layer_slot(2), 0);
  EXPECT_EQ(flash.group(CacheKind::kCsaKv).layer_slot(42), 20);
  EXPECT_EQ(flash.group(CacheKind::kCsaKv).layer_slot(3), -1);
  EXPECT_EQ(flash.group(CacheKind::kHcaKv).layer_slot(3), 0);

  const CacheSpec pro = CacheSpec::build(v4_pro_config(), {});
  EXPECT_EQ(pro.group(CacheKind::kWindowKv).num_layers(), 62);
  EXPECT_EQ(pro.group(CacheKind::kCsaKv).num_layers(), 30);
  EXPECT_EQ(pro.group(CacheKind::kHcaKv).num_layers(), 31);

  CacheOptions no_mtp;
  no_mtp.mtp_layers = false;
  EXPECT_EQ(CacheSpec::build(v4_pro_config(), no_mtp).group(CacheKind::kWindowKv).num_layers(), 61);

  ModelConfig window_only = tiny_config();
  window_only.compress_ratios = {0, 0, 0, 0, 0};
  const CacheSpec w = CacheSpec::build(window_only, {});
  ASSERT_EQ(w.num_groups(), 1);
  EXPECT_EQ(w.buckets.size(), 1u);
  EXPECT_EQ(w.group_of(CacheKind::kCsaKv), -1);
  EXPECT_THROW(w.group(CacheKind::kCsaKv), Error);
}

TEST(CacheSpec, EntryFormatsMatchSpecSection5) {
  const ModelConfig c = v4_pro_config();
  EXPECT_EQ(main_kv_format(c, KvCacheDtype::kBf16).entry_bytes(), 1024);
  EXPECT_EQ(main_kv_format(c, KvCacheDtype::kFp8), (EntryFormat{576, 8}));  // 448 + 128, 7 scales + pad
  EXPECT_EQ(indexer_kv_format(c, IndexerCacheDtype::kBf16).entry_bytes(), 256);
  EXPECT_EQ(indexer_kv_format(c, IndexerCacheDtype::kFp8), (EntryFormat{128, 4}));
  EXPECT_EQ(indexer_kv_format(c, IndexerCacheDtype::kFp4), (EntryFormat{64, 4}));
  const CacheSpec s = CacheSpec::build(c, {});
  EXPECT_EQ(s.group(CacheKind::kCsaState).format.entry_bytes(), 8192);      // 2 * 2 * 512 * 4
  EXPECT_EQ(s.group(CacheKind::kIndexerState).format.entry_bytes(), 2048);  // 2 * 2 * 128 * 4
  EXPECT_EQ(s.group(CacheKind::kHcaState).format.entry_bytes(), 4096);      // 2 * 1 * 512 * 4
}

TEST(CacheSpec, Fp8PageLayoutPutsDataFirstThenScales) {
  const CacheSpec s = spec_of(v4_pro_config(), KvCacheDtype::kFp8, IndexerCacheDtype::kFp4);
  const PageLayout c4 = s.group(CacheKind::kCsaKv).layout();
  EXPECT_EQ(c4.entries, 64);
  EXPECT_EQ(c4.data_offset(0), 0);
  EXPECT_EQ(c4.data_offset(5), 5 * 576);
  EXPECT_EQ(c4.scale_offset(0), 64 * 576);
  EXPECT_EQ(c4.scale_offset(63), 64 * 576 + 63 * 8);
  EXPECT_EQ(c4.used_bytes(), 37376);
  EXPECT_EQ(c4.page_bytes, 37440);
  EXPECT_EQ(c4.page_bytes % 576, 0);
  const MainKvFp8Layout fp8;
  EXPECT_EQ(fp8.rope_offset(), 448);
  EXPECT_EQ(fp8.scale_count(), 7);

  const PageLayout c128 = s.group(CacheKind::kHcaKv).layout();
  EXPECT_EQ(c128.entries, 2);
  EXPECT_EQ(c128.scale_offset(1), 2 * 576 + 8);
  EXPECT_EQ(c128.page_bytes, 1728);

  const PageLayout idx = s.group(CacheKind::kIndexerKv).layout();
  EXPECT_EQ(idx.data_offset(3), 3 * 64);
  EXPECT_EQ(idx.scale_offset(3), 64 * 64 + 3 * 4);
  EXPECT_EQ(idx.page_bytes, 4608);

  const CompressorStateLayout state{2 * 512};
  EXPECT_EQ(state.score_offset(), 4096);
  EXPECT_EQ(state.bytes(), 8192);
}

struct Placement {
  CacheKind kind;
  std::int64_t page_bytes;
  std::int64_t positions_per_block;
};

void expect_placements(const CacheSpec& s, const std::vector<std::int64_t>& buckets, const std::vector<Placement>& want) {
  EXPECT_EQ(s.buckets, buckets);
  for (const Placement& p : want) {
    const CacheGroup& g = s.group(p.kind);
    EXPECT_EQ(g.page_bytes, p.page_bytes) << cache_kind_name(p.kind);
    EXPECT_EQ(g.positions_per_block, p.positions_per_block) << cache_kind_name(p.kind);
    EXPECT_EQ(s.buckets[static_cast<std::size_t>(g.bucket)], g.page_bytes);
  }
}

TEST(CacheSpec, BucketsReproduceVllmWithFp8) {
  // SPEC section 6: 37,440 B for c4 main KV, window KV and both main compressor states;
  // 8,640 B for indexer keys and their compressor state; 1,728 B for c128 main KV.
  for (const ModelConfig& c : {v4_flash_config(), v4_pro_config()}) {
    expect_placements(spec_of(c, KvCacheDtype::kFp8, IndexerCacheDtype::kFp8), {37440, 8640, 1728},
                      {{CacheKind::kCsaKv, 37440, 256},
                       {CacheKind::kWindowKv, 37440, 64},
                       {CacheKind::kCsaState, 37440, 4},
                       {CacheKind::kHcaState, 37440, 8},
                       {CacheKind::kIndexerKv, 8640, 256},
                       {CacheKind::kIndexerState, 8640, 4},
                       {CacheKind::kHcaKv, 1728, 256}});
  }
}

TEST(CacheSpec, BucketsForFp4IndexerAndBf16) {
  expect_placements(spec_of(v4_pro_config(), KvCacheDtype::kFp8, IndexerCacheDtype::kFp4), {37440, 4608, 1728},
                    {{CacheKind::kIndexerKv, 4608, 256}, {CacheKind::kIndexerState, 4608, 2}, {CacheKind::kHcaState, 37440, 8}});
  expect_placements(spec_of(v4_flash_config(), KvCacheDtype::kBf16, IndexerCacheDtype::kBf16), {65536, 16384, 2048},
                    {{CacheKind::kCsaKv, 65536, 256},
                     {CacheKind::kWindowKv, 65536, 64},
                     {CacheKind::kCsaState, 65536, 8},
                     {CacheKind::kHcaState, 65536, 16},
                     {CacheKind::kIndexerKv, 16384, 256},
                     {CacheKind::kIndexerState, 16384, 8},
                     {CacheKind::kHcaKv, 2048, 256}});
  // A bf16 main cache with an fp4 indexer: 64 x 68 = 4,352 B rounds up to 5 x 1024.
  EXPECT_EQ(spec_of(v4_flash_config(), KvCacheDtype::kBf16, IndexerCacheDtype::kFp4).buckets,
            (std::vector<std::int64_t>{65536, 5120, 2048}));
}

// The rule holds for any structure and dims: at most three buckets, every page a multiple
// of the alignment, every kind fitting its page, sliding pages a power of two dividing 256.
TEST(CacheSpec, BucketRulePropertiesOnRandomConfigs) {
  std::mt19937_64 rng(7);
  auto pick = [&](std::vector<std::int64_t> v) { return v[rng() % v.size()]; };
  for (int trial = 0; trial < 300; ++trial) {
    ModelConfig c = tiny_config();
    c.qk_rope_head_dim = pick({32, 64});
    c.head_dim = c.qk_rope_head_dim + pick({64, 128, 192, 256, 448, 512, 960});
    c.index_head_dim = pick({32, 64, 128, 256});
    c.sliding_window = pick({1, 16, 100, 128, 256});
    c.num_hidden_layers = 1 + static_cast<std::int64_t>(rng() % 12);
    c.num_nextn_predict_layers = static_cast<std::int64_t>(rng() % 2);
    c.compress_ratios.clear();
    for (std::int64_t i = 0; i < c.num_hidden_layers + c.num_nextn_predict_layers; ++i) c.compress_ratios.push_back(pick({0, 4, 128}));
    for (KvCacheDtype kv : {KvCacheDtype::kBf16, KvCacheDtype::kFp8}) {
      for (IndexerCacheDtype idx : {IndexerCacheDtype::kBf16, IndexerCacheDtype::kFp8, IndexerCacheDtype::kFp4}) {
        const CacheSpec s = spec_of(c, kv, idx);
        ASSERT_GE(s.buckets.size(), 1u);
        ASSERT_LE(s.buckets.size(), 3u);
        for (std::int64_t b : s.buckets) EXPECT_EQ(b % s.alignment, 0);
        for (const CacheGroup& g : s.groups) {
          const PageLayout layout = g.layout();
          EXPECT_GT(layout.entries, 0);
          EXPECT_LE(layout.used_bytes(), layout.page_bytes) << cache_kind_name(g.kind);
          EXPECT_EQ(kLogicalBlockTokens % g.positions_per_block, 0);
          EXPECT_EQ(g.positions_per_block & (g.positions_per_block - 1), 0);
          if (!g.sliding) {
            EXPECT_EQ(g.positions_per_block, kLogicalBlockTokens);
          } else {
            EXPECT_LE(g.keep_extent + g.keep_align, kLogicalBlockTokens);
          }
        }
      }
    }
  }
}

TEST(CacheSpec, SlidingWindowsKeepWhatTheNextTokenReads) {
  const CacheSpec s = CacheSpec::build(v4_flash_config(), {});
  const CacheGroup& window = s.group(CacheKind::kWindowKv);
  EXPECT_EQ(window.keep_from(0), 0);
  EXPECT_EQ(window.keep_from(127), 0);
  EXPECT_EQ(window.keep_from(128), 1);  // the query at 128 reads 1..128
  EXPECT_EQ(window.keep_from(1000), 873);
  const CacheGroup& c4 = s.group(CacheKind::kCsaState);
  EXPECT_EQ(c4.keep_from(3), 0);
  EXPECT_EQ(c4.keep_from(8), 4);    // block 1 done; its first halves feed block 2
  EXPECT_EQ(c4.keep_from(11), 4);   // pending 8..10 plus block 1
  EXPECT_EQ(c4.keep_from(256), 252);
  const CacheGroup& c128 = s.group(CacheKind::kHcaState);
  EXPECT_EQ(c128.keep_from(127), 0);
  EXPECT_EQ(c128.keep_from(128), 128);  // nothing pending at a 128 boundary
  EXPECT_EQ(c128.keep_from(300), 256);
  EXPECT_EQ(s.group(CacheKind::kCsaKv).keep_from(5000), 0);
}

TEST(CacheSpec, RejectsWhatItCannotHold) {
  ModelConfig c = tiny_config();
  c.compress_ratios[1] = 8;
  EXPECT_THROW(CacheSpec::build(c, {}), Error);
  c = tiny_config();
  c.sliding_window = 512;
  EXPECT_THROW(CacheSpec::build(c, {}), Error);
  c = tiny_config();
  c.compress_ratios.resize(2);
  EXPECT_THROW(CacheSpec::build(c, {}), Error);
  EXPECT_THROW(parse_kv_cache_dtype("fp4"), Error);
  EXPECT_THROW(parse_indexer_cache_dtype("int8"), Error);
  EXPECT_EQ(parse_indexer_cache_dtype("fp4"), IndexerCacheDtype::kFp4);
}

}  // namespace
}  // namespace dsv4
