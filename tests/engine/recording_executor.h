// RecordingExecutor: a deterministic stand-in for a model, for scheduler and engine tests.
//
// It implements Executor over real page memory and makes every output depend on what it reads
// back from the cache, so wrong slots, wrong block tables, lost or overwritten entries and bad
// prefix hits change the generated tokens (or throw):
//   - token x at position p computes h_p = mix(h_{p-1}, x, p), reading h_{p-1} back from the
//     window-KV entry of position p-1 (h_{-1} is a constant);
//   - it writes the record {magic, x, p, h_p} into every layer's page of every slot the plan
//     names for it, after checking that the slot is the one its block table gives;
//   - logits of position p fold h_p with every entry it can see: all compressed entries that
//     completed by p (c4, indexer, c128) and the window positions p-win+1..p, checking each
//     entry's position and that all layers agree. Compressor-state positions from before the
//     step (the KV cache manager leaves state slots of the step's own tokens unwritten when
//     no later step needs them) must match the window's record of the same position;
//     logit[v] = a pseudo-random value in [0, 8) of (fold, v).
// It also records the shape of every step for the scheduler tests.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "executor/executor.h"
#include "executor/page_table.h"
#include "kvcache/cache_spec.h"
#include "model/model_config.h"

namespace dsv4::test {

// A small V4-shaped model for engine tests: tiny_config() with a 64-token vocabulary, eos 1.
ModelConfig recording_model_config();
// fp8 main KV, fp4 indexer, no MTP caches: small pages.
CacheOptions recording_cache_options();

struct StepRecord {
  std::vector<std::int64_t> seqs;
  std::vector<std::int64_t> row_start;
  std::vector<std::int64_t> row_tokens;
  std::vector<std::int64_t> logits_tokens;
  std::int64_t num_tokens = 0;
};

class RecordingExecutor : public Executor {
 public:
  explicit RecordingExecutor(ModelConfig config = recording_model_config(),
                             CacheOptions options = recording_cache_options());

  const ModelConfig& config() const override { return config_; }
  const CacheSpec& cache_spec() const override { return spec_; }
  void allocate(std::span<const std::int64_t> pages_per_bucket, const StepLimits& limits) override;
  void launch(const StepPlan& plan) override;
  std::span<const float> collect_logits() override;
  void set_inspector(Inspector*) override {}
  std::vector<std::uint8_t> cache_snapshot(int bucket) const override { return memory_.at(static_cast<std::size_t>(bucket)); }

  std::vector<StepRecord> steps;
  std::optional<std::int64_t> throw_for_seq;  // collect throws when this sequence is in a step
  // When set (the KV cache manager's pool), every entry read or written must be in a live block.
  const BlockPool* checked_pool = nullptr;

 private:
  struct Record {
    std::uint32_t magic;
    std::int32_t token;
    std::int64_t position;
    std::uint64_t hash;
  };
  // Reads the entry of `position` (a compressed group: the entry that position completes) of
  // group g through row r's block table; checks all layers agree and the position matches.
  void execute_step(const StepPlan& plan, std::span<float> logits);
  Record read(const StepPlan& plan, int g, std::size_t row, std::int64_t position) const;
  std::int64_t table_slot(const StepPlan& plan, int g, std::size_t row, std::int64_t entry) const;
  std::uint8_t* entry_bytes(int g, std::int64_t slot, std::int64_t layer_slot);
  const std::uint8_t* entry_bytes(int g, std::int64_t slot, std::int64_t layer_slot) const;

  ModelConfig config_;
  CacheSpec spec_;
  std::vector<std::vector<std::uint8_t>> memory_;  // per bucket
  PageTable pages_;
  const StepPlan* launched_ = nullptr;
  std::vector<float> logits_;  // the collected step's logits (collect_logits)
};

}  // namespace dsv4::test
