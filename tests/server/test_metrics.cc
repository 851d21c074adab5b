// Prometheus text of the server metrics (server/metrics.h).
#include <gtest/gtest.h>

#include "server/metrics.h"

namespace dsv4::server {
namespace {

bool has_line(const std::string& text, const std::string& line) {
  return text.find("\n" + line + "\n") != std::string::npos || text.rfind(line + "\n", 0) == 0;
}

TEST(Metrics, HistogramIsCumulative) {
  Histogram h({0.125, 1.0});
  h.observe(0.0625);
  h.observe(0.125);  // le is inclusive
  h.observe(0.5);
  h.observe(7);
  std::string out;
  h.render(out, "x", "m=\"a\"");
  EXPECT_EQ(out.rfind("x_bucket{m=\"a\",le=\"0.125\"} 2\n"
                      "x_bucket{m=\"a\",le=\"1\"} 3\n"
                      "x_bucket{m=\"a\",le=\"+Inf\"} 4\n"
                      "x_sum{m=\"a\"} 7.6875\n",
                      0),
            0u)
      << out;
  EXPECT_NE(out.find("\nx_count{m=\"a\"} 4\n"), std::string::npos) << out;
  EXPECT_EQ(h.count(), 4);
}

TEST(Metrics, RendersVllmNames) {
  ServerMetrics m("tiny");
  EngineStats s;
  s.num_running = 2;
  s.num_waiting = 3;
  s.kv_usage = 0.25;
  s.prefix_query_tokens = 100;
  s.prefix_hit_tokens = 64;
  s.prompt_tokens = 100;
  s.generation_tokens = 7;
  m.observe_time_to_first_token(0.03);
  m.observe_inter_token_latency(0.02);
  RequestTimes times;  // arrived, never scheduled: only the e2e latency
  const Clock::time_point finished = times.arrival + std::chrono::milliseconds(400);
  m.observe_request(FinishReason::kStop, times, finished);
  m.observe_request(FinishReason::kLength, times, finished);
  m.observe_request(FinishReason::kError, times, finished);
  const std::string text = m.render(s);
  const std::string l = "{model_name=\"tiny\"}";
  EXPECT_TRUE(has_line(text, "vllm:num_requests_running" + l + " 2")) << text;
  EXPECT_TRUE(has_line(text, "vllm:num_requests_waiting" + l + " 3"));
  EXPECT_TRUE(has_line(text, "vllm:kv_cache_usage_perc" + l + " 0.25"));
  EXPECT_TRUE(has_line(text, "vllm:gpu_cache_usage_perc" + l + " 0.25"));
  EXPECT_TRUE(has_line(text, "vllm:prefix_cache_queries_total" + l + " 100"));
  EXPECT_TRUE(has_line(text, "vllm:prefix_cache_hits_total" + l + " 64"));
  EXPECT_TRUE(has_line(text, "vllm:prompt_tokens_total" + l + " 100"));
  EXPECT_TRUE(has_line(text, "vllm:generation_tokens_total" + l + " 7"));
  EXPECT_TRUE(has_line(text, "vllm:request_success_total{model_name=\"tiny\",finished_reason=\"stop\"} 1"));
  EXPECT_TRUE(has_line(text, "vllm:request_success_total{model_name=\"tiny\",finished_reason=\"length\"} 1"));
  EXPECT_TRUE(has_line(text, "vllm:request_failure_total" + l + " 1"));
  EXPECT_TRUE(has_line(text, "# TYPE vllm:time_to_first_token_seconds histogram"));
  EXPECT_TRUE(has_line(text, "vllm:time_to_first_token_seconds_bucket{model_name=\"tiny\",le=\"0.04\"} 1"));
  EXPECT_TRUE(has_line(text, "vllm:time_to_first_token_seconds_bucket{model_name=\"tiny\",le=\"0.02\"} 0"));
  EXPECT_TRUE(has_line(text, "vllm:inter_token_latency_seconds_count" + l + " 1"));
  EXPECT_TRUE(has_line(text, "vllm:time_per_output_token_seconds_count" + l + " 1"));
  EXPECT_TRUE(has_line(text, "vllm:e2e_request_latency_seconds_count" + l + " 3"));
  EXPECT_TRUE(has_line(text, "vllm:request_queue_time_seconds_count" + l + " 0"));
  // Every sample line is "name{labels} value" with a parsable number.
  std::size_t pos = 0;
  while (pos < text.size()) {
    const std::size_t end = text.find('\n', pos);
    ASSERT_NE(end, std::string::npos);
    const std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.rfind("# ", 0) == 0) continue;
    const std::size_t space = line.rfind(' ');
    ASSERT_NE(space, std::string::npos) << line;
    EXPECT_EQ(line.substr(0, 5), "vllm:") << line;
    std::size_t used = 0;
    (void)std::stod(line.substr(space + 1), &used);
    EXPECT_EQ(used, line.size() - space - 1) << line;
  }
}

// The phase histograms come from the request's milestones: queue = arrival -> first scheduled,
// prefill = first scheduled -> first token, decode = first -> last token, inference = first
// scheduled -> last token; a phase the request never reached is not observed.
TEST(Metrics, RequestPhasesFromTimes) {
  ServerMetrics m("tiny");
  using std::chrono::milliseconds;
  RequestTimes t;
  t.first_scheduled = t.arrival + milliseconds(250);
  t.first_token = t.arrival + milliseconds(1250);
  t.last_token = t.arrival + milliseconds(3250);
  t.finished = t.last_token;
  m.observe_request(FinishReason::kStop, t, *t.finished);
  RequestTimes queued;  // aborted while waiting
  m.observe_request(FinishReason::kAbort, queued, queued.arrival + milliseconds(500));
  const std::string text = m.render(EngineStats{});
  const std::string l = "{model_name=\"tiny\"}";
  EXPECT_TRUE(has_line(text, "vllm:e2e_request_latency_seconds_count" + l + " 2")) << text;
  EXPECT_TRUE(has_line(text, "vllm:e2e_request_latency_seconds_sum" + l + " 3.75")) << text;
  EXPECT_TRUE(has_line(text, "# TYPE vllm:request_queue_time_seconds histogram")) << text;
  EXPECT_TRUE(has_line(text, "vllm:request_queue_time_seconds_count" + l + " 1")) << text;
  EXPECT_TRUE(has_line(text, "vllm:request_queue_time_seconds_sum" + l + " 0.25")) << text;
  EXPECT_TRUE(has_line(text, "vllm:request_queue_time_seconds_bucket{model_name=\"tiny\",le=\"0.3\"} 1")) << text;
  EXPECT_TRUE(has_line(text, "vllm:request_prefill_time_seconds_sum" + l + " 1")) << text;
  EXPECT_TRUE(has_line(text, "vllm:request_decode_time_seconds_sum" + l + " 2")) << text;
  EXPECT_TRUE(has_line(text, "vllm:request_inference_time_seconds_sum" + l + " 3")) << text;
  EXPECT_TRUE(has_line(text, "vllm:request_inference_time_seconds_count" + l + " 1")) << text;
}

TEST(Metrics, LabelValuesAreEscaped) {
  EXPECT_EQ(escape_label_value("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
}

}  // namespace
}  // namespace dsv4::server
