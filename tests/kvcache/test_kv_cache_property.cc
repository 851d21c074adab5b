// Property tests: long random workloads through a small continuous-batching loop --
// thousands of requests with shared prefixes, chunked prefill, decode, speculative steps
// with rejected tokens, preemption under memory pressure and re-admission from the prefix
// cache. After every step: each scheduled sequence reads back what it needs from a shadow
// of the cache memory (shadow_cache.h), so a page owned twice, freed early or overwritten
// is caught where it happens; periodically the manager recounts every reference and page
// (check_invariants: no block owned twice, exact page accounting, window and state blocks
// released on time); at the end nothing leaks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <random>

#include "kvcache/kv_cache_manager.h"
#include "kvcache/memory_plan.h"
#include "model/presets.h"
#include "shadow_cache.h"

namespace dsv4 {
namespace {

struct Workload {
  const char* name;
  KvCacheDtype kv;
  IndexerCacheDtype indexer;
  bool prefix_caching;
  int requests;
  std::uint64_t seed;
};

struct Request {
  std::vector<std::int32_t> tokens;  // prompt, then every token it will generate
  std::vector<std::uint64_t> keys;
  std::int64_t prompt_len = 0;
  std::int64_t resume_len = 0;       // known tokens when (re)admitted: prefilled in chunks
  std::int64_t computed = 0;
  SeqId seq = -1;
};

class KvCacheProperty : public ::testing::TestWithParam<Workload> {};

TEST_P(KvCacheProperty, RandomWorkloadKeepsEveryInvariant) {
  const Workload w = GetParam();
  std::mt19937_64 rng(w.seed);
  auto uniform = [&](std::int64_t lo, std::int64_t hi) { return lo + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(hi - lo + 1)); };

  CacheOptions options;
  options.kv_dtype = w.kv;
  options.indexer_dtype = w.indexer;
  const CacheSpec spec = CacheSpec::build(tiny_config(), options);
  // Pools for about ten sequences of 1,500 tokens, while up to 12 run at once: pressure.
  std::int64_t per_seq = 0;
  const auto pages_1500 = sequence_pages(spec, 1500);
  for (std::size_t b = 0; b < spec.buckets.size(); ++b) per_seq += pages_1500[b] * spec.buckets[b];
  KvCacheManager m(spec, pool_pages_for_budget(spec, 10 * per_seq, 1500), w.prefix_caching);
  test::ShadowCache shadow(m);

  // Requests: most start with a piece of one of five shared documents.
  std::vector<std::vector<std::int32_t>> docs(5);
  for (auto& d : docs) {
    for (int i = 0; i < 1500; ++i) d.push_back(static_cast<std::int32_t>(rng() % 50000));
  }
  std::vector<Request> requests(static_cast<std::size_t>(w.requests));
  for (Request& r : requests) {
    if (uniform(0, 9) < 6) {
      const auto& d = docs[rng() % docs.size()];
      r.tokens.assign(d.begin(), d.begin() + uniform(0, 1500));
    }
    const std::int64_t suffix = uniform(1, 400);
    const std::int64_t generated = uniform(0, 19) == 0 ? uniform(200, 1200) : uniform(1, 150);
    for (std::int64_t i = 0; i < suffix + generated; ++i) r.tokens.push_back(static_cast<std::int32_t>(rng() % 50000));
    r.prompt_len = r.resume_len = static_cast<std::int64_t>(r.tokens.size()) - generated;
    r.keys = test::prefix_keys(r.tokens);
  }

  std::deque<std::size_t> waiting;
  std::vector<std::size_t> running;  // admission order; the newest is preempted first
  std::size_t arrived = 0, finished = 0;
  SeqId next_seq = 0;
  std::int64_t steps = 0, hit_tokens = 0;

