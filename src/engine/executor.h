// Executor: what runs a StepPlan. The CPU executor (src/cpu) is the reference; the CUDA
// executor implements the same interface unchanged. An executor owns the cache memory
// (one pool of equal pages per bucket of the CacheSpec); the KvCacheManager owns only the
// bookkeeping of which pages belong to which block.
#pragma once

#include <cstdint>
#include <span>

#include "engine/step_plan.h"
#include "kvcache/block_pool.h"
#include "kvcache/cache_spec.h"
#include "model/model_config.h"

namespace dsv4 {

class Executor {
 public:
  virtual ~Executor() = default;

  virtual const ModelConfig& config() const = 0;
  virtual const CacheSpec& cache_spec() const = 0;

  // Allocates the cache memory: pages_per_bucket[i] pages of cache_spec().buckets[i] bytes.
  // Called once before the first step, with the sizes the KvCacheManager was built with.
  virtual void allocate_cache(std::span<const std::int64_t> pages_per_bucket) = 0;

  // Runs one step: writes every cache entry the plan's slot mappings name (reading earlier
  // entries through the block tables; `blocks` maps a block to its pages) and writes the
  // fp32 logits of plan.logits_tokens into `logits` ([logits_tokens.size(), vocab_size]),
  // followed, when plan.mtp_tokens is set, by the MTP logits ([num_mtp_tokens(), vocab_size]).
  virtual void execute(const StepPlan& plan, const BlockPool& blocks, std::span<float> logits) = 0;
};

}  // namespace dsv4
