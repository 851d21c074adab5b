// The engine loop: inbox, schedule, execute, commit, sample, report (engine.h).
#include "engine/engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <exception>
#include <random>
#include <thread>

#include "common/error.h"
#include "kvcache/memory_plan.h"

namespace dsv4 {
namespace {

std::vector<std::int64_t> pool_pages(const CacheSpec& spec, const EngineConfig& config) {
  std::vector<std::int64_t> pages = config.cache_pages;
  if (!pages.empty()) {
    if (pages.size() != spec.buckets.size()) {
      fail("engine: cache_pages names {} buckets, the cache spec has {}", pages.size(), spec.buckets.size());
    }
  } else {
    const std::int64_t context = config.cache_context > 0 ? config.cache_context : config.max_model_len;
    pages = pool_pages_for_budget(spec, config.cache_bytes, context);
  }
  for (std::size_t b = 0; b < pages.size(); ++b) {
    if (pages[b] < 1) {
      fail("engine: the KV cache has no page of {} B (bucket {}); give it more memory (cache_bytes {}, cache_pages {})",
           spec.buckets[b], b, config.cache_bytes, config.cache_pages.size());
    }
  }
  return pages;
}

EngineConfig resolved(EngineConfig config, const ModelConfig& model) {
  if (config.max_model_len <= 0) config.max_model_len = model.max_position_embeddings;
  if (config.max_model_len <= 0) fail("engine: max_model_len must be positive (the model's max_position_embeddings is {})", model.max_position_embeddings);
  if (config.max_num_seqs < 1) fail("engine: max_num_seqs must be >= 1, found {}", config.max_num_seqs);
  if (config.max_num_batched_tokens < config.max_num_seqs) {
    fail("engine: max_num_batched_tokens ({}) must be >= max_num_seqs ({}) so that every decode fits a step",
         config.max_num_batched_tokens, config.max_num_seqs);
  }
  return config;
}

}  // namespace

Engine::Engine(Executor& executor, EngineConfig config) : Engine(executor, nullptr, std::move(config)) {}

Engine::Engine(std::unique_ptr<Executor> executor, EngineConfig config)
    : Engine(*executor, std::move(executor), std::move(config)) {}

Engine::Engine(Executor& executor, std::unique_ptr<Executor>&& owned, EngineConfig config)
    : owned_executor_(std::move(owned)), executor_(executor), config_(resolved(std::move(config), executor.config())) {
  const CacheSpec& spec = executor_.cache_spec();
  const std::vector<std::int64_t> pages = pool_pages(spec, config_);
  config_.cache_pages = pages;
  kv_ = std::make_unique<KvCacheManager>(spec, pages, config_.prefix_caching);
  scheduler_ = std::make_unique<Scheduler>(SchedulerConfig{config_.max_num_seqs, config_.max_num_batched_tokens}, *kv_);
  executor_.allocate(pages, StepLimits{config_.max_num_batched_tokens, config_.max_num_seqs, config_.max_model_len});
  seed_base_ = (static_cast<std::uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  const int threads = config_.sampling_threads > 0
                          ? config_.sampling_threads
                          : std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 8);
  if (threads > 1) sample_pool_ = std::make_unique<ThreadPool>(threads);
}

Engine::~Engine() = default;

void Engine::require_cache_for_max_model_len() const {
  const CacheSpec& spec = executor_.cache_spec();
  auto fits = [&](std::int64_t tokens) {
    const std::vector<std::int64_t> need = sequence_pages(spec, tokens);
    for (std::size_t b = 0; b < need.size(); ++b) {
      if (need[b] > config_.cache_pages[b]) return false;
    }
    return true;
  };
  const std::int64_t len = config_.max_model_len;
  if (fits(len)) return;
  std::int64_t lo = 0, hi = len;  // fits(lo) (or lo == 0), !fits(hi)
  while (hi - lo > 1) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  const std::vector<std::int64_t> need = sequence_pages(spec, len);
  std::string buckets;
  for (std::size_t b = 0; b < need.size(); ++b) {
    buckets += fmt::format("{}{} B pages: {} of {} needed", b ? "; " : "", spec.buckets[b], config_.cache_pages[b], need[b]);
  }
  fail("the KV cache cannot hold one sequence of max_model_len {} tokens ({}); it holds at most {} tokens per "
       "sequence. Give the cache more memory (--cache-gb, --gpu-memory-utilization) or lower --max-model-len to {}",
       len, buckets, lo, lo);
}

RequestId Engine::add_request(std::vector<std::int32_t> prompt, SamplingParams params) {
  const std::int64_t vocab = model_config().vocab_size;
  if (prompt.empty()) fail("request: the prompt is empty");
  for (std::size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= vocab) fail("request: prompt token {} is {}, outside the vocabulary [0, {})", i, prompt[i], vocab);
  }
  params.validate(vocab);
  auto request = std::make_unique<Request>();
  request->num_prompt_tokens = static_cast<std::int64_t>(prompt.size());
  request->tokens = std::move(prompt);
  request->params = std::move(params);
  request->times.arrival = Clock::now();
  {
    std::lock_guard lock(mu_);
    request->id = next_id_++;
    request->seed = request->params.seed ? *request->params.seed : splitmix64(seed_base_ ^ static_cast<std::uint64_t>(request->id));
    inbox_.push_back(std::move(request));
    ++num_unfinished_;
    work_cv_.notify_all();
    return inbox_.back()->id;
  }
}

