// Executor: what runs a StepPlan. The CPU executor (src/cpu) is the reference; the GPU
// executor (src/cuda) implements the same interface over the same plan, the same page
// layouts and the same weights, so the CPU one is its oracle op by op and byte by byte.
//
// An executor owns the cache memory (one pool of equal pages per bucket of its CacheSpec) and
// a copy of the page table, fed by the changes every plan carries; the KvCacheManager owns
// only the bookkeeping of which pages belong to which block. A step is launched and collected
// separately so the caller can prepare the next step while a device runs this one.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "common/error.h"
#include "executor/inspector.h"
#include "executor/step_plan.h"
#include "kvcache/cache_spec.h"
#include "model/model_config.h"

namespace dsv4 {

// The largest steps the caller will plan: executors with fixed scratch (a GPU) size it so.
struct StepLimits {
  std::int64_t max_tokens = 0;   // step tokens
  std::int64_t max_rows = 0;     // sequences in a step
  std::int64_t max_context = 0;  // positions of one sequence (max_model_len)
};

class Executor {
 public:
  virtual ~Executor() = default;

  virtual const ModelConfig& config() const = 0;
  virtual const CacheSpec& cache_spec() const = 0;

  // Allocates the cache memory, pages_per_bucket[i] pages of cache_spec().buckets[i] bytes (the
  // sizes the KvCacheManager was built with), and the scratch of steps within `limits`.
  // Called once, before the first step.
  virtual void allocate(std::span<const std::int64_t> pages_per_bucket, const StepLimits& limits) = 0;

  // Starts one step: writes every cache entry the plan's slot mappings name (reading earlier
  // entries through the block tables) and computes the logits of plan.logits_tokens, then, when
  // plan.mtp_tokens is set, the MTP logits of plan.mtp_rows. The plan must stay alive and
  // unchanged until collect_logits() returns. Throws Error for plans beyond the limits.
  virtual void launch(const StepPlan& plan) = 0;
  // Waits for the launched step and returns its fp32 logits, [plan.num_logits_rows(), vocab_size],
  // in the executor's own memory: valid until the next launch. (No copy: at 64 decode rows the V4
  // vocabulary's logits are 33 MB, and a host copy of them cost more than a millisecond a step.)
  virtual std::span<const float> collect_logits() = 0;

  // The same, copied into `logits`, which must hold exactly that many values.
  void collect(std::span<float> logits) {
    const std::span<const float> got = collect_logits();
    if (got.size() != logits.size())
      fail("executor: logits buffer holds {} values, the step has {}", logits.size(), got.size());
    std::copy(got.begin(), got.end(), logits.begin());
  }
  std::span<const float> execute(const StepPlan& plan) {
    launch(plan);
    return collect_logits();
  }
  void execute(const StepPlan& plan, std::span<float> logits) {
    launch(plan);
    collect(logits);
  }

  // Taps every layer of every later step (nullptr: off; not owned). Executors that cannot tap
  // throw Error.
  virtual void set_inspector(Inspector* inspector) = 0;

  // A copy of the cache memory of `bucket` (page p at p * buckets[bucket]), for comparing the
  // bytes two executors wrote (tests, debugging). Not for hot paths.
  virtual std::vector<std::uint8_t> cache_snapshot(int bucket) const = 0;
};

}  // namespace dsv4
