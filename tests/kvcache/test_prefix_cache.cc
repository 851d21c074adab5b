// Prefix cache: hits at 256 boundaries only, shared blocks outliving their first owner,
// tails kept after the owner slid past them, LRU eviction order, token-checked hits, and
// hits never returning overwritten content (checked against a shadow of the cache memory).
#include <gtest/gtest.h>

#include <random>

#include "kvcache/kv_cache_manager.h"
#include "model/presets.h"
#include "shadow_cache.h"

namespace dsv4 {
namespace {

using test::prefix_keys;

std::vector<std::int32_t> random_tokens(std::int64_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::int32_t> t(static_cast<std::size_t>(n));
  for (auto& x : t) x = static_cast<std::int32_t>(rng() % 4096);
  return t;
}

std::vector<std::int32_t> head(const std::vector<std::int32_t>& t, std::int64_t n) {
  return {t.begin(), t.begin() + n};
}

class PrefixTest : public ::testing::Test {
 protected:
  explicit PrefixTest(std::vector<std::int64_t> pages = {3000, 800, 300})
      : m(CacheSpec::build(tiny_config(), {}), pages, true), shadow(m) {}

  // Computes seq `id` (tokens `tokens`) up to position `upto`, `chunk` positions a step,
  // writing the shadow memory as an executor would.
  void compute(SeqId id, const std::vector<std::int32_t>& tokens, std::int64_t upto, std::int64_t chunk = 100) {
    const auto keys = prefix_keys(tokens);
    while (m.sequence(id).num_computed < upto) {
      const std::int64_t start = m.sequence(id).num_computed;
      const std::int64_t n = std::min(chunk, upto - start);
      const AllocResult r = m.allocate(id, n);
      ASSERT_TRUE(r.ok()) << r.reason;
      const StepSlice slice{id, n};
      shadow.write(m.step_view({&slice, 1}), [&](std::size_t, std::int64_t p) { return keys[static_cast<std::size_t>(p)]; });
      m.commit(id, {tokens.data() + start, static_cast<std::size_t>(n)});
    }
  }
  std::string verify(SeqId id, const std::vector<std::int32_t>& tokens) {
    return shadow.verify(id, prefix_keys(tokens), true);
  }
  std::int64_t hit(SeqId id, const std::vector<std::int32_t>& prompt) { return m.add_sequence(id, prompt); }