void Engine::abort(RequestId id) {
  std::lock_guard lock(mu_);
  abort_inbox_.push_back(id);
  work_cv_.notify_all();
}

bool Engine::has_unfinished() const {
  std::lock_guard lock(mu_);
  return num_unfinished_ > 0;
}

bool Engine::wait_for_work(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  work_cv_.wait_for(lock, timeout, [&] { return num_unfinished_ > 0; });
  return num_unfinished_ > 0;
}

EngineStats Engine::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

RequestOutput Engine::output_of(const Request& request) const {
  RequestOutput out;
  out.id = request.id;
  out.finished = request.is_finished();
  out.finish_reason = request.finish_reason;
  out.error = request.error;
  out.error_kind = request.error_kind;
  out.num_prompt_tokens = request.num_prompt_tokens;
  out.num_cached_tokens = request.num_cached_tokens.value_or(0);
  out.num_output_tokens = request.num_output_tokens();
  out.times = request.times;
  return out;
}

void Engine::finish_now(Request& request, FinishReason reason, std::string error, RequestErrorKind kind,
                        std::vector<RequestOutput>& outputs) {
  scheduler_->finish(&request, reason, std::move(error), kind);
  outputs.push_back(output_of(request));
}

void Engine::take_inbox(std::vector<RequestOutput>& outputs) {
  std::vector<std::unique_ptr<Request>> added;
  std::vector<RequestId> aborted;
  {
    std::lock_guard lock(mu_);
    added.swap(inbox_);
    aborted.swap(abort_inbox_);
  }
  for (auto& owned : added) {
    Request& r = *owned;
    requests_.emplace(r.id, std::move(owned));
    const std::int64_t limit = config_.max_model_len;
    if (r.num_prompt_tokens >= limit) {
      finish_now(r, FinishReason::kError,
                 fmt::format("the prompt has {} tokens; max_model_len {} leaves no room for output", r.num_prompt_tokens, limit),
                 RequestErrorKind::kContextLength, outputs);
      continue;
    }
    if (r.params.max_tokens && r.num_prompt_tokens + *r.params.max_tokens > limit) {
      finish_now(r, FinishReason::kError,
                 fmt::format("prompt ({} tokens) + max_tokens ({}) exceeds max_model_len {}", r.num_prompt_tokens,
                             *r.params.max_tokens, limit),
                 RequestErrorKind::kContextLength, outputs);
      continue;
    }
    r.max_tokens = r.params.max_tokens.value_or(limit - r.num_prompt_tokens);
    scheduler_->add(&r);  // a prompt that can never fit comes back in the next schedule's `failed`
  }
  for (RequestId id : aborted) {
    auto it = requests_.find(id);
    if (it == requests_.end() || it->second->is_finished()) continue;
    finish_now(*it->second, FinishReason::kAbort, {}, RequestErrorKind::kNone, outputs);
  }
}

