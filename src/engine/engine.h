// Engine: requests in, tokens out. It owns the KV cache bookkeeping (KvCacheManager), the
// scheduler and the sampler, and drives an Executor (CPU or CUDA) one step at a time:
//   schedule -> StepPlan -> executor launch/collect -> commit -> sample -> outputs.
//
// Threads: add_request, abort, has_unfinished, wait_for_work and stats may be called from any
// thread (a server's HTTP handlers); they only touch an inbox and a stats snapshot under a
// mutex. step, generate and score run on one thread, the loop thread, which owns everything
// else. A server runs `while (running) { engine.wait_for_work(100ms); for (auto& o :
// engine.step()) deliver(o); }` and streams each RequestOutput to its client.
//
// Every request that was added is reported finished exactly once (stop, length, abort or
// error) in some step's outputs; after that the engine forgets it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include "common/thread_pool.h"
#include "executor/executor.h"
#include "engine/request.h"
#include "engine/sampling.h"
#include "engine/scheduler.h"
#include "kvcache/kv_cache_manager.h"

namespace dsv4 {

struct EngineConfig {
  std::int64_t max_num_seqs = 64;
  std::int64_t max_num_batched_tokens = 2048;  // >= max_num_seqs
  std::int64_t max_model_len = 0;              // prompt + output tokens; 0 = max_position_embeddings
  // KV cache size: explicit pages per bucket of the executor's CacheSpec when set, otherwise
  // `cache_bytes` split over the buckets by pool_pages_for_budget for sequences of
  // `cache_context` tokens (0 = max_model_len).
  std::vector<std::int64_t> cache_pages;
  std::int64_t cache_bytes = 0;
  std::int64_t cache_context = 0;
  bool prefix_caching = true;
  // Threads that sample a step's rows (the caller's included); 0: the machine's hardware
  // threads, at most 8. Each row's token depends only on its row and request (sampling.h), so
  // the count changes nothing but the time.
  int sampling_threads = 0;
};

// A snapshot, safe to read from any thread.
struct EngineStats {
  std::int64_t num_running = 0;
  std::int64_t num_waiting = 0;
  double kv_usage = 0;                   // fraction of cache bytes held by live requests (idle prefix-cache entries count as free)
  std::int64_t prefix_query_tokens = 0;  // prompt tokens looked up in the prefix cache (once per request)
  std::int64_t prefix_hit_tokens = 0;    // ... served from it
  std::int64_t num_preemptions = 0;
  std::int64_t prompt_tokens = 0;        // prompt tokens of admitted requests (tokens in)
  std::int64_t generation_tokens = 0;    // tokens sampled (tokens out)
  std::int64_t computed_tokens = 0;      // tokens the executor ran, recomputation included
  std::int64_t num_steps = 0;
  std::int64_t requests_finished = 0;
  std::int64_t requests_failed = 0;      // finished with reason error
};

class Engine {
 public:
  Engine(Executor& executor, EngineConfig config);
  Engine(std::unique_ptr<Executor> executor, EngineConfig config);
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  ~Engine();

  // --- any thread ---
  // Queues a request; throws Error for malformed input (empty prompt, token ids outside the
  // vocabulary, sampling values out of range). A prompt + max_tokens beyond max_model_len,
  // or a prompt the cache can never hold, is accepted and finishes with reason error.
  RequestId add_request(std::vector<std::int32_t> prompt, SamplingParams params);
  // Finishes the request with reason abort at the next step (unknown or finished ids are ignored).
  void abort(RequestId id);
  bool has_unfinished() const;
  // Blocks until a request is unfinished or `timeout` passes; returns has_unfinished().
  bool wait_for_work(std::chrono::milliseconds timeout);
  EngineStats stats() const;

  // --- the loop thread ---
  // One step: takes queued requests and aborts, schedules, executes, samples. Reports every
  // request that got a token or finished in this step.
  std::vector<RequestOutput> step();
  // Adds the prompts (params: one for all, or one per prompt) and steps until they finish.
  // Each result holds the request's whole output in new_tokens / new_logprobs. Outputs of
  // other requests that finish meanwhile are dropped.
  std::vector<RequestOutput> generate(const std::vector<std::vector<std::int32_t>>& prompts,
                                      const std::vector<SamplingParams>& params);
  // Runs `tokens` as one sequence and returns the fp32 logits of every position,
  // [tokens.size(), vocab_size]: prefill in chunks of `chunk` tokens (0 = one shot; either way at
  // most max_num_batched_tokens a step, the size the executor was prepared for), one token
  // per step from position `decode_from` on. Needs an idle engine (throws Error otherwise);
  // the prefix cache is not consulted (every position is computed), but it learns the blocks.
  // With `mtp_logits`, also runs the MTP block on every position whose next token is known and
  // stores its logits there, [tokens.size() - 1, vocab_size] (row t predicts token t + 2).
  std::vector<float> score(std::span<const std::int32_t> tokens, std::int64_t chunk, std::int64_t decode_from,
                           std::vector<float>* mtp_logits = nullptr);

  const EngineConfig& config() const { return config_; }
  const ModelConfig& model_config() const { return executor_.config(); }
  std::int64_t max_model_len() const { return config_.max_model_len; }
  // Throws Error, with the numbers, when the KV cache cannot hold one sequence of max_model_len
  // tokens. The engine itself accepts such a cache (requests that outgrow it finish with
  // RequestErrorKind::kCacheCapacity); a server calls this at startup and refuses to start, as
  // vLLM does.
  void require_cache_for_max_model_len() const;
  // For tests and tools on the loop thread.
  KvCacheManager& kv_cache() { return *kv_; }
  const Scheduler& scheduler() const { return *scheduler_; }

 private:
  Engine(Executor& executor, std::unique_ptr<Executor>&& owned, EngineConfig config);
  void take_inbox(std::vector<RequestOutput>& outputs);
  RequestOutput output_of(const Request& request) const;
  void finish_now(Request& request, FinishReason reason, std::string error, RequestErrorKind kind,
                  std::vector<RequestOutput>& outputs);
  void update_stats(std::int64_t newly_finished, std::int64_t newly_failed, std::int64_t sampled);

  std::unique_ptr<Executor> owned_executor_;
  Executor& executor_;
  EngineConfig config_;
  std::unique_ptr<KvCacheManager> kv_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<ThreadPool> sample_pool_;  // null: one thread
  std::unordered_map<RequestId, std::unique_ptr<Request>> requests_;  // live requests (loop thread)
  std::int64_t next_score_id_ = -1;  // score() sequences use negative ids

  mutable std::mutex mu_;  // guards everything below
  std::condition_variable work_cv_;
  std::vector<std::unique_ptr<Request>> inbox_;
  std::vector<RequestId> abort_inbox_;
  RequestId next_id_ = 0;
  std::int64_t num_unfinished_ = 0;  // added and not yet reported finished
  std::uint64_t seed_base_ = 0;
  EngineStats stats_;
};

}  // namespace dsv4