  KvCacheManager m;
  test::ShadowCache shadow;
};

TEST_F(PrefixTest, HitsOnlyAt256Boundaries) {
  const auto a = random_tokens(600, 1);
  EXPECT_EQ(hit(1, a), 0);
  compute(1, a, 600);
  m.free(1);
  EXPECT_EQ(m.prefix_cache().size(), 2);  // blocks 0 and 1 are full; 512..599 is not

  EXPECT_EQ(hit(2, a), 512);
  EXPECT_EQ(verify(2, a), "");
  m.free(2);
  EXPECT_EQ(hit(3, head(a, 513)), 512);
  m.free(3);
  EXPECT_EQ(hit(4, head(a, 512)), 256);  // at least one token is always computed
  m.free(4);
  auto b = a;
  b[300] += 1;
  EXPECT_EQ(hit(5, b), 256);
  m.free(5);
  b[10] += 1;
  EXPECT_EQ(hit(6, b), 0);
  m.free(6);
  auto longer = a;
  longer.insert(longer.end(), 300, 9);
  EXPECT_EQ(hit(7, longer), 512);
  m.free(7);
  m.check_invariants();

  const PrefixCacheStats& s = m.prefix_cache().stats();
  EXPECT_EQ(s.queries, 7);
  EXPECT_EQ(s.query_tokens, 600 + 600 + 513 + 512 + 600 + 600 + 900);
  EXPECT_EQ(s.hit_tokens, 512 + 512 + 256 + 256 + 512);
  EXPECT_NEAR(s.hit_rate(), 2048.0 / 4325.0, 1e-12);
}

TEST_F(PrefixTest, SharedBlocksSurviveTheFirstOwnerFinishing) {
  const auto a = random_tokens(600, 2);
  hit(1, a);
  compute(1, a, 600);
  auto b = head(a, 520);
  const auto tail = random_tokens(280, 3);
  b.insert(b.end(), tail.begin(), tail.end());
  EXPECT_EQ(hit(2, b), 512);
  const int csa = m.spec().group_of(CacheKind::kCsaKv);
  const BlockId shared = m.sequence(2).tables[static_cast<std::size_t>(csa)].at(0);
  EXPECT_EQ(shared, m.sequence(1).tables[static_cast<std::size_t>(csa)].at(0));
  EXPECT_EQ(m.blocks().ref_count(csa, shared), 3);  // owner, cache, second user
  m.free(1);
  EXPECT_EQ(m.blocks().ref_count(csa, shared), 2);
  compute(2, b, 800, 37);
  EXPECT_EQ(verify(2, b), "");
  m.check_invariants();
}

TEST_F(PrefixTest, TailOutlivesTheOwnersWindow) {
  const auto a = random_tokens(1000, 4);
  hit(1, a);
  compute(1, a, 1000);
  // The owner's window starts at 873 now; the cache still holds the window and state at 512.
  EXPECT_GT(m.sequence(1).tables[static_cast<std::size_t>(m.spec().group_of(CacheKind::kWindowKv))].base, 512 / 64);
  EXPECT_EQ(hit(2, head(a, 700)), 512);
  EXPECT_EQ(verify(2, head(a, 700)), "");
  compute(2, a, 1000, 64);  // continuing from the hit reproduces the owner's entries
  EXPECT_EQ(verify(2, a), "");
  m.check_invariants();
}

TEST_F(PrefixTest, EvictsLeastRecentlyUsedDeepestFirst) {
  const auto a = random_tokens(769, 5), b = random_tokens(769, 6);
  hit(1, a);
  compute(1, a, 769);
  m.free(1);
  hit(2, b);
  compute(2, b, 769);
  m.free(2);
  EXPECT_EQ(hit(3, head(a, 300)), 256);  // touches a's block 0
  m.free(3);
  auto order = [&] {
    std::vector<std::pair<std::int32_t, std::int64_t>> o;  // (first token, logical block)
    for (PrefixEntryId id : m.prefix_cache().idle_lru()) {
      const auto& e = m.prefix_cache().entry(id);
      o.emplace_back(e.tokens[0], e.logical_block);
    }
    return o;
  };
  const auto a0 = a[0], a1 = a[256], a2 = a[512], b0 = b[0], b1 = b[256], b2 = b[512];
  EXPECT_EQ(order(), (std::vector<std::pair<std::int32_t, std::int64_t>>{{a2, 2}, {a1, 1}, {b2, 2}, {b1, 1}, {b0, 0}, {a0, 0}}));
  // Each entry holds one c128 page (bucket 2); ask for the room of three.
  const std::int64_t free2 = m.free_pages(2);
  ASSERT_TRUE(m.prefix_cache().reclaim({0, 0, 3}));
  EXPECT_EQ(m.free_pages(2), free2 + 3);
  EXPECT_EQ(order(), (std::vector<std::pair<std::int32_t, std::int64_t>>{{b1, 1}, {b0, 0}, {a0, 0}}));
  EXPECT_EQ(m.prefix_cache().stats().evicted, 3);
  EXPECT_EQ(hit(4, a), 256);
  EXPECT_EQ(hit(5, b), 512);
  EXPECT_EQ(verify(4, a), "");
  EXPECT_EQ(verify(5, b), "");
  m.check_invariants();
}

// Bucket 2 (c128 KV, one page per logical block) holds 5 pages: after the first sequence
// the cache keeps 2; a second sequence of 1,000 tokens needs 4, so one entry must go.
class TightPrefixTest : public PrefixTest {
 protected:
  TightPrefixTest() : PrefixTest({400, 200, 5}) {}
};

TEST_F(TightPrefixTest, HitNeverReturnsOverwrittenBlocks) {
  const auto a = random_tokens(600, 7), b = random_tokens(1000, 8);
  hit(1, a);
  compute(1, a, 600);
  m.free(1);
  hit(2, b);
  compute(2, b, 1000, 50);  // reuses the evicted entry's pages and writes them
  EXPECT_EQ(m.prefix_cache().stats().evicted, 1);
  m.free(2);
  EXPECT_EQ(hit(3, a), 256);  // the deepest block went first; block 0 is intact
  EXPECT_EQ(verify(3, a), "");
  m.free(3);
  m.check_invariants();
}

TEST_F(PrefixTest, HitsCheckTokensNotJustHashes) {
  const auto a = random_tokens(300, 9), x = random_tokens(300, 10);
  hit(1, a);
  compute(1, a, 300);
  m.free(1);
  // A forged entry: x's hash with a's tokens (as if two blocks collided in xxhash).
  const std::uint64_t forged = PrefixCache::chain_hash(0, {x.data(), 256});
  ASSERT_TRUE(m.prefix_cache().insert(forged, 0, 0, {a.data(), 256}, {}, {}).has_value());
  EXPECT_EQ(hit(2, x), 0);
  EXPECT_EQ(hit(3, a), 256);
  // The chain hash depends on the parent: the same 256 tokens after a different block differ.
  EXPECT_NE(PrefixCache::chain_hash(0, {a.data(), 256}), PrefixCache::chain_hash(1, {a.data(), 256}));
}

// Bucket 0 is sized so that one long request plus its cached tails fill it: a second
// request can only start once the tails of the first one's entries are dropped.
class TailPressureTest : public PrefixTest {
 protected:
  TailPressureTest() : PrefixTest({140, 100, 50}) {}
};

TEST_F(TailPressureTest, TailsGoBeforeLiveRequestsStarve) {
  const auto a = random_tokens(2100, 11), b = random_tokens(400, 12);
  hit(1, a);
  compute(1, a, 2000, 64);
  EXPECT_EQ(m.prefix_cache().size(), 7);
  hit(2, b);
  const AllocResult need = m.can_allocate(2, 150);
  ASSERT_TRUE(need.ok()) << need.reason;
  ASSERT_TRUE(m.allocate(2, 150).ok());
  EXPECT_GT(m.prefix_cache().stats().tails_dropped, 0);
  EXPECT_EQ(m.prefix_cache().stats().evicted, 0);  // entries in use keep their core
  m.check_invariants();
  m.free(2);
  compute(1, a, 2050, 10);
  EXPECT_EQ(verify(1, a), "");
  // A later hit falls back to the deepest boundary whose tail is still there.
  const std::int64_t h = hit(3, a);
  EXPECT_EQ(h % 256, 0);
  EXPECT_EQ(verify(3, a), "");
  m.check_invariants();
}

TEST(PrefixCacheDisabled, NoEntriesNoHits) {
  KvCacheManager m(CacheSpec::build(tiny_config(), {}), {500, 200, 50}, false);
  const auto a = random_tokens(600, 13);
  m.add_sequence(1, a);
  ASSERT_TRUE(m.allocate(1, 600).ok());
  m.commit(1, a);
  m.free(1);
  EXPECT_EQ(m.prefix_cache().size(), 0);
  EXPECT_EQ(m.add_sequence(2, a), 0);
  for (int b = 0; b < 3; ++b) EXPECT_EQ(m.used_pages(b), 0);
}

}  // namespace
}  // namespace dsv4