std::vector<RequestOutput> Engine::step() {
  std::vector<RequestOutput> outputs;
  take_inbox(outputs);
  ScheduledStep step = scheduler_->schedule();
  for (Request* r : step.failed) outputs.push_back(output_of(*r));

  std::int64_t sampled = 0;
  if (!step.empty()) {
    const std::int64_t vocab = model_config().vocab_size;
    // The logits stay in the executor's memory (valid until its next launch).
    std::span<const float> logits;
    std::string failure;
    try {
      logits = executor_.execute(step.plan);
      if (logits.size() < step.sampling.size() * static_cast<std::size_t>(vocab))
        fail("the executor returned {} logits for {} sampled rows", logits.size(), step.sampling.size());
    } catch (const std::exception& e) {
      failure = e.what();
      if (failure.empty()) failure = "unknown executor failure";
    }
    if (!failure.empty()) {
      // The step's requests cannot trust their caches any more; the others are untouched.
      for (const ScheduledSlice& s : step.slices) finish_now(*s.request, FinishReason::kError, "executor failed: " + failure, RequestErrorKind::kInternal, outputs);
    } else {
      scheduler_->commit(step);
      // The rows are sampled in parallel (a row of V4's vocabulary takes 0.1 ms greedy, up to
      // a few ms with top_p: docs/perf.md) and applied in order.
      std::vector<SampledToken> tokens(step.sampling.size());
      parallel_for(sample_pool_.get(), 0, static_cast<std::int64_t>(tokens.size()), [&](std::int64_t i) {
        thread_local Sampler sampler;  // scratch only: the token is a function of the row and request
        const Request& r = *step.sampling[static_cast<std::size_t>(i)];
        const std::span<const float> row = logits.subspan(static_cast<std::size_t>(i) * static_cast<std::size_t>(vocab),
                                                          static_cast<std::size_t>(vocab));
        tokens[static_cast<std::size_t>(i)] = sampler.sample(row, r.params, r.seed, r.num_output_tokens());
      });
      for (std::size_t i = 0; i < step.sampling.size(); ++i) {
        Request& r = *step.sampling[i];
        const SampledToken& token = tokens[i];
        r.append(token, model_config().eos_token_id, config_.max_model_len);
        ++sampled;
        if (r.finish_reason != FinishReason::kNone) scheduler_->finish(&r, r.finish_reason);
        RequestOutput out = output_of(r);
        out.new_tokens.push_back(token.token);
        if (r.params.logprobs) out.new_logprobs.push_back(token);
        outputs.push_back(std::move(out));
      }
    }
  }

  std::int64_t finished = 0, failed = 0;
  for (const RequestOutput& o : outputs) {
    if (!o.finished) continue;
    ++finished;
    failed += o.finish_reason == FinishReason::kError;
    requests_.erase(o.id);
  }
  update_stats(finished, failed, sampled);
  return outputs;
}

void Engine::update_stats(std::int64_t newly_finished, std::int64_t newly_failed, std::int64_t sampled) {
  const CacheSpec& spec = kv_->spec();
  double used = 0, total = 0;
  for (std::size_t b = 0; b < spec.buckets.size(); ++b) {
    const int bucket = static_cast<int>(b);
    const double page = static_cast<double>(spec.buckets[b]);
    const std::int64_t idle = kv_->prefix_caching() ? kv_->prefix_cache().idle_pages(bucket) : 0;
    used += page * static_cast<double>(kv_->used_pages(bucket) - idle);
    total += page * static_cast<double>(kv_->blocks().pool(bucket).num_pages());
  }
  const SchedulerStats& s = scheduler_->stats();
  std::lock_guard lock(mu_);
  num_unfinished_ -= newly_finished;
  stats_.num_running = scheduler_->num_running();
  stats_.num_waiting = scheduler_->num_waiting() + static_cast<std::int64_t>(inbox_.size());
  stats_.kv_usage = total > 0 ? used / total : 0.0;
  stats_.prefix_query_tokens = s.prefix_query_tokens;
  stats_.prefix_hit_tokens = s.prefix_hit_tokens;
  stats_.num_preemptions = s.preemptions;
  stats_.prompt_tokens = s.prefix_query_tokens;
  stats_.generation_tokens += sampled;
  stats_.computed_tokens = s.scheduled_tokens;
  ++stats_.num_steps;
  stats_.requests_finished += newly_finished;
  stats_.requests_failed += newly_failed;
}

