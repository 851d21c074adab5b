// Long context (labelled `long`, skipped by default in CI: `ctest -L long` runs it): several
// thousand tokens, where the indexer's top-k (8 in the tiny model) is far below the number of
// compressed blocks (750 at 3000 tokens). Chunked prefill and decode must still reproduce
// one-shot prefill exactly, and the logits stay finite.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "cpu/cpu_executor.h"
#include "engine/engine.h"
#include "model/presets.h"
#include "model/synthetic_checkpoint.h"

namespace dsv4 {
namespace {

TEST(LongContext, ThreeThousandTokensChunkedAndDecodedMatchOneShot) {
  constexpr std::int64_t kTokens = 3000, kDecodeFrom = 2940;
  const auto dir = std::filesystem::path(::testing::TempDir()) / ("dsv4_long_tiny_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  write_synthetic_checkpoint(tiny_config(), dir, {.seed = 31});
  std::mt19937 rng(8);
  std::vector<std::int32_t> tokens(kTokens);
  for (auto& t : tokens) t = static_cast<std::int32_t>(rng() % 4096);
  auto run = [&](std::int64_t chunk, std::int64_t decode_from) {
    EngineConfig config;
    config.cache_bytes = std::int64_t{1} << 30;
    config.cache_context = 4096;
    config.max_num_batched_tokens = 4096;
    Engine engine(CpuExecutor::load(dir, {KvCacheDtype::kFp8, IndexerCacheDtype::kFp4, true}, 2), config);
    return engine.score(tokens, chunk, decode_from);
  };
  const std::vector<float> one_shot = run(0, kTokens);
  for (float v : one_shot) ASSERT_TRUE(std::isfinite(v));
  const std::vector<float> chunked = run(1000, kDecodeFrom);
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < one_shot.size(); ++i) mismatches += one_shot[i] != chunked[i];
  EXPECT_EQ(mismatches, 0u);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dsv4
