// MemoryPlan: what one sequence of N tokens costs in the KV cache, per cache kind and in
// total, the page buckets that hold it, and how many such sequences fit in a GPU's memory
// after the weights. Printed by `dsv4 plan`; also sizes the pools of a KvCacheManager.
//
// Two measures per kind:
//   bytes        entries x entry bytes x layers, no padding. The compressed kinds (c4 and
//                c128 main KV, indexer keys) summed are the published per-sequence figure
//                (V4-Pro bf16 at 2^20 tokens: 9.62 GiB); windows and compressor states are
//                small and listed on their own (window: the last sliding_window positions;
//                state: 8 positions for c4, 128 for c128).
//   paged bytes  the pages the pools really hold for the sequence at its worst alignment
//                during a decode step (blocks x layers x page size), which is what capacity
//                planning must use.
// The baseline is a 61-layer DeepSeek-V3.2-style MLA cache: (512 + 64) dims per token per
// layer (bf16: 1152 B; fp8: 656 B = 512 fp8 + 4 fp32 scales + 64 bf16) plus a 128-dim
// indexer key (bf16: 256 B; V3.2 has no fp4 indexer, so fp8 and fp4 compare with its 132-B
// fp8 key).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/json_io.h"
#include "kvcache/cache_spec.h"
#include "model/model_config.h"

namespace dsv4 {

inline constexpr std::int64_t kV32Layers = 61;

struct PlanRequest {
  std::int64_t context = 0;  // N, tokens per sequence
  CacheOptions cache;
  std::optional<std::int64_t> gpu_memory_bytes;
  std::optional<std::int64_t> weight_bytes;  // unknown weights count as 0 and are flagged
  std::string model_name;                    // for the heading only
};

struct KindPlan {
  CacheKind kind = CacheKind::kWindowKv;
  std::int64_t layers = 0;
  std::int64_t entry_bytes = 0;
  std::int64_t entries_per_layer = 0;  // what one sequence of N tokens keeps in one layer
  std::int64_t bytes = 0;              // entries_per_layer * entry_bytes * layers
  std::int64_t blocks = 0;             // blocks of this group a sequence holds (worst case)
  std::int64_t paged_bytes = 0;        // blocks * layers * page bytes
};

struct MemoryPlan {
  CacheSpec spec;
  std::string model_name;
  std::int64_t context = 0;
  std::vector<KindPlan> kinds;                  // CacheSpec group order
  std::int64_t compressed_bytes = 0;            // the published figure: c4 + c128 main KV + indexer
  std::int64_t sliding_bytes = 0;               // windows + compressor states
  std::int64_t paged_bytes = 0;                 // all kinds, as pages
  std::vector<std::int64_t> pages_per_sequence;  // per bucket
  std::int64_t step_bytes_per_token = 0;        // window KV bytes a step holds per scheduled token until commit
  std::int64_t v32_bytes_per_token_layer = 0;
  std::int64_t v32_bytes = 0;
  double v32_ratio = 0;                         // v32_bytes / compressed_bytes
  // Capacity, when a GPU memory size was given.
  std::optional<std::int64_t> gpu_memory_bytes;
  std::optional<std::int64_t> weight_bytes;
  std::int64_t kv_budget_bytes = 0;
  std::int64_t sequences_fit = 0;
  std::vector<std::int64_t> pool_pages;         // per bucket, the budget split by need
};

MemoryPlan plan_memory(const ModelConfig& config, const PlanRequest& request);

// Blocks of group `group` that one sequence of `tokens` positions holds at most during a
// decode step (all compressed blocks; the live window of a sliding kind at its worst alignment).
std::int64_t sequence_blocks(const CacheGroup& group, std::int64_t tokens);
// Pages per bucket that one sequence of `tokens` positions holds at most.
std::vector<std::int64_t> sequence_pages(const CacheSpec& spec, std::int64_t tokens);
// Splits `budget_bytes` over the buckets in proportion to what sequences of `context`
// tokens need (for KvCacheManager's pools).
std::vector<std::int64_t> pool_pages_for_budget(const CacheSpec& spec, std::int64_t budget_bytes, std::int64_t context);

std::string format_plan(const MemoryPlan& plan);  // the `dsv4 plan` text
Json plan_to_json(const MemoryPlan& plan);        // the `dsv4 plan --json` document

}  // namespace dsv4
