// Request: one generation request as the engine tracks it, and the outputs a step reports.
//
// A request's tokens are its prompt followed by what it generated so far (one vector, as in
// nano-vllm's Sequence). `num_computed` counts the leading tokens whose cache entries are
// written; the scheduler runs tokens [num_computed, num_tokens()) in chunks, and the step that
// reaches the end produces logits for the next token. A fresh decode therefore has exactly one
// token left (the last one sampled); a request resumed after preemption recomputes everything
// past its cached prefix, outputs included.
//
// Life: waiting -> running -> finished, with running -> waiting on preemption. A finished
// request says why: stop (eos or a stop token, which is kept as the last output token),
// length (max_tokens or the context limit), abort, or error (with a message).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/sampling.h"

namespace dsv4 {

using RequestId = std::int64_t;
using Clock = std::chrono::steady_clock;

enum class RequestStatus { kWaiting, kRunning, kFinished };
enum class FinishReason { kNone, kStop, kLength, kAbort, kError };
// What kind of error finished a request (FinishReason::kError), so that callers decide by type,
// never by the message's text: the KV cache cannot hold it, it exceeds max_model_len, or the
// engine failed.
enum class RequestErrorKind { kNone, kCacheCapacity, kContextLength, kInternal };

std::string_view finish_reason_name(FinishReason reason);  // "stop", "length", "abort", "error", "" (none)

// Times of a request's milestones (steady clock); unset until they happen. The server turns
// them into its latency histograms (server/metrics.h).
struct RequestTimes {
  Clock::time_point arrival;
  std::optional<Clock::time_point> first_scheduled;  // first admission (not a resume after preemption)
  std::optional<Clock::time_point> first_token;
  std::optional<Clock::time_point> last_token;
  std::optional<Clock::time_point> finished;
};

struct Request {
  RequestId id = 0;
  std::vector<std::int32_t> tokens;  // prompt, then outputs
  std::int64_t num_prompt_tokens = 0;
  SamplingParams params;
  std::uint64_t seed = 0;            // params.seed, or one the engine drew
  std::int64_t max_tokens = 0;       // params.max_tokens resolved against max_model_len

  RequestStatus status = RequestStatus::kWaiting;
  FinishReason finish_reason = FinishReason::kNone;
  std::string error;                 // why, when finish_reason is kError
  RequestErrorKind error_kind = RequestErrorKind::kNone;

  std::int64_t num_computed = 0;     // leading tokens whose cache entries are written
  std::optional<std::int64_t> num_cached_tokens;  // prompt tokens served by the prefix cache at first admission
  RequestTimes times;

  std::int64_t num_tokens() const { return static_cast<std::int64_t>(tokens.size()); }
  std::int64_t num_output_tokens() const { return num_tokens() - num_prompt_tokens; }
  std::int64_t num_remaining() const { return num_tokens() - num_computed; }  // to compute before sampling
  bool is_finished() const { return status == RequestStatus::kFinished; }

  // Appends a sampled token and decides whether the request is done: eos (unless ignore_eos)
  // or a stop token -> stop; max_tokens or `max_model_len` total tokens -> length.
  void append(const SampledToken& token, std::int64_t eos_token_id, std::int64_t max_model_len);
};

// What one step reports for a request: the tokens it produced in this step (at most one today,
// a vector for speculative decoding later) and, once, that it finished.
struct RequestOutput {
  RequestId id = 0;
  std::vector<std::int32_t> new_tokens;
  std::vector<SampledToken> new_logprobs;  // parallel to new_tokens when params.logprobs is set
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  std::string error;
  RequestErrorKind error_kind = RequestErrorKind::kNone;  // set with finish_reason kError
  std::int64_t num_prompt_tokens = 0;
  std::int64_t num_cached_tokens = 0;  // prompt tokens served by the prefix cache
  std::int64_t num_output_tokens = 0;  // so far, including new_tokens
  RequestTimes times;
};

}  // namespace dsv4
