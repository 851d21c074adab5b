// Prometheus text rendering of the server's metrics (metrics.h).
#include "server/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

namespace dsv4::server {
namespace {

// vLLM's bucket boundaries.
std::vector<double> ttft_buckets() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
          2.5,   5.0,   7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
}
std::vector<double> itl_buckets() {
  return {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
}
std::vector<double> e2e_buckets() {
  return {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
}

void header(std::string& out, const std::string& name, const char* type, const char* help) {
  fmt::format_to(std::back_inserter(out), "# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

template <typename T>
void sample(std::string& out, const std::string& name, const std::string& labels, T value) {
  fmt::format_to(std::back_inserter(out), "{}{{{}}} {}\n", name, labels, value);
}

template <typename T>
void metric(std::string& out, const char* name, const char* type, const char* help, const std::string& labels, T value) {
  header(out, name, type, help);
  sample(out, name, labels, value);
}

}  // namespace

std::string escape_label_value(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

Histogram::Histogram(std::vector<double> upper_bounds) : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  const auto bucket = static_cast<std::size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin());
  std::lock_guard lock(mu_);
  ++counts_[bucket];
  sum_ += value;
  ++count_;
}

std::int64_t Histogram::count() const {
  std::lock_guard lock(mu_);
  return count_;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& labels) const {
  std::lock_guard lock(mu_);
  std::int64_t cumulative = 0;
  for (std::size_t b = 0; b <= bounds_.size(); ++b) {
    cumulative += counts_[b];
    const std::string le = b < bounds_.size() ? fmt::format("{}", bounds_[b]) : "+Inf";
    fmt::format_to(std::back_inserter(out), "{}_bucket{{{},le=\"{}\"}} {}\n", name, labels, le, cumulative);
  }
  fmt::format_to(std::back_inserter(out), "{}_sum{{{}}} {}\n{}_count{{{}}} {}\n", name, labels, sum_, name, labels, count_);
}

ServerMetrics::ServerMetrics(std::string model_name)
    : labels_(fmt::format("model_name=\"{}\"", escape_label_value(model_name))),
      ttft_(ttft_buckets()),
      itl_(itl_buckets()),
      e2e_(e2e_buckets()),
      queue_(e2e_buckets()),
      prefill_(e2e_buckets()),
      decode_(e2e_buckets()),
      inference_(e2e_buckets()) {}

void ServerMetrics::observe_request(FinishReason reason, const RequestTimes& t, Clock::time_point end) {
  const auto seconds = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
  e2e_.observe(seconds(t.arrival, end));
  if (t.first_scheduled) {
    queue_.observe(seconds(t.arrival, *t.first_scheduled));
    if (t.first_token) prefill_.observe(seconds(*t.first_scheduled, *t.first_token));
    if (t.last_token) inference_.observe(seconds(*t.first_scheduled, *t.last_token));
  }
  if (t.first_token && t.last_token) decode_.observe(seconds(*t.first_token, *t.last_token));
  std::lock_guard lock(mu_);
  switch (reason) {
    case FinishReason::kStop: ++finished_stop_; break;
    case FinishReason::kLength: ++finished_length_; break;
    case FinishReason::kAbort: ++finished_abort_; break;
    case FinishReason::kError:
    case FinishReason::kNone: ++finished_error_; break;
  }
}

std::string ServerMetrics::render(const EngineStats& s) const {
  std::string out;
  const std::string& l = labels_;
  metric(out, "vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", l, s.num_running);
  metric(out, "vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", l, s.num_waiting);
  metric(out, "vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", l, s.kv_usage);
  metric(out, "vllm:gpu_cache_usage_perc", "gauge", "KV-cache usage (older name of vllm:kv_cache_usage_perc).", l, s.kv_usage);
  metric(out, "vllm:prefix_cache_queries_total", "counter", "Prefix cache queries, in terms of number of queried tokens.", l,
         s.prefix_query_tokens);
  metric(out, "vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.", l,
         s.prefix_hit_tokens);
  metric(out, "vllm:num_preemptions_total", "counter", "Cumulative number of preemptions from the engine.", l,
         s.num_preemptions);
  metric(out, "vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", l, s.prompt_tokens);
  metric(out, "vllm:generation_tokens_total", "counter", "Number of generation tokens processed.", l, s.generation_tokens);
  {
    std::lock_guard lock(mu_);
    const char* name = "vllm:request_success_total";
    header(out, name, "counter", "Count of successfully processed requests.");
    sample(out, name, l + ",finished_reason=\"stop\"", finished_stop_);
    sample(out, name, l + ",finished_reason=\"length\"", finished_length_);
    sample(out, name, l + ",finished_reason=\"abort\"", finished_abort_);
    metric(out, "vllm:request_failure_total", "counter", "Count of requests that finished with an error.", l, finished_error_);
  }
  header(out, "vllm:time_to_first_token_seconds", "histogram", "Histogram of time to first token in seconds.");
  ttft_.render(out, "vllm:time_to_first_token_seconds", l);
  header(out, "vllm:inter_token_latency_seconds", "histogram", "Histogram of inter-token latency in seconds.");
  itl_.render(out, "vllm:inter_token_latency_seconds", l);
  header(out, "vllm:time_per_output_token_seconds", "histogram",
         "Histogram of time per output token in seconds (older name of vllm:inter_token_latency_seconds).");
  itl_.render(out, "vllm:time_per_output_token_seconds", l);
  header(out, "vllm:e2e_request_latency_seconds", "histogram", "Histogram of end to end request latency in seconds.");
  e2e_.render(out, "vllm:e2e_request_latency_seconds", l);
  const struct {
    const char* name;
    const char* help;
    const Histogram& histogram;
  } phases[] = {
      {"vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", queue_},
      {"vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", prefill_},
      {"vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", decode_},
      {"vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.", inference_}};
  for (const auto& phase : phases) {
    header(out, phase.name, "histogram", phase.help);
    phase.histogram.render(out, phase.name, l);
  }
  return out;
}

}  // namespace dsv4::server
