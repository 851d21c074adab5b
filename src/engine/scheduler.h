// Scheduler: continuous batching with chunked prefill and preemption by recompute, in the
// shape of nano-vllm's scheduler (a waiting queue, a running list, schedule + commit).
//
// Each step, under a budget of `max_num_batched_tokens` step tokens and `max_num_seqs` rows:
//   1. running requests that decode (one token left) get their token, in admission order;
//   2. running requests still prefilling get the next chunk of their prompt (as much of the
//      budget as is left), in admission order;
//   3. waiting requests, front first, are admitted while budget and rows last (and nobody
//      was preempted in this step): the KV cache looks up their prefix (add_sequence), and
//      their first chunk is allocated.
// Memory (KvCacheManager::allocate):
//   kNoSpace   for a running request: preempt the most recently admitted running request
//              (free its cache, put it at the front of the waiting queue; it is recomputed
//              later, possibly from its own cached prefix) and retry; when the request itself
//              is the most recent, first halve its chunk, and preempt it only at one token.
//              For a waiting request: stop admitting until running requests free memory
//              (when nothing runs, halve the chunk; at one token the request fails).
//   kNeverFits halve the chunk; at one token the request alone exceeds the cache and finishes
//              with an error, leaving the others untouched.
// Prompts whose first decode already exceeds the pools fail when added.
//
// Single-threaded: the engine's loop thread owns the scheduler.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "engine/request.h"
#include "executor/step_plan.h"
#include "kvcache/kv_cache_manager.h"

namespace dsv4 {

struct SchedulerConfig {
  std::int64_t max_num_seqs = 64;             // rows (running requests) at most
  std::int64_t max_num_batched_tokens = 2048; // step tokens at most; must be >= max_num_seqs
};

struct SchedulerStats {
  std::int64_t prefix_query_tokens = 0;  // prompt tokens looked up at first admission
  std::int64_t prefix_hit_tokens = 0;    // ... of which the prefix cache served
  std::int64_t preemptions = 0;
  std::int64_t scheduled_tokens = 0;   // step tokens, recomputation included
};

// One row of a step: `num_tokens` tokens of `request` from its num_computed on.
struct ScheduledSlice {
  Request* request = nullptr;
  std::int64_t num_tokens = 0;
  bool samples = false;  // reaches the end of the request's tokens: its logits pick the next token
};

struct ScheduledStep {
  StepPlan plan;
  std::vector<ScheduledSlice> slices;  // the plan's rows, in order
  std::vector<Request*> sampling;      // the requests of plan.logits_tokens, in order
  std::vector<Request*> failed;        // finished with an error while scheduling (already finished)
  std::vector<Request*> preempted;     // moved back to waiting in this step

  bool empty() const { return slices.empty(); }
};

class Scheduler {
 public:
  Scheduler(SchedulerConfig config, KvCacheManager& kv);

  // Queues a new request (status waiting). One whose prompt alone can never fit the cache
  // is finished with an error and reported by the next schedule().
  void add(Request* request);
  ScheduledStep schedule();
  // After the executor ran the step: commits the written positions to the KV cache.
  void commit(const ScheduledStep& step);
  // Finishes a waiting or running request (stop, length, abort, error) and frees its cache.
  void finish(Request* request, FinishReason reason, std::string error = {},
              RequestErrorKind kind = RequestErrorKind::kNone);

  bool has_unfinished() const { return !waiting_.empty() || !running_.empty(); }
  std::int64_t num_waiting() const { return static_cast<std::int64_t>(waiting_.size()); }
  std::int64_t num_running() const { return static_cast<std::int64_t>(running_.size()); }
  const std::deque<Request*>& waiting() const { return waiting_; }
  const std::vector<Request*>& running() const { return running_; }  // admission order
  const SchedulerConfig& config() const { return config_; }
  const SchedulerStats& stats() const { return stats_; }

 private:
  void preempt(Request* request);
  void admit(Request* request, std::int64_t cached);
  void build_plan(ScheduledStep& step) const;

  SchedulerConfig config_;
  KvCacheManager& kv_;
  std::deque<Request*> waiting_;
  std::vector<Request*> running_;
  std::vector<Request*> failed_;  // finished by add(), reported by the next schedule()
  SchedulerStats stats_;
};

}  // namespace dsv4
