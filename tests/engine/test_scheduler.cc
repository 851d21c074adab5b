// Scheduler policy, observed through the steps a RecordingExecutor sees: chunked prefill,
// the token budget, decode priority, mixed steps, max_num_seqs, admission order.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "engine_fixture.h"

namespace dsv4::test {
namespace {

std::vector<std::int64_t> big_cache(const RecordingExecutor& ex) { return pages_for(ex.cache_spec(), 2048, 24); }

// Rows of `seq` in a step: its token count, or -1 when absent.
std::int64_t tokens_of(const StepRecord& s, std::int64_t seq) {
  for (std::size_t r = 0; r < s.seqs.size(); ++r) {
    if (s.seqs[r] == seq) return s.row_tokens[r];
  }
  return -1;
}

TEST(Scheduler, ChunkedPrefillSplitsThePromptExactly) {
  RecordingExecutor ex;
  Engine engine(ex, engine_config(256, 4, big_cache(ex)));
  const RequestId id = engine.add_request(random_tokens(1, 1000), greedy(3));
  const auto results = run_to_end(engine);
  ASSERT_EQ(ex.steps.size(), 6u);
  const std::vector<std::int64_t> starts = {0, 256, 512, 768, 1000, 1001};
  const std::vector<std::int64_t> sizes = {256, 256, 256, 232, 1, 1};
  for (std::size_t i = 0; i < ex.steps.size(); ++i) {
    const StepRecord& s = ex.steps[i];
    ASSERT_EQ(s.seqs, std::vector<std::int64_t>{id});
    EXPECT_EQ(s.row_start[0], starts[i]) << "step " << i;
    EXPECT_EQ(s.row_tokens[0], sizes[i]) << "step " << i;
    // Logits only once the prompt is complete, for the row's last token.
    if (i < 3) {
      EXPECT_TRUE(s.logits_tokens.empty()) << "step " << i;
    } else {
      EXPECT_EQ(s.logits_tokens, std::vector<std::int64_t>{sizes[i] - 1}) << "step " << i;
    }
  }
  EXPECT_EQ(results.at(id).tokens.size(), 3u);
  EXPECT_EQ(results.at(id).last.finish_reason, FinishReason::kLength);
}

TEST(Scheduler, BudgetAndRowLimitHoldEveryStep) {
  RecordingExecutor ex;
  const std::int64_t budget = 200, max_seqs = 5;
  Engine engine(ex, engine_config(budget, max_seqs, big_cache(ex)));
  std::map<RequestId, std::pair<std::int64_t, std::int64_t>> expect;  // prompt, max_tokens
  for (int i = 0; i < 16; ++i) {
    const std::int64_t prompt = 1 + static_cast<std::int64_t>(splitmix64(static_cast<std::uint64_t>(i)) % 700);
    const std::int64_t max_tokens = 1 + i % 30;
    expect[engine.add_request(random_tokens(static_cast<std::uint64_t>(100 + i), prompt), random_sampling(max_tokens, static_cast<std::uint64_t>(i)))] = {prompt, max_tokens};
  }
  const auto results = run_to_end(engine);
  ASSERT_EQ(results.size(), expect.size());
  std::map<std::int64_t, std::int64_t> next_position;  // per sequence, where its next row must start
  std::int64_t max_rows = 0;
  for (const StepRecord& s : ex.steps) {
    EXPECT_LE(s.num_tokens, budget);
    EXPECT_LE(static_cast<std::int64_t>(s.seqs.size()), max_seqs);
    max_rows = std::max<std::int64_t>(max_rows, static_cast<std::int64_t>(s.seqs.size()));
    EXPECT_EQ(std::set<std::int64_t>(s.seqs.begin(), s.seqs.end()).size(), s.seqs.size()) << "a sequence twice in a step";
    for (std::size_t r = 0; r < s.seqs.size(); ++r) {
      auto it = next_position.find(s.seqs[r]);
      // Large cache: no preemption, so every row continues exactly where the last one ended
      // (or starts at 0 / a prefix hit at a 256 boundary).
      if (it != next_position.end()) {
        EXPECT_EQ(s.row_start[r], it->second) << "seq " << s.seqs[r];
      } else {
        EXPECT_EQ(s.row_start[r] % 256, 0);
      }
      next_position[s.seqs[r]] = s.row_start[r] + s.row_tokens[r];
    }
  }
  EXPECT_EQ(max_rows, max_seqs);
  for (const auto& [id, f] : results) {
    EXPECT_EQ(f.last.finish_reason, FinishReason::kLength);
    EXPECT_EQ(static_cast<std::int64_t>(f.tokens.size()), expect[id].second);
    EXPECT_EQ(next_position[id], expect[id].first + expect[id].second - 1);  // the last token is never run
  }
  EXPECT_EQ(engine.stats().num_preemptions, 0);
}

TEST(Scheduler, DecodesAreNeverStarvedAndShareStepsWithPrefill) {
  RecordingExecutor ex;
  const std::int64_t budget = 256;
  Engine engine(ex, engine_config(budget, 8, big_cache(ex)));
  const RequestId a = engine.add_request(random_tokens(2, 10), greedy(40));
  const RequestId b = engine.add_request(random_tokens(3, 20), greedy(40));
  engine.step();  // both prefill in one step
  engine.step();  // both decode
  const std::size_t before = ex.steps.size();
  const RequestId c = engine.add_request(random_tokens(4, 1500), greedy(5));
  const auto results = run_to_end(engine);
  EXPECT_EQ(results.at(c).tokens.size(), 5u);

  int mixed = 0;
  std::int64_t c_prefilled = 0;
  for (std::size_t i = before; i < ex.steps.size(); ++i) {
    const StepRecord& s = ex.steps[i];
    const bool a_live = i - before < 38, b_live = i - before < 38;  // 40 tokens; 2 before C arrived
    EXPECT_EQ(tokens_of(s, a), a_live ? 1 : -1) << "step " << i;
    EXPECT_EQ(tokens_of(s, b), b_live ? 1 : -1) << "step " << i;
    const std::int64_t cn = tokens_of(s, c);
    if (c_prefilled < 1500) {
      // C takes exactly what the decodes leave of the budget, until its prompt is done.
      EXPECT_EQ(cn, std::min<std::int64_t>(1500 - c_prefilled, budget - (a_live ? 1 : 0) - (b_live ? 1 : 0))) << "step " << i;
      if (a_live && cn > 1) ++mixed;
    }
    if (cn > 0) c_prefilled += cn;
    // Decode rows come first.
    for (std::size_t r = 1; r < s.seqs.size(); ++r) EXPECT_LE(s.row_tokens[r - 1] == 1 ? 0 : 1, s.row_tokens[r] == 1 ? 0 : 1);
  }
  EXPECT_GE(mixed, 5);
}

TEST(Scheduler, MaxNumSeqsQueuesTheRestInOrder) {
  RecordingExecutor ex;
  Engine engine(ex, engine_config(512, 3, big_cache(ex)));
  std::vector<RequestId> ids;
  for (int i = 0; i < 8; ++i) ids.push_back(engine.add_request(random_tokens(static_cast<std::uint64_t>(10 + i), 50), greedy(5 + i)));
  const auto results = run_to_end(engine);
  std::vector<std::int64_t> first_seen;
  for (const StepRecord& s : ex.steps) {
    EXPECT_LE(s.seqs.size(), 3u);
    for (std::int64_t seq : s.seqs) {
      if (std::find(first_seen.begin(), first_seen.end(), seq) == first_seen.end()) first_seen.push_back(seq);
    }
  }
  EXPECT_EQ(first_seen, std::vector<std::int64_t>(ids.begin(), ids.end()));  // FIFO admission
  // The fourth request starts only in the step after the first one finished (5 tokens: step 5).
  std::size_t fourth = 0;
  while (tokens_of(ex.steps[fourth], ids[3]) < 0) ++fourth;
  EXPECT_EQ(fourth, 5u);
  for (std::size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(results.at(ids[i]).tokens.size(), 5 + i);
}

TEST(Scheduler, RejectsABudgetBelowMaxNumSeqs) {
  RecordingExecutor ex;
  EXPECT_THROW({ Engine engine(ex, engine_config(4, 8, big_cache(ex))); }, Error);
}

}  // namespace
}  // namespace dsv4::test

namespace dsv4::test {
namespace {

// Both prompts fit together, both full sequences do not: the older request must never be
// preempted (its rows stay contiguous); the newer one is the victim and restarts from 0.
TEST(Scheduler, PreemptsTheMostRecentlyAdmittedRequest) {
  RecordingExecutor ex;
  const CacheSpec& spec = ex.cache_spec();
  const std::vector<std::int64_t> two_prompts = sequence_pages(spec, 301), one_full = sequence_pages(spec, 1300);
  std::vector<std::int64_t> pages;
  for (std::size_t b = 0; b < one_full.size(); ++b) pages.push_back(std::max(2 * two_prompts[b], one_full[b]) + 2);
  const std::vector<std::int64_t> two_full = sequence_pages(spec, 1300);
  bool short_somewhere = false;
  for (std::size_t b = 0; b < pages.size(); ++b) short_somewhere |= pages[b] < 2 * two_full[b];
  ASSERT_TRUE(short_somewhere) << "the cache must be too small for both requests to finish together";

  Engine engine(ex, engine_config(1024, 4, pages, /*prefix_caching=*/false));
  const RequestId older = engine.add_request(random_tokens(1, 300), greedy(1000));
  const RequestId newer = engine.add_request(random_tokens(2, 300), greedy(1000));
  const auto results = run_to_end(engine);
  EXPECT_GT(engine.stats().num_preemptions, 0);
  std::map<std::int64_t, std::int64_t> next;
  int restarts = 0;
  for (const StepRecord& s : ex.steps) {
    for (std::size_t r = 0; r < s.seqs.size(); ++r) {
      auto it = next.find(s.seqs[r]);
      if (it != next.end() && s.row_start[r] != it->second) {
        EXPECT_EQ(s.seqs[r], newer) << "the older request was preempted";
        EXPECT_EQ(s.row_start[r], 0);
        ++restarts;
      }
      next[s.seqs[r]] = s.row_start[r] + s.row_tokens[r];
    }
  }
  EXPECT_GT(restarts, 0);
  EXPECT_EQ(results.at(older).tokens.size(), 1000u);
  EXPECT_EQ(results.at(newer).tokens.size(), 1000u);
}

}  // namespace
}  // namespace dsv4::test
