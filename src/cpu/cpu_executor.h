// CpuExecutor: the whole DeepSeek-V4 forward on the CPU (SPEC.md section 3), the reference
// every GPU kernel is checked against and what runs without a GPU.
//
// It reads and writes the paged caches with the KV cache manager's layouts (pages found through
// its PageTable, kept current from each plan's page changes): every kv vector,
// compressor state position, compressed entry and indexer key goes into its page through
// cache_codec.h, and attention reads its keys back from the pages. Per layer a step runs in
// three phases over its tokens:
//   A  per token: hc pre + norm, q and kv projections, the window kv written at the token's
//      slot; for r > 0 the compressor projections (a_t, g_t), for r = 4 also the indexer query,
//      weights and the indexer compressor's projections. The projections stay in step scratch;
//      the state cache receives the positions the manager gave a slot (those later steps and
//      prefix hits need: the sliding state at the step's end and at 256-position boundaries).
//   B  per entry the step completes (the plan's CompressionPlan): entry j pooled (SPEC 3.3)
//      from this step's projections and, for earlier positions, the state cache; finished and
//      written to the compressed caches.
//   C  per token: the key set (window positions max(0, t-127)..t, then for HCA every complete
//      entry, for CSA the indexer's top-k of the complete entries, ascending), one softmax with
//      the sink, inverse RoPE, grouped output projection, hc post; then the MoE sub-layer.
// Every token's arithmetic depends only on its own inputs and the cache contents, with fixed
// reduction orders, so results do not depend on batch composition or chunking.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <vector>

#include "common/thread_pool.h"
#include "cpu/cpu_weights.h"
#include "executor/inspector.h"
#include "executor/executor.h"
#include "executor/page_table.h"
#include "numerics/rope.h"

namespace dsv4 {

class CpuExecutor final : public Executor {
 public:
  CpuExecutor(ModelConfig config, CpuModelWeights weights, CacheSpec spec, int num_threads);
  // Reads DIR/config.json and the checkpoint (every problem reported at once), loads the weights.
  static std::unique_ptr<CpuExecutor> load(const std::filesystem::path& dir, const CacheOptions& options,
                                           int num_threads);

  const ModelConfig& config() const override { return config_; }
  const CacheSpec& cache_spec() const override { return spec_; }
  void allocate(std::span<const std::int64_t> pages_per_bucket, const StepLimits& limits) override;
  // The CPU runs the whole step in collect_logits(); launch() only takes the plan and its page
  // changes.
  void launch(const StepPlan& plan) override;
  std::span<const float> collect_logits() override;
  void set_inspector(Inspector* inspector) override { inspector_ = inspector; }
  std::vector<std::uint8_t> cache_snapshot(int bucket) const override {
    return pools_.at(static_cast<std::size_t>(bucket));
  }

 private:
  struct Step;  // per-step scratch (cpu_executor.cc)
  void run(const StepPlan& plan, std::span<float> logits);
  void attention_layer(Step& s, const CpuBlockWeights& w);
  void ffn_layer(Step& s, const CpuBlockWeights& w);
  void mtp_block(Step& main, std::span<float> logits);
  void write_compressed_entries(Step& s, const CpuBlockWeights& w, bool indexer);
  void store_state(Step& s, std::int64_t layer, CacheKind kind, const std::vector<float>& state, std::int64_t width);
  std::uint8_t* entry_ptr(int group, std::int64_t layer, std::int64_t slot, bool scales);
  const RopeTable& rope_for(std::int64_t layer) const;

  ModelConfig config_;
  CpuModelWeights weights_;
  CacheSpec spec_;
  std::unique_ptr<ThreadPool> pool_;
  RopeTable rope_window_;      // rope_theta, no YaRN (window-only layers)
  RopeTable rope_compressed_;  // compress_rope_theta with YaRN (CSA / HCA layers)
  std::vector<std::vector<ExpertWeights>> expert_views_;  // per block
  std::vector<std::vector<std::uint8_t>> pools_;          // per bucket: pages * page_bytes
  PageTable page_table_;
  const StepPlan* launched_ = nullptr;
  std::vector<float> logits_;  // the collected step's logits (collect_logits)
  Inspector* inspector_ = nullptr;
};

}  // namespace dsv4
