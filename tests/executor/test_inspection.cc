// Layer-by-layer taps (executor/dump_recorder.h): the dumps of one-shot prefill, chunked prefill
// and decode agree exactly, and the recorded key sets obey SPEC.md 3.2's causality rules.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <random>

#include "common/npy.h"
#include "cpu/cpu_executor.h"
#include "executor/dump_recorder.h"
#include "engine/engine.h"
#include "model/presets.h"
#include "model/synthetic_checkpoint.h"

namespace dsv4 {
namespace {

constexpr std::int64_t kTokens = 300;  // 75 c4 blocks > index_topk 8; two complete c128 blocks

class Inspection : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::filesystem::path(std::filesystem::path(::testing::TempDir()) / ("dsv4_inspection_tiny_" + std::to_string(::getpid())));
    std::filesystem::remove_all(*dir_);
    write_synthetic_checkpoint(tiny_config(), *dir_, {.seed = 21});
    std::mt19937 rng(5);
    tokens_ = new std::vector<std::int32_t>(kTokens);
    for (auto& t : *tokens_) t = static_cast<std::int32_t>(rng() % 4096);
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
    delete tokens_;
  }

  // Scores the prompt with the given chunking and returns what the recorder saw.
  static std::unique_ptr<DumpRecorder> record(std::int64_t chunk, std::int64_t decode_from) {
    auto exec = CpuExecutor::load(*dir_, {KvCacheDtype::kFp8, IndexerCacheDtype::kFp4, true}, 2);
    CpuExecutor* cpu = exec.get();
    EngineConfig config;
    config.cache_bytes = std::int64_t{256} << 20;
    config.cache_context = 1024;
    Engine engine(std::move(exec), config);
    auto recorder = std::make_unique<DumpRecorder>(tiny_config(), kTokens);
    cpu->set_inspector(recorder.get());
    engine.score(*tokens_, chunk, decode_from);
    return recorder;
  }

  static inline std::filesystem::path* dir_ = nullptr;
  static inline std::vector<std::int32_t>* tokens_ = nullptr;
};

void expect_same(const DumpRecorder& a, const DumpRecorder& b, const std::string& what) {
  const ModelConfig c = tiny_config();
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
    EXPECT_TRUE(a.hidden_of(l) == b.hidden_of(l)) << what << ": hidden of block " << l;
    EXPECT_EQ(a.window_of(l), b.window_of(l)) << what << ": window keys of block " << l;
    EXPECT_EQ(a.compressed_of(l), b.compressed_of(l)) << what << ": compressed keys of block " << l;
    EXPECT_TRUE(a.scores_of(l) == b.scores_of(l)) << what << ": indexer scores of block " << l;
  }
}

TEST_F(Inspection, PrefillChunkedAndDecodeDumpsAgree) {
  auto one_shot = record(0, kTokens);
  expect_same(*one_shot, *record(7, kTokens), "chunk 7");
  expect_same(*one_shot, *record(64, 130), "decode from 130");
}

TEST_F(Inspection, KeySetsObeyCausality) {
  const ModelConfig c = tiny_config();
  auto dump = record(0, kTokens);
  bool selection_happened = false;
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::int64_t r = c.compress_ratio(l);
    for (std::int64_t t = 0; t < kTokens; ++t) {
      const auto& window = dump->window_of(l)[static_cast<std::size_t>(t)];
      std::vector<std::int64_t> expected;
      for (std::int64_t q = std::max<std::int64_t>(0, t - 127); q <= t; ++q) expected.push_back(q);
      ASSERT_EQ(window, expected) << "block " << l << " position " << t;
      const auto& entries = dump->compressed_of(l)[static_cast<std::size_t>(t)];
      ASSERT_TRUE(std::is_sorted(entries.begin(), entries.end()));
      ASSERT_TRUE(std::adjacent_find(entries.begin(), entries.end()) == entries.end());
      for (std::int64_t j : entries) ASSERT_LE(r * (j + 1), t + 1) << "block " << l << " entry " << j << " at " << t;
      if (r == 0) {
        ASSERT_TRUE(entries.empty());
      } else if (r == 128) {
        ASSERT_EQ(static_cast<std::int64_t>(entries.size()), (t + 1) / 128);  // every complete block
      } else {
        const std::int64_t complete = (t + 1) / 4;
        ASSERT_EQ(static_cast<std::int64_t>(entries.size()), std::min(complete, c.index_topk));
        const auto& scores = dump->scores_of(l)[static_cast<std::size_t>(t)];
        ASSERT_EQ(static_cast<std::int64_t>(scores.size()), complete);
        // A valid top-k: no unchosen entry scores above a chosen one.
        float worst_chosen = INFINITY, best_unchosen = -INFINITY;
        for (std::int64_t j = 0; j < complete; ++j) {
          const bool chosen = std::binary_search(entries.begin(), entries.end(), j);
          const float s = scores[static_cast<std::size_t>(j)];
          if (chosen) worst_chosen = std::min(worst_chosen, s);
          else best_unchosen = std::max(best_unchosen, s);
        }
        ASSERT_GE(worst_chosen, best_unchosen) << "block " << l << " position " << t;
        selection_happened = selection_happened || complete > c.index_topk;
      }
    }
  }
  EXPECT_TRUE(selection_happened);
}

TEST_F(Inspection, WritesNpyFiles) {
  auto dump = record(0, kTokens);
  auto out = std::filesystem::path(::testing::TempDir()) / ("dsv4_dump_files_" + std::to_string(::getpid()));
  std::filesystem::remove_all(out);
  dump->write_hidden(out);
  dump->write_attention(out);
  NpyArray h = read_npy(out / "hidden2.npy");
  EXPECT_EQ(h.shape, (std::vector<std::int64_t>{kTokens, 4, 256}));
  EXPECT_TRUE(h.f32 == dump->hidden_of(2));
  NpyArray w = read_npy(out / "window_keys0.npy");
  EXPECT_EQ(w.shape, (std::vector<std::int64_t>{kTokens, 128}));
  EXPECT_EQ(w.i32[1 * 128 + 1], 1);
  EXPECT_EQ(w.i32[1 * 128 + 2], -1);
  NpyArray k = read_npy(out / "compressed_keys1.npy");
  EXPECT_EQ(k.shape, (std::vector<std::int64_t>{kTokens, 8}));
  NpyArray s = read_npy(out / "indexer_scores3.npy");
  EXPECT_EQ(s.shape, (std::vector<std::int64_t>{kTokens, kTokens / 4}));
  EXPECT_FALSE(std::filesystem::exists(out / "compressed_keys0.npy"));  // window-only block
  std::filesystem::remove_all(out);
}

}  // namespace
}  // namespace dsv4