  while (finished < requests.size()) {
    ASSERT_LT(++steps, 2'000'000) << "workload does not make progress";
    for (int k = 0; k < 3 && arrived < requests.size(); ++k) waiting.push_back(arrived++);

    // Admission: re-added requests may hit their own earlier blocks.
    while (running.size() < 12 && !waiting.empty()) {
      Request& r = requests[waiting.front()];
      r.seq = next_seq++;
      const std::int64_t hit = m.add_sequence(r.seq, {r.tokens.data(), static_cast<std::size_t>(r.resume_len)});
      ASSERT_EQ(hit % kLogicalBlockTokens, 0);
      ASSERT_LT(hit, r.resume_len);
      ASSERT_EQ(shadow.verify(r.seq, r.keys, true), "") << "prefix hit of " << hit << " tokens";
      // Admit only what fits now (with room for a first chunk); otherwise wait.
      if (!m.can_allocate(r.seq, std::min<std::int64_t>(r.resume_len - hit, 128)).ok()) {
        m.free(r.seq);
        break;
      }
      r.computed = hit;
      hit_tokens += hit;
      running.push_back(waiting.front());
      waiting.pop_front();
    }

    // Scheduling: a prefill chunk or a (possibly speculative) decode step per request.
    struct Scheduled {
      std::size_t request;
      std::int64_t n;
      std::int64_t accepted;
    };
    std::vector<Scheduled> scheduled;
    for (std::size_t i = 0; i < running.size(); ++i) {
      const std::size_t ri = running[i];
      Request& r = requests[ri];
      const std::int64_t target = static_cast<std::int64_t>(r.tokens.size());
      std::int64_t n, accepted, min_commit = -1;
      if (r.computed < r.resume_len) {
        n = accepted = std::min(r.resume_len - r.computed, uniform(1, 300));
      } else {
        n = std::min(target - r.computed, uniform(0, 3) == 0 ? uniform(2, 4) : std::int64_t{1});
        accepted = uniform(1, n);
        min_commit = 1;  // a speculative step may keep only its first token
      }
      AllocResult res = m.allocate(r.seq, n, min_commit);
      while (res.status == AllocStatus::kNoSpace) {
        // Preempt the newest other request; it will be recomputed later.
        ASSERT_GT(running.size(), 1u) << "alone and out of memory: " << res.reason;
        const std::size_t vi = running.back() != ri ? running.size() - 1 : running.size() - 2;
        Request& v = requests[running[vi]];
        m.preempt(v.seq);
        v.resume_len = std::max(v.resume_len, v.computed);
        waiting.push_front(running[vi]);
        scheduled.erase(std::remove_if(scheduled.begin(), scheduled.end(),
                                       [&](const Scheduled& s) { return s.request == running[vi]; }),
                        scheduled.end());
        running.erase(running.begin() + static_cast<std::ptrdiff_t>(vi));
        if (vi < i) --i;
        res = m.allocate(r.seq, n, min_commit);
      }
      ASSERT_TRUE(res.ok()) << res.reason;
      scheduled.push_back({ri, n, accepted});
    }

    // The executor's part: write every slot; rejected speculative tokens write garbage.
    std::vector<StepSlice> slices;
    for (const Scheduled& s : scheduled) slices.push_back({requests[s.request].seq, s.n});
    const StepView view = m.step_view(slices);
    ASSERT_EQ(view.seqs.size(), scheduled.size());
    shadow.write(view, [&](std::size_t row, std::int64_t p) {
      const Scheduled& s = scheduled[row];
      const Request& r = requests[s.request];
      return p < r.computed + s.accepted ? r.keys[static_cast<std::size_t>(p)] : test::mix64(rng());
    });

    for (const Scheduled& s : scheduled) {
      Request& r = requests[s.request];
      m.commit(r.seq, {r.tokens.data() + r.computed, static_cast<std::size_t>(s.accepted)});
      r.computed += s.accepted;
      if (uniform(0, 3) == 0) {  // a sample of rows read back their window, state and newest entries
        ASSERT_EQ(shadow.verify(r.seq, r.keys, false), "") << "after step " << steps;
      }
      if (r.computed == static_cast<std::int64_t>(r.tokens.size())) {
        ASSERT_EQ(shadow.verify(r.seq, r.keys, true), "");
        m.free(r.seq);
        running.erase(std::find(running.begin(), running.end(), s.request));
        ++finished;
      }
    }
    if (steps % 97 == 0) {
      ASSERT_NO_THROW(m.check_invariants());
    }
  }

  ASSERT_NO_THROW(m.check_invariants());
  const PrefixCacheStats& pc = m.prefix_cache().stats();
  std::printf("[ workload ] %s: %d requests, %lld steps, %lld preemptions, hit rate %.3f, %lld evicted, %lld tails dropped\n",
              w.name, w.requests, static_cast<long long>(steps), static_cast<long long>(m.stats().preemptions),
              pc.hit_rate(), static_cast<long long>(pc.evicted), static_cast<long long>(pc.tails_dropped));
  EXPECT_GT(m.stats().preemptions, 0) << "the workload should preempt";
  EXPECT_GT(m.stats().released_sliding_blocks, 0);
  if (w.prefix_caching) {
    EXPECT_GT(hit_tokens, 0);
    EXPECT_LE(hit_tokens, m.prefix_cache().stats().hit_tokens);  // refused admissions looked up too
    EXPECT_GT(m.prefix_cache().stats().evicted, 0) << "the workload should evict";
  }
  // No leaks: only the prefix cache holds pages, and evicting it empties every pool.
  m.prefix_cache().evict_all_idle();
  EXPECT_EQ(m.prefix_cache().size(), 0);
  for (int b = 0; b < m.blocks().num_buckets(); ++b) EXPECT_EQ(m.used_pages(b), 0) << "bucket " << b;
  for (int g = 0; g < spec.num_groups(); ++g) EXPECT_EQ(m.blocks().live_blocks(g), 0);
  ASSERT_NO_THROW(m.check_invariants());
}

INSTANTIATE_TEST_SUITE_P(
    Workloads, KvCacheProperty,
    ::testing::Values(Workload{"bf16_prefix", KvCacheDtype::kBf16, IndexerCacheDtype::kBf16, true, 1500, 1},
                      Workload{"fp8_fp4_prefix", KvCacheDtype::kFp8, IndexerCacheDtype::kFp4, true, 1000, 2},
                      Workload{"fp8_no_prefix", KvCacheDtype::kFp8, IndexerCacheDtype::kFp8, false, 500, 3}),
    [](const ::testing::TestParamInfo<Workload>& p) { return std::string(p.param.name); });

}  // namespace
}  // namespace dsv4
