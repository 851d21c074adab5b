// Continuous batching: decodes, prefill chunks, admission, preemption (scheduler.h).
#include "engine/scheduler.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "kvcache/memory_plan.h"

namespace dsv4 {

Scheduler::Scheduler(SchedulerConfig config, KvCacheManager& kv) : config_(config), kv_(kv) {
  if (config_.max_num_seqs < 1) throw std::invalid_argument("Scheduler: max_num_seqs must be >= 1");
  if (config_.max_num_batched_tokens < config_.max_num_seqs) {
    throw std::invalid_argument("Scheduler: max_num_batched_tokens must be >= max_num_seqs (every decode fits a step)");
  }
}

void Scheduler::add(Request* request) {
  request->status = RequestStatus::kWaiting;
  // Pages the request holds at its first decode; if a bucket is smaller, it can never run.
  const std::vector<std::int64_t> need = sequence_pages(kv_.spec(), request->num_tokens() + 1);
  for (std::size_t b = 0; b < need.size(); ++b) {
    const std::int64_t total = kv_.blocks().pool(static_cast<int>(b)).num_pages();
    if (need[b] > total) {
      finish(request, FinishReason::kError,
             fmt::format("the prompt of {} tokens needs {} pages of {} B (bucket {}) in the KV cache, which has {}",
                         request->num_prompt_tokens, need[b], kv_.spec().buckets[b], b, total),
             RequestErrorKind::kCacheCapacity);
      failed_.push_back(request);
      return;
    }
  }
  waiting_.push_back(request);
}

void Scheduler::admit(Request* request, std::int64_t cached) {
  request->status = RequestStatus::kRunning;
  running_.push_back(request);
  if (!request->num_cached_tokens) {  // first admission (not a resume after preemption)
    request->num_cached_tokens = cached;
    request->times.first_scheduled = Clock::now();
    stats_.prefix_query_tokens += request->num_prompt_tokens;
    stats_.prefix_hit_tokens += cached;
  }
}

void Scheduler::preempt(Request* request) {
  kv_.preempt(request->id);
  request->num_computed = 0;
  request->status = RequestStatus::kWaiting;
  ++stats_.preemptions;
  running_.erase(std::find(running_.begin(), running_.end(), request));
  waiting_.push_front(request);
}

void Scheduler::finish(Request* request, FinishReason reason, std::string error, RequestErrorKind kind) {
  if (auto it = std::find(running_.begin(), running_.end(), request); it != running_.end()) running_.erase(it);
  if (auto it = std::find(waiting_.begin(), waiting_.end(), request); it != waiting_.end()) waiting_.erase(it);
  if (kv_.has_sequence(request->id)) kv_.free(request->id);
  request->status = RequestStatus::kFinished;
  request->finish_reason = reason;
  request->error = std::move(error);
  request->error_kind = reason == FinishReason::kError && kind == RequestErrorKind::kNone ? RequestErrorKind::kInternal : kind;
  request->times.finished = Clock::now();
}

ScheduledStep Scheduler::schedule() {
  ScheduledStep step;
  step.failed = std::move(failed_);
  failed_.clear();
  std::int64_t budget = config_.max_num_batched_tokens;
  std::vector<ScheduledSlice>& slices = step.slices;

  auto preempt_victim = [&](Request* victim) {
    auto it = std::find_if(slices.begin(), slices.end(), [&](const ScheduledSlice& s) { return s.request == victim; });
    if (it != slices.end()) {  // scheduled earlier in this step: give its tokens back
      budget += it->num_tokens;
      slices.erase(it);
    }
    preempt(victim);
    step.preempted.push_back(victim);
  };
  auto fail_request = [&](Request* request, const std::string& reason) {
    finish(request, FinishReason::kError, "the KV cache cannot hold this request: " + reason,
           RequestErrorKind::kCacheCapacity);
    step.failed.push_back(request);
  };

  // 1 + 2: running requests, decodes first, then unfinished prefills, each in admission order.
  std::vector<Request*> order;
  for (Request* r : running_) {
    if (r->num_remaining() == 1) order.push_back(r);
  }
  for (Request* r : running_) {
    if (r->num_remaining() > 1) order.push_back(r);
  }
  for (Request* r : order) {
    if (r->status != RequestStatus::kRunning) continue;  // preempted earlier in this step
    std::int64_t n = std::min(r->num_remaining(), budget);
    while (n > 0) {
      const AllocResult result = kv_.allocate(r->id, n);
      if (result.ok()) {
        slices.push_back({r, n, false});
        budget -= n;
        break;
      }
      if (result.status == AllocStatus::kNeverFits) {
        if (n > 1) {
          n /= 2;
          continue;
        }
        fail_request(r, result.reason);
        break;
      }
      Request* victim = running_.back();  // the most recently admitted
      if (victim == r && n > 1) {
        n /= 2;
        continue;
      }
      preempt_victim(victim);
      if (victim == r) break;
    }
  }

  // 3: admit waiting requests, unless memory was short enough to preempt in this step.
  while (step.preempted.empty() && budget > 0 && !waiting_.empty() && num_running() < config_.max_num_seqs) {
    Request* r = waiting_.front();
    const std::int64_t cached = kv_.add_sequence(r->id, r->tokens);
    r->num_computed = cached;
    std::int64_t n = std::min(r->num_remaining(), budget);
    AllocResult result;
    while (true) {
      result = kv_.allocate(r->id, n);
      if (result.ok() || n == 1) break;
      if (result.status == AllocStatus::kNoSpace && !running_.empty()) break;
      n /= 2;
    }
    if (result.ok()) {
      waiting_.pop_front();
      admit(r, cached);
      slices.push_back({r, n, false});
      budget -= n;
      continue;
    }
    if (result.status == AllocStatus::kNoSpace && !running_.empty()) {
      kv_.free(r->id);  // wait until running requests release memory
      r->num_computed = 0;
      break;
    }
    fail_request(r, result.reason);  // never fits, or no room with nothing running to wait for
  }

  for (ScheduledSlice& s : slices) s.samples = s.request->num_computed + s.num_tokens == s.request->num_tokens();
  build_plan(step);
  return step;
}

void Scheduler::build_plan(ScheduledStep& step) const {
  if (step.slices.empty()) return;
  std::vector<StepSlice> view_slices;
  view_slices.reserve(step.slices.size());
  for (const ScheduledSlice& s : step.slices) view_slices.push_back({s.request->id, s.num_tokens});
  StepPlan& plan = step.plan;
  plan.view = kv_.step_view(view_slices);
  for (std::size_t row = 0; row < step.slices.size(); ++row) {
    const ScheduledSlice& s = step.slices[row];
    const auto begin = s.request->tokens.begin() + s.request->num_computed;
    plan.token_ids.insert(plan.token_ids.end(), begin, begin + s.num_tokens);
    if (s.samples) {
      plan.logits_tokens.push_back(plan.view.token_start[row + 1] - 1);
      step.sampling.push_back(s.request);
    }
  }
  plan.page_changes = kv_.take_page_changes();
  finish_step_plan(plan, kv_.spec());
}

void Scheduler::commit(const ScheduledStep& step) {
  for (const ScheduledSlice& s : step.slices) {
    Request& r = *s.request;
    kv_.commit(r.id, std::span<const std::int32_t>(r.tokens.data() + r.num_computed, static_cast<std::size_t>(s.num_tokens)));
    r.num_computed += s.num_tokens;
    stats_.scheduled_tokens += s.num_tokens;
  }
}

}  // namespace dsv4