std::vector<RequestOutput> Engine::generate(const std::vector<std::vector<std::int32_t>>& prompts,
                                            const std::vector<SamplingParams>& params) {
  if (params.size() != 1 && params.size() != prompts.size()) {
    fail("generate: {} sampling params for {} prompts (give one, or one per prompt)", params.size(), prompts.size());
  }
  std::vector<RequestOutput> results(prompts.size());
  std::unordered_map<RequestId, std::size_t> index;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    const RequestId id = add_request(prompts[i], params[params.size() == 1 ? 0 : i]);
    results[i].id = id;
    index[id] = i;
  }
  std::size_t open = prompts.size();
  while (open > 0) {
    for (RequestOutput& o : step()) {
      auto it = index.find(o.id);
      if (it == index.end()) continue;
      RequestOutput& r = results[it->second];
      std::vector<std::int32_t> tokens = std::move(r.new_tokens);
      std::vector<SampledToken> logprobs = std::move(r.new_logprobs);
      tokens.insert(tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
      logprobs.insert(logprobs.end(), o.new_logprobs.begin(), o.new_logprobs.end());
      r = std::move(o);
      r.new_tokens = std::move(tokens);
      r.new_logprobs = std::move(logprobs);
      if (r.finished) --open;
    }
  }
  return results;
}

std::vector<float> Engine::score(std::span<const std::int32_t> tokens, std::int64_t chunk, std::int64_t decode_from,
                                 std::vector<float>* mtp_logits) {
  if (has_unfinished()) fail("score: the engine is serving requests; scoring needs it idle");
  const std::int64_t n = static_cast<std::int64_t>(tokens.size());
  const std::int64_t vocab = model_config().vocab_size;
  if (n == 0) fail("score: no tokens");
  if (n > config_.max_model_len) fail("score: {} tokens exceed max_model_len {}", n, config_.max_model_len);
  if (chunk < 0) fail("score: chunk must be >= 0 (0 = one shot), found {}", chunk);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int32_t t = tokens[static_cast<std::size_t>(i)];
    if (t < 0 || t >= vocab) fail("score: token {} is {}, outside the vocabulary [0, {})", i, t, vocab);
  }
  const SeqId id = next_score_id_--;
  kv_->add_sequence(id, {});  // an empty prompt: no prefix lookup, every position is computed
  std::vector<float> logits(static_cast<std::size_t>(n * vocab));
  if (mtp_logits) mtp_logits->assign(static_cast<std::size_t>((n - 1) * vocab), 0.0f);
  try {
    std::int64_t pos = 0;
    while (pos < n) {
      std::int64_t len = n - pos;
      if (pos >= decode_from) {
        len = 1;
      } else {
        if (chunk > 0) len = std::min(len, chunk);
        len = std::min({len, decode_from - pos, config_.max_num_batched_tokens});  // the executor's step limit
      }
      const AllocResult result = kv_->allocate(id, len);
      if (!result.ok()) fail("score: the KV cache cannot hold positions [{}, {}): {}", pos, pos + len, result.reason);
      StepPlan plan;
      const StepSlice slice{id, len};
      plan.view = kv_->step_view(std::span<const StepSlice>(&slice, 1));
      plan.token_ids.assign(tokens.begin() + pos, tokens.begin() + pos + len);
      for (std::int64_t t = 0; t < len; ++t) plan.logits_tokens.push_back(static_cast<std::int32_t>(t));
      if (mtp_logits)
        for (std::int64_t t = 0; t < len; ++t) plan.mtp_tokens.push_back(pos + t + 1 < n ? tokens[pos + t + 1] : -1);
      plan.page_changes = kv_->take_page_changes();
      finish_step_plan(plan, kv_->spec());
      const std::span<const float> step_logits = executor_.execute(plan);
      if (step_logits.size() != static_cast<std::size_t>(plan.num_logits_rows() * vocab))
        fail("score: the executor returned {} logits for {} rows", step_logits.size(), plan.num_logits_rows());
      std::copy_n(step_logits.begin(), len * vocab, logits.begin() + pos * vocab);
      if (mtp_logits)
        std::copy(step_logits.begin() + len * vocab, step_logits.end(), mtp_logits->begin() + pos * vocab);
      kv_->commit(id, plan.token_ids);
      pos += len;
    }
  } catch (...) {
    kv_->free(id);
    throw;
  }
  kv_->free(id);
  return logits;
}

}  // namespace dsv4
