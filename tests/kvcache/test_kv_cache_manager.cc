// KvCacheManager unit tests on the tiny preset (layers: window, CSA, HCA, CSA, MTP window),
// bf16 entries: buckets 65,536 B (window / c4 KV / c4 state / c128 state), 16,384 B
// (indexer keys and state) and 2,048 B (c128 KV).
#include <gtest/gtest.h>

#include <numeric>

#include "kvcache/kv_cache_manager.h"
#include "model/presets.h"
#include "shadow_cache.h"

namespace dsv4 {
namespace {

std::vector<std::int32_t> iota_tokens(std::int64_t n, std::int32_t first = 1) {
  std::vector<std::int32_t> t(static_cast<std::size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

std::span<const std::int32_t> part(const std::vector<std::int32_t>& t, std::int64_t from, std::int64_t n) {
  return {t.data() + from, static_cast<std::size_t>(n)};
}

class ManagerTest : public ::testing::Test {
 protected:
  explicit ManagerTest(std::vector<std::int64_t> pages = {2000, 500, 200}, bool prefix = true)
      : m(CacheSpec::build(tiny_config(), {}), pages, prefix) {}
  int g(CacheKind k) const { return m.spec().group_of(k); }
  const BlockTable& table(SeqId id, CacheKind k) const { return m.sequence(id).tables[static_cast<std::size_t>(g(k))]; }

  KvCacheManager m;
};

TEST_F(ManagerTest, SpecOfTinyModel) {
  EXPECT_EQ(m.spec().buckets, (std::vector<std::int64_t>{65536, 16384, 2048}));
  EXPECT_EQ(m.spec().group(CacheKind::kWindowKv).num_layers(), 5);
  EXPECT_EQ(m.spec().group(CacheKind::kCsaKv).num_layers(), 2);
  EXPECT_EQ(m.spec().group(CacheKind::kHcaKv).num_layers(), 1);
  EXPECT_EQ(m.spec().group(CacheKind::kCsaState).positions_per_block, 8);
  EXPECT_EQ(m.spec().group(CacheKind::kHcaState).positions_per_block, 16);
}

TEST_F(ManagerTest, AllocateCountsPagesAndCommitSlidesWindows) {
  const auto tokens = iota_tokens(300);
  EXPECT_EQ(m.add_sequence(1, tokens), 0);
  ASSERT_TRUE(m.allocate(1, 300).ok());
  // bucket 0: window 5 blocks x 5 layers, c4 KV 2 x 2, c4 state 2 x 2 (positions 252-255
  // for the prefix cache, 296-299 for the next step), c128 state 3 x 1 (256-299).
  EXPECT_EQ(m.used_pages(0), 25 + 4 + 4 + 3);
  EXPECT_EQ(m.used_pages(1), 4 + 4);  // indexer keys 2 x 2, indexer state 2 x 2
  EXPECT_EQ(m.used_pages(2), 2);       // c128 KV 2 x 1
  m.check_invariants();

  const StepSlice slice{1, 300};
  const StepView view = m.step_view({&slice, 1});
  ASSERT_EQ(view.positions.size(), 300u);
  const auto& csa = view.groups[static_cast<std::size_t>(g(CacheKind::kCsaKv))].slot_mapping;
  EXPECT_EQ(csa[3], 0);     // entry 0 completes at token 3
  EXPECT_EQ(csa[4], -1);
  EXPECT_EQ(csa[7], 1);
  EXPECT_EQ(csa[259], 64);  // entry 64: block 1, entry 0
  const auto& hca = view.groups[static_cast<std::size_t>(g(CacheKind::kHcaKv))].slot_mapping;
  EXPECT_EQ(hca[127], 0);
  EXPECT_EQ(hca[255], 1);
  EXPECT_EQ(std::count_if(hca.begin(), hca.end(), [](std::int64_t s) { return s >= 0; }), 2);
  const auto& state = view.groups[static_cast<std::size_t>(g(CacheKind::kCsaState))].slot_mapping;
  EXPECT_EQ(state[100], -1);  // pooled within the step, never read later
  EXPECT_GE(state[253], 0);   // the state at boundary 256, for the prefix cache
  EXPECT_GE(state[299], 0);   // read by the next step
  // Blocks of 8 positions: 248-255 and 296-299 have slots.
  EXPECT_EQ(std::count_if(state.begin(), state.end(), [](std::int64_t s) { return s >= 0; }), 12);
  const auto& window = view.groups[static_cast<std::size_t>(g(CacheKind::kWindowKv))];
  EXPECT_EQ(window.slot_mapping[299], 299);
  EXPECT_EQ(window.table_base[0], 0);
  EXPECT_EQ(window.table_start[1], 5);

  // Entry 65 of layer slot 1 (layer 3) of the c4 KV: block 1, entry 1 of that block's page.
  const EntryAddress at = m.entry_address(g(CacheKind::kCsaKv), csa[263], 1);
  const PageId page = m.blocks().block_pages(g(CacheKind::kCsaKv), 1)[1];
  EXPECT_EQ(at.bucket, 0);
  EXPECT_EQ(at.page, page);
  EXPECT_EQ(at.data_offset, std::int64_t{page} * 65536 + 1024);
  EXPECT_EQ(at.scale_offset, std::int64_t{page} * 65536 + 64 * 1024);  // bf16: no scales

  m.commit(1, tokens);
  // Registered logical block 0 (core: c4/c128/indexer block 0; tail: window blocks 2-3,
  // c4 and indexer state block 31). Released: window 0-1; state block 31 stays for the cache.
  EXPECT_EQ(m.prefix_cache().size(), 1);
  EXPECT_EQ(table(1, CacheKind::kWindowKv).base, 2);   // keep_from(300) = 173
  EXPECT_EQ(table(1, CacheKind::kCsaState).base, 37);  // keep_from(300) = 296
  EXPECT_EQ(table(1, CacheKind::kHcaState).base, 16);  // keep_from(300) = 256
  EXPECT_EQ(m.used_pages(0), 15 + 4 + 4 + 3);
  EXPECT_EQ(m.used_pages(1), 4 + 4);
  EXPECT_EQ(m.used_pages(2), 2);
  m.check_invariants();

  m.free(1);
  m.check_invariants();
  m.prefix_cache().evict_all_idle();
  for (int b = 0; b < 3; ++b) EXPECT_EQ(m.used_pages(b), 0);
}

TEST_F(ManagerTest, DecodeReleasesWindowAndStateBlocksOnTime) {
  const auto tokens = iota_tokens(900);
  m.add_sequence(7, part(tokens, 0, 1));
  for (std::int64_t t = 0; t < 900; ++t) {
    ASSERT_TRUE(m.allocate(7, 1).ok());
    m.commit(7, part(tokens, t, 1));
    for (const CacheGroup& group : m.spec().groups) {
      if (!group.sliding) continue;
      const BlockTable& tb = m.sequence(7).tables[static_cast<std::size_t>(m.spec().group_of(group.kind))];
      ASSERT_EQ(tb.base, group.keep_from(t + 1) / group.positions_per_block) << cache_kind_name(group.kind) << " at " << t;
    }
    if (t % 50 == 0) m.check_invariants();
  }
  EXPECT_GT(m.stats().released_sliding_blocks, 0);
  m.check_invariants();
}

TEST_F(ManagerTest, StepViewMixesSequencesAtDifferentBoundaries) {
  const auto a = iota_tokens(130), b = iota_tokens(5, 1000);
  m.add_sequence(1, a);
  m.add_sequence(2, b);
  ASSERT_TRUE(m.allocate(1, 127).ok());
  m.commit(1, part(a, 0, 127));
  ASSERT_TRUE(m.allocate(2, 3).ok());
  m.commit(2, part(b, 0, 3));
  ASSERT_TRUE(m.allocate(1, 1).ok());  // position 127 completes a c128 entry
  ASSERT_TRUE(m.allocate(2, 2).ok());  // positions 3 (completes c4 entry 0) and 4
  const std::vector<StepSlice> slices = {{1, 1}, {2, 2}};
  const StepView v = m.step_view(slices);
  EXPECT_EQ(v.positions, (std::vector<std::int32_t>{127, 3, 4}));
  EXPECT_EQ(v.token_start, (std::vector<std::int32_t>{0, 1, 3}));
  EXPECT_EQ(v.row_start, (std::vector<std::int32_t>{127, 3}));
  const auto& hca = v.groups[static_cast<std::size_t>(g(CacheKind::kHcaKv))].slot_mapping;
  EXPECT_GE(hca[0], 0);
  EXPECT_EQ(hca[1], -1);
  const auto& csa = v.groups[static_cast<std::size_t>(g(CacheKind::kCsaKv))].slot_mapping;
  EXPECT_EQ(csa[0], m.slot(1, g(CacheKind::kCsaKv), 127));
  EXPECT_GE(csa[1], 0);
  EXPECT_EQ(csa[2], -1);
  const auto& state = v.groups[static_cast<std::size_t>(g(CacheKind::kCsaState))];
  EXPECT_EQ(state.table_base, (std::vector<std::int32_t>{15, 0}));  // keep_from(127) = 120 -> block 15
  for (std::size_t t = 0; t < 3; ++t) EXPECT_GE(state.slot_mapping[t], 0);
}

TEST_F(ManagerTest, PartialCommitKeepsAllocationForLater) {
  const auto tokens = iota_tokens(40);
  m.add_sequence(3, tokens);
  ASSERT_TRUE(m.allocate(3, 10).ok());
  m.commit(3, part(tokens, 0, 10));
  ASSERT_TRUE(m.allocate(3, 4, 1).ok());  // a speculative step: 4 positions, 2 accepted
  m.commit(3, part(tokens, 10, 2));
  EXPECT_EQ(m.sequence(3).num_computed, 12);
  EXPECT_EQ(m.sequence(3).num_allocated, 14);
  const std::int64_t used = m.used_pages(0);
  ASSERT_TRUE(m.allocate(3, 2).ok());  // the rejected positions' blocks are reused
  EXPECT_EQ(m.used_pages(0), used);
  m.check_invariants();
  EXPECT_THROW(m.commit(3, part(tokens, 12, 5)), std::logic_error);  // past the allocation
}

TEST_F(ManagerTest, CommittingLessThanPromisedIsCaught) {
  const auto tokens = iota_tokens(300);
  m.add_sequence(4, tokens);
  ASSERT_TRUE(m.allocate(4, 200).ok());  // promises all 200: state stored for 196..199 only
  EXPECT_THROW(m.commit(4, part(tokens, 0, 100)), std::logic_error);
}

TEST_F(ManagerTest, PreemptFreesEverything) {
  const auto tokens = iota_tokens(200);
  m.add_sequence(1, tokens);
  ASSERT_TRUE(m.allocate(1, 200).ok());
  m.preempt(1);
  EXPECT_FALSE(m.has_sequence(1));
  EXPECT_EQ(m.stats().preemptions, 1);
  for (int b = 0; b < 3; ++b) EXPECT_EQ(m.used_pages(b), 0);
  m.check_invariants();
}

class SmallPoolTest : public ManagerTest {
 protected:
  // Room for about one 1,000-token sequence in bucket 0 (c4 KV 8 + window 15 + states).
  SmallPoolTest() : ManagerTest({60, 40, 20}, false) {}
};

TEST_F(SmallPoolTest, AdmissionRefusesWithAReason) {
  const auto tokens = iota_tokens(5000);
  m.add_sequence(1, part(tokens, 0, 10));
  // A 1,000-token step needs more bucket-0 pages than the pool has (the window alone
  // 16 blocks x 5 layers): it can never fit, whatever is freed.
  const AllocResult never = m.can_allocate(1, 1000);
  EXPECT_EQ(never.status, AllocStatus::kNeverFits);
  EXPECT_NE(never.reason.find("alone needs"), std::string::npos) << never.reason;
  EXPECT_EQ(m.allocate(1, 1000).status, AllocStatus::kNeverFits);
  EXPECT_EQ(m.used_pages(0), 0);  // all or nothing

  // Fill the pool with sequence 1 in small steps, then sequence 2 cannot get a block.
  std::int64_t done = 0;
  while (m.can_allocate(1, 64).ok()) {
    ASSERT_TRUE(m.allocate(1, 64).ok());
    m.commit(1, part(tokens, done, 64));
    done += 64;
  }
  EXPECT_GT(done, 256);
  m.add_sequence(2, part(tokens, 0, 10));
  const AllocResult no_space = m.allocate(2, 64);
  EXPECT_EQ(no_space.status, AllocStatus::kNoSpace);
  EXPECT_NE(no_space.reason.find("more pages"), std::string::npos) << no_space.reason;
  EXPECT_EQ(m.stats().failed_allocations, 2);
  m.check_invariants();
  // Preempting sequence 1 makes room.
  m.preempt(1);
  EXPECT_TRUE(m.allocate(2, 64).ok());
  m.check_invariants();
}

}  // namespace
}  // namespace dsv4
