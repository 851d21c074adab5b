// Request bookkeeping: appending a sampled token and the stop rules (request.h).
#include "engine/request.h"

#include <algorithm>

namespace dsv4 {

std::string_view finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone: return "";
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kError: return "error";
  }
  return "";
}

void Request::append(const SampledToken& token, std::int64_t eos_token_id, std::int64_t max_model_len) {
  tokens.push_back(token.token);
  const Clock::time_point now = Clock::now();
  if (!times.first_token) times.first_token = now;
  times.last_token = now;

  const auto& stops = params.stop_token_ids;
  if ((!params.ignore_eos && token.token == eos_token_id) ||
      std::find(stops.begin(), stops.end(), token.token) != stops.end()) {
    finish_reason = FinishReason::kStop;
  } else if (num_output_tokens() >= max_tokens || num_tokens() >= max_model_len) {
    finish_reason = FinishReason::kLength;
  }
}

}  // namespace dsv4
