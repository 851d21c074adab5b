// Prometheus metrics in the text exposition format (version 0.0.4), named as vLLM names them so
// that existing dashboards work:
//   vllm:num_requests_running, vllm:num_requests_waiting          gauges
//   vllm:kv_cache_usage_perc (and the older vllm:gpu_cache_usage_perc), 0..1
//   vllm:prefix_cache_queries_total, vllm:prefix_cache_hits_total  counters, in tokens
//   vllm:prompt_tokens_total, vllm:generation_tokens_total         counters
//   vllm:num_preemptions_total                                     counter
//   vllm:request_success_total{finished_reason=stop|length|abort}  counter
//   vllm:request_failure_total                                     counter (finished with an error)
//   vllm:time_to_first_token_seconds, vllm:inter_token_latency_seconds (and the older
//   vllm:time_per_output_token_seconds), vllm:e2e_request_latency_seconds   histograms
//   vllm:request_queue_time_seconds      arrival -> first scheduled             histograms, per
//   vllm:request_prefill_time_seconds    first scheduled -> first token         finished request
//   vllm:request_decode_time_seconds     first token -> last token              (a phase the
//   vllm:request_inference_time_seconds  first scheduled -> last token          request never
//                                                                               reached is left out)
// Every sample carries model_name="<served model>".
//
// Engine-wide values come from an EngineStats snapshot; latencies are observed by the server
// as outputs arrive (RequestOutput::times). Thread-safe.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace dsv4::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);
  // Appends the _bucket (cumulative, then +Inf), _sum and _count samples of `name`.
  void render(std::string& out, const std::string& name, const std::string& labels) const;
  std::int64_t count() const;

 private:
  mutable std::mutex mu_;
  std::vector<double> bounds_;
  std::vector<std::int64_t> counts_;  // per bucket, not cumulative; last = above every bound
  double sum_ = 0;
  std::int64_t count_ = 0;
};

class ServerMetrics {
 public:
  explicit ServerMetrics(std::string model_name);

  void observe_time_to_first_token(double seconds) { ttft_.observe(seconds); }
  void observe_inter_token_latency(double seconds) { itl_.observe(seconds); }
  // A finished request: its finish reason, e2e latency (arrival -> `end`) and phase times.
  void observe_request(FinishReason reason, const RequestTimes& times, Clock::time_point end);

  std::string render(const EngineStats& stats) const;

 private:
  std::string labels_;  // model_name="..."
  Histogram ttft_;
  Histogram itl_;
  Histogram e2e_;
  Histogram queue_, prefill_, decode_, inference_;
  mutable std::mutex mu_;
  std::int64_t finished_stop_ = 0, finished_length_ = 0, finished_abort_ = 0, finished_error_ = 0;
};

// A label value with \, " and newline escaped.
std::string escape_label_value(const std::string& value);

}  // namespace dsv4::server
