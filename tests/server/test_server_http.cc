// End-to-end tests of `dsv4 serve`: one real server process on 127.0.0.1 (a free port) over a
// tiny synthetic model made in a temp dir, driven with the raw-socket clients of http_client.h. Every loop is bounded
// in count and time.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <mutex>

#include "server_process.h"

#ifndef DSV4_SERVE_BINARY
#error "DSV4_SERVE_BINARY must name the dsv4 binary"
#endif

namespace dsv4::test {
namespace {

constexpr const char* kApiKey = "test-key";
constexpr const char* kModel = "tiny-test";
constexpr int kMaxModelLen = 512;
constexpr std::size_t kMaxBody = 64 * 1024;

class ServerHttp : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::filesystem::path(make_tiny_model_dir(DSV4_SERVE_BINARY, "dsv4_server_test"));
    ASSERT_FALSE(dir_->empty()) << "make-model failed";
    const std::string model = (*dir_ / "model").string();
    server_ = new ServerProcess();
    const bool started = server_->start(DSV4_SERVE_BINARY,
                                        {"--model", model, "--served-model-name", kModel, "--api-key", kApiKey,
                                         "--max-model-len", std::to_string(kMaxModelLen), "--max-num-seqs", "8",
                                         "--max-num-batched-tokens", "512", "--threads", "2", "--cache-gb", "0.2",
                                         "--max-request-body-bytes", std::to_string(kMaxBody)},
                                        *dir_ / "server.log");
    ASSERT_TRUE(started) << server_->log();
  }

  static void TearDownTestSuite() {
    if (server_) {
      const int status = server_->stop();
      EXPECT_EQ(status, 0) << "the server did not shut down cleanly:\n" << server_->log();
      delete server_;
      server_ = nullptr;
    }
    if (dir_) {
      std::error_code ec;
      std::filesystem::remove_all(*dir_, ec);
      delete dir_;
      dir_ = nullptr;
    }
  }

  void SetUp() override {
    ASSERT_TRUE(server_ && server_->alive()) << "no server is running";
  }

  void TearDown() override {
    ASSERT_TRUE(server_->alive()) << "the server died:\n" << server_->log();
  }

  static std::unique_ptr<HttpClient> client(int read_timeout_s = 30, bool with_key = true) {
    auto c = std::make_unique<HttpClient>("127.0.0.1", server_->port());
    c->set_connection_timeout(5);
    c->set_read_timeout(read_timeout_s);
    c->set_write_timeout(10);
    if (with_key) c->set_bearer_token_auth(kApiKey);
    return c;
  }

  static Json post_json(HttpClient& c, const std::string& path, const Json& body, int* status = nullptr) {
    auto res = c.Post(path, body.dump(), "application/json");
    if (!res) {
      ADD_FAILURE() << "POST " << path << " failed: " << to_string(res.error());
      return Json();
    }
    if (status) *status = res->status;
    return Json::parse(res->body, nullptr, false);
  }

  static std::string metrics() {
    auto c = client(10, /*with_key=*/false);
    auto res = c->Get("/metrics");
    if (!res || res->status != 200) return {};
    return res->body;
  }

  // Tokens and text of a streamed completion, from its chunks.
  struct Streamed {
    std::vector<std::int32_t> tokens;
    std::string text;
    std::string finish_reason;
    Json usage;
    bool done = false;
  };
  static Streamed collect(const StreamResult& r) {
    Streamed s;
    s.done = r.done;
    for (const Json& e : r.events) {
      if (e.contains("usage") && e["usage"].is_object()) s.usage = e["usage"];
      if (!e.contains("choices") || e["choices"].empty()) continue;
      const Json& c = e["choices"][0];
      if (c.contains("token_ids")) {
        for (const Json& t : c["token_ids"]) s.tokens.push_back(t.get<std::int32_t>());
      }
      if (c.contains("text")) s.text += c["text"].get<std::string>();
      if (c.contains("delta") && c["delta"].contains("content")) s.text += c["delta"]["content"].get<std::string>();
      if (!c["finish_reason"].is_null()) s.finish_reason = c["finish_reason"].get<std::string>();
    }
    return s;
  }

  static void expect_error_object(const Json& body, const std::string& type_hint = {}) {
    ASSERT_TRUE(body.is_object()) << body;
    ASSERT_TRUE(body.contains("error")) << body;
    const Json& e = body["error"];
    EXPECT_TRUE(e["message"].is_string()) << body;
    EXPECT_FALSE(e["message"].get<std::string>().empty()) << body;
    EXPECT_TRUE(e["type"].is_string()) << body;
    EXPECT_TRUE(e.contains("param")) << body;
    EXPECT_TRUE(e.contains("code")) << body;
    if (!type_hint.empty()) {
      EXPECT_EQ(e["type"], type_hint) << body;
    }
  }

  static std::filesystem::path* dir_;
  static ServerProcess* server_;
};

std::filesystem::path* ServerHttp::dir_ = nullptr;
ServerProcess* ServerHttp::server_ = nullptr;

Json completion_body(const std::string& prompt, int max_tokens, std::optional<std::uint64_t> seed = std::nullopt,
                     double temperature = 0.0) {
  Json b = {{"model", kModel},    {"prompt", prompt},         {"max_tokens", max_tokens}, {"temperature", temperature},
            {"ignore_eos", true}, {"return_token_ids", true}};
  if (seed) b["seed"] = *seed;
  return b;
}

TEST_F(ServerHttp, HealthAndModels) {
  auto c = client();
  auto health = c->Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  auto res = c->Get("/v1/models");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const Json j = Json::parse(res->body);
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 1u);
  EXPECT_EQ(j["data"][0]["id"], kModel);
  EXPECT_EQ(j["data"][0]["object"], "model");
  EXPECT_EQ(j["data"][0]["max_model_len"], kMaxModelLen);
}

TEST_F(ServerHttp, CompletionNonStreaming) {
  auto c = client();
  int status = 0;
  const Json j = post_json(*c, "/v1/completions", completion_body("The quick brown fox", 8), &status);
  ASSERT_EQ(status, 200) << j;
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["model"], kModel);
  EXPECT_TRUE(j["id"].get<std::string>().rfind("cmpl-", 0) == 0) << j;
  const Json& choice = j["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "length");
  EXPECT_EQ(choice["token_ids"].size(), 8u);
  EXPECT_TRUE(choice["text"].is_string());
  EXPECT_GT(j["usage"]["prompt_tokens"].get<int>(), 0);
  EXPECT_EQ(j["usage"]["completion_tokens"], 8);
  EXPECT_EQ(j["usage"]["total_tokens"], j["usage"]["prompt_tokens"].get<int>() + 8);
  EXPECT_TRUE(j["usage"]["prompt_tokens_details"]["cached_tokens"].is_number_integer());
  // Greedy is deterministic.
  const Json again = post_json(*c, "/v1/completions", completion_body("The quick brown fox", 8), &status);
  EXPECT_EQ(again["choices"][0]["token_ids"], choice["token_ids"]);
}

TEST_F(ServerHttp, PrefixCacheHitsShowInUsageAndMetrics) {
  auto c = client();
  // Token ids: longer than one 256-token prefix-cache block whatever the tokenizer.
  std::vector<int> prompt;
  for (int i = 0; i < 300; ++i) prompt.push_back(200 + (i * 7) % 500);
  Json body = completion_body("", 2);
  body["prompt"] = prompt;
  int status = 0;
  const Json first = post_json(*c, "/v1/completions", body, &status);
  ASSERT_EQ(status, 200) << first;
  const Json second = post_json(*c, "/v1/completions", body, &status);
  ASSERT_EQ(status, 200) << second;
  EXPECT_GT(second["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 0) << second;
  const std::string m = metrics();
  EXPECT_GT(metric_value(m, "vllm:prefix_cache_hits_total").value_or(0), 0) << m;
  EXPECT_GE(metric_value(m, "vllm:prefix_cache_queries_total").value_or(0),
            metric_value(m, "vllm:prefix_cache_hits_total").value_or(0));
}

TEST_F(ServerHttp, StreamingMatchesNonStreaming) {
  auto c = client();
  Json body = completion_body("Once upon a time", 12, 7, 0.9);
  int status = 0;
  const Json whole = post_json(*c, "/v1/completions", body, &status);
  ASSERT_EQ(status, 200) << whole;
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  const StreamResult r = post_stream(*c, "/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.raw;
  const Streamed s = collect(r);
  EXPECT_TRUE(s.done) << r.raw;
  EXPECT_EQ(Json(s.tokens), whole["choices"][0]["token_ids"]);
  EXPECT_EQ(s.text, whole["choices"][0]["text"].get<std::string>());
  EXPECT_EQ(s.finish_reason, "length");
  ASSERT_TRUE(s.usage.is_object()) << r.raw;
  EXPECT_EQ(s.usage["completion_tokens"], 12);
  EXPECT_EQ(r.events.back()["choices"].size(), 0u);  // the usage chunk comes last
  for (const Json& e : r.events) EXPECT_EQ(e["object"], "text_completion");
}

TEST_F(ServerHttp, ChatCompletion) {
  auto c = client();
  Json body = {{"model", kModel},
               {"messages", {{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Hello!"}}}},
               {"max_tokens", 6},
               {"temperature", 0},
               {"ignore_eos", true},
               {"logprobs", true},
               {"top_logprobs", 2}};
  int status = 0;
  const Json j = post_json(*c, "/v1/chat/completions", body, &status);
  ASSERT_EQ(status, 200) << j;
  EXPECT_EQ(j["object"], "chat.completion");
  const Json& choice = j["choices"][0];
  EXPECT_EQ(choice["message"]["role"], "assistant");
  EXPECT_TRUE(choice["message"]["content"].is_string());
  ASSERT_EQ(choice["logprobs"]["content"].size(), 6u) << j;
  for (const Json& t : choice["logprobs"]["content"]) {
    EXPECT_LE(t["logprob"].get<double>(), 0.0);
    EXPECT_EQ(t["top_logprobs"].size(), 2u);
    EXPECT_GE(t["top_logprobs"][0]["logprob"].get<double>(), t["top_logprobs"][1]["logprob"].get<double>());
    // Greedy: the sampled token is the most likely one.
    EXPECT_DOUBLE_EQ(t["logprob"].get<double>(), t["top_logprobs"][0]["logprob"].get<double>());
  }
  EXPECT_EQ(j["usage"]["completion_tokens"], 6);

  body["stream"] = true;
  const StreamResult r = post_stream(*c, "/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.raw;
  ASSERT_FALSE(r.events.empty());
  EXPECT_EQ(r.events.front()["choices"][0]["delta"]["role"], "assistant");
  const Streamed s = collect(r);
  EXPECT_TRUE(s.done);
  EXPECT_EQ(s.finish_reason, "length");
  for (const Json& e : r.events) EXPECT_EQ(e["object"], "chat.completion.chunk");
}

// reasoning_effort reaches the encoder: in thinking mode high and max put their texts before the
// first message (more prompt tokens than low); in chat mode it adds nothing.
TEST_F(ServerHttp, ChatReasoningEffortReachesThePrompt) {
  auto c = client();
  auto prompt_tokens = [&](bool thinking, const char* effort) {
    Json body = {{"model", kModel},
                 {"messages", {{{"role", "user"}, {"content", "Hello!"}}}},
                 {"max_tokens", 1},
                 {"chat_template_kwargs", {{"thinking", thinking}}}};
    if (effort != nullptr) body["reasoning_effort"] = effort;
    int status = 0;
    const Json j = post_json(*c, "/v1/chat/completions", body, &status);
    EXPECT_EQ(status, 200) << j;
    return j["usage"]["prompt_tokens"].get<int>();
  };
  const int low = prompt_tokens(true, "low");
  EXPECT_EQ(prompt_tokens(true, nullptr), low);
  const int high = prompt_tokens(true, "high");
  const int max = prompt_tokens(true, "max");
  EXPECT_GT(high, low);
  EXPECT_GT(max, low);
  EXPECT_NE(high, max);
  EXPECT_EQ(prompt_tokens(false, "max"), prompt_tokens(false, "low"));
}

TEST_F(ServerHttp, CompletionLogprobs) {
  auto c = client();
  Json body = completion_body("Logprobs please", 5);
  body["logprobs"] = 3;
  int status = 0;
  const Json j = post_json(*c, "/v1/completions", body, &status);
  ASSERT_EQ(status, 200) << j;
  const Json& lp = j["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 5u) << j;
  ASSERT_EQ(lp["token_logprobs"].size(), 5u);
  ASSERT_EQ(lp["top_logprobs"].size(), 5u);
  ASSERT_EQ(lp["text_offset"].size(), 5u);
  for (std::size_t i = 0; i < 5; ++i) {
    EXPECT_LE(lp["token_logprobs"][i].get<double>(), 0.0);
    EXPECT_GE(lp["top_logprobs"][i].size(), 1u);  // distinct token strings may collapse
    EXPECT_LE(lp["top_logprobs"][i].size(), 3u);
  }
}

TEST_F(ServerHttp, StopTokenIdsAndStopStrings) {
  auto c = client();
  int status = 0;
  const Json base = post_json(*c, "/v1/completions", completion_body("Stop me if you can", 24), &status);
  ASSERT_EQ(status, 200) << base;
  const std::vector<std::int32_t> tokens = base["choices"][0]["token_ids"].get<std::vector<std::int32_t>>();
  ASSERT_EQ(tokens.size(), 24u);

  // stop_token_ids: the output ends with the first occurrence of the token.
  const std::int32_t stop_id = tokens[5];
  std::size_t first = 0;
  while (tokens[first] != stop_id) ++first;
  Json body = completion_body("Stop me if you can", 24);
  body["stop_token_ids"] = {stop_id};
  const Json j = post_json(*c, "/v1/completions", body, &status);
  ASSERT_EQ(status, 200) << j;
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["choices"][0]["token_ids"],
            Json(std::vector<std::int32_t>(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(first) + 1)));

  // stop strings: the text ends right before the first occurrence, streaming or not.
  const std::string text = base["choices"][0]["text"].get<std::string>();
  std::size_t at = std::string::npos;
  for (std::size_t p = 1; p < text.size(); ++p) {
    const unsigned char ch = static_cast<unsigned char>(text[p]);
    if (ch > 0x20 && ch < 0x7f && text.find(text[p]) == p) {
      at = p;
      break;
    }
  }
  // The model, prompt and greedy sampling are fixed, so this text is too.
  ASSERT_NE(at, std::string::npos) << "no usable stop character in \"" << text << "\"";
  const std::string stop(1, text[at]);
  body = completion_body("Stop me if you can", 24);
  body["stop"] = stop;
  const Json s = post_json(*c, "/v1/completions", body, &status);
  ASSERT_EQ(status, 200) << s;
  EXPECT_EQ(s["choices"][0]["text"], text.substr(0, at)) << "stop \"" << stop << "\" in \"" << text << "\"";
  EXPECT_EQ(s["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(s["choices"][0]["stop_reason"], stop);
  body["stream"] = true;
  body["include_stop_str_in_output"] = true;
  const Streamed streamed = collect(post_stream(*c, "/v1/completions", body));
  EXPECT_TRUE(streamed.done);
  EXPECT_EQ(streamed.text, text.substr(0, at + 1));
  EXPECT_EQ(streamed.finish_reason, "stop");
}

// Several clients streaming at once, sampled with seeds, get what each gets alone.
TEST_F(ServerHttp, ConcurrentStreamsMatchLoneClient) {
  const Json body_a = completion_body("Concurrency test, prompt A", 20, 1234, 1.0);
  const Json body_b = completion_body("A different prompt B, longer than the first one", 20, 99, 0.7);
  auto lone = [&](Json body) {
    auto c = client();
    body["stream"] = true;
    return collect(post_stream(*c, "/v1/completions", body));
  };
  const Streamed alone_a = lone(body_a);
  const Streamed alone_b = lone(body_b);
  ASSERT_EQ(alone_a.tokens.size(), 20u);
  ASSERT_EQ(alone_b.tokens.size(), 20u);

  constexpr int kClients = 6;
  std::vector<Streamed> results(kClients);
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] { results[i] = lone(i % 2 ? body_b : body_a); });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kClients; ++i) {
    const Streamed& want = i % 2 ? alone_b : alone_a;
    EXPECT_TRUE(results[i].done) << "client " << i;
    EXPECT_EQ(results[i].tokens, want.tokens) << "client " << i;
    EXPECT_EQ(results[i].text, want.text) << "client " << i;
  }
}

// A client that hangs up mid-stream cancels its request; its cache is freed.
TEST_F(ServerHttp, DisconnectCancelsAndFreesCache) {
  const double aborted_before =
      metric_value(metrics(), "vllm:request_success_total", "finished_reason=\"abort\"").value_or(0);
  Json body = completion_body("A long story that the client abandons", 200, 5, 1.0);
  body["stream"] = true;
  auto c = client();
  int chunks = 0;
  double running_seen = 0, usage_seen = 0;
  const StreamResult r = post_stream(*c, "/v1/completions", body, [&](const Json&) {
    if (++chunks == 3) {
      const std::string m = metrics();
      running_seen = metric_value(m, "vllm:num_requests_running").value_or(-1);
      usage_seen = metric_value(m, "vllm:kv_cache_usage_perc").value_or(-1);
      return false;  // hang up
    }
    return true;
  });
  EXPECT_EQ(chunks, 3);
  EXPECT_FALSE(r.done);
  EXPECT_GE(running_seen, 1);
  EXPECT_GT(usage_seen, 0);

  // Non-streaming: the client gives up waiting (read timeout) and closes the connection.
  {
    auto impatient = client(/*read_timeout_s=*/1);
    impatient->set_read_timeout(0, 300'000);
    auto res = impatient->Post("/v1/completions", completion_body("Another abandoned story", 200).dump(),
                               "application/json");
    EXPECT_FALSE(res);  // timed out
  }

  const auto deadline = std::chrono::steady_clock::now() + 15s;
  std::string m;
  while (std::chrono::steady_clock::now() < deadline) {
    m = metrics();
    if (metric_value(m, "vllm:num_requests_running") == 0.0 && metric_value(m, "vllm:num_requests_waiting") == 0.0 &&
        metric_value(m, "vllm:kv_cache_usage_perc") == 0.0 &&
        metric_value(m, "vllm:request_success_total", "finished_reason=\"abort\"").value_or(0) >= aborted_before + 2) {
      break;
    }
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(metric_value(m, "vllm:num_requests_running"), 0.0) << m;
  EXPECT_EQ(metric_value(m, "vllm:kv_cache_usage_perc"), 0.0) << m;
  EXPECT_GE(metric_value(m, "vllm:request_success_total", "finished_reason=\"abort\"").value_or(0), aborted_before + 2)
      << m;
}

// Bounded load: a few hundred requests from several client threads; none lost, none hung.
TEST_F(ServerHttp, BoundedLoad) {
  constexpr int kThreads = 4;
  constexpr int kPerThread = 75;
  std::atomic<int> ok{0};
  std::mutex failures_mu;
  std::vector<std::string> failures;
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto c = client(30);
      for (int i = 0; i < kPerThread; ++i) {
        Json body = completion_body("load " + std::to_string(t) + "/" + std::to_string(i), 2, i, 1.0);
        std::string failure;
        if (i % 2) {
          body["stream"] = true;
          const Streamed s = collect(post_stream(*c, "/v1/completions", body));
          if (!s.done || s.tokens.size() != 2 || s.finish_reason != "length") failure = "stream " + std::to_string(i);
        } else {
          auto res = c->Post("/v1/completions", body.dump(), "application/json");
          if (!res) {
            failure = "request error " + to_string(res.error());
          } else if (res->status != 200) {
            failure = "status " + std::to_string(res->status) + ": " + res->body;
          } else if (Json::parse(res->body)["usage"]["completion_tokens"] != 2) {
            failure = "bad body " + res->body;
          }
        }
        if (failure.empty()) {
          ++ok;
        } else {
          std::lock_guard lock(failures_mu);
          failures.push_back(failure);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(ok.load(), kThreads * kPerThread) << (failures.empty() ? "" : failures.front());
  EXPECT_LT(seconds, 60.0);
  const std::string m = metrics();
  EXPECT_EQ(metric_value(m, "vllm:num_requests_running"), 0.0) << m;
  EXPECT_EQ(metric_value(m, "vllm:num_requests_waiting"), 0.0) << m;
  EXPECT_GE(metric_value(m, "vllm:time_to_first_token_seconds_count").value_or(0), kThreads * kPerThread);
  EXPECT_GE(metric_value(m, "vllm:inter_token_latency_seconds_count").value_or(0), kThreads * kPerThread);
  EXPECT_GE(metric_value(m, "vllm:request_queue_time_seconds_count").value_or(0), kThreads * kPerThread) << m;
  EXPECT_GE(metric_value(m, "vllm:request_prefill_time_seconds_count").value_or(0), kThreads * kPerThread) << m;
  EXPECT_GT(metric_value(m, "vllm:prompt_tokens_total").value_or(0), 0);
  EXPECT_GT(metric_value(m, "vllm:generation_tokens_total").value_or(0), 2 * kThreads * kPerThread - 1);
}

struct BadRequest {
  std::string name;
  std::string path;
  std::string body;
  int status;
  std::string code;   // expected error.code ("" = don't check)
  std::string param;  // expected error.param ("" = don't check)
};

TEST_F(ServerHttp, BadInputsGetOpenAiErrors) {
  std::string long_prompt = "[";
  for (int i = 0; i < kMaxModelLen + 10; ++i) long_prompt += fmt::format("{}{}", i ? "," : "", 100 + i % 50);
  long_prompt += "]";
  const std::vector<BadRequest> cases = {
      {"malformed json", "/v1/completions", R"({"model": "tiny-test", "prompt": )", 400, "invalid_json", ""},
      {"not an object", "/v1/completions", "[1,2,3]", 400, "invalid_type", ""},
      {"empty body", "/v1/chat/completions", "", 400, "invalid_json", ""},
      {"duplicate key", "/v1/completions", R"({"prompt": "hi", "max_tokens": 1, "max_tokens": 400})", 400,
       "invalid_json", ""},
      {"wrong type", "/v1/completions", R"({"prompt": "hi", "max_tokens": "many"})", 400, "invalid_type", "max_tokens"},
      {"out of range", "/v1/completions", R"({"prompt": "hi", "temperature": 9})", 400, "invalid_value", "temperature"},
      {"n > 1", "/v1/completions", R"({"prompt": "hi", "n": 3})", 400, "unsupported_parameter", "n"},
      {"bad message", "/v1/chat/completions", R"({"messages": [{"role": "user", "content": 3}]})", 400, "invalid_type",
       "messages[0].content"},
      {"unknown model", "/v1/completions", R"({"model": "gpt-9", "prompt": "hi"})", 404, "model_not_found", "model"},
      {"prompt too long", "/v1/completions", R"({"prompt": )" + long_prompt + "}", 400, "context_length_exceeded",
       "prompt"},
      {"max_tokens too large", "/v1/completions", R"({"prompt": "hi", "max_tokens": 100000})", 400,
       "context_length_exceeded", "max_tokens"},
      {"token out of vocab", "/v1/completions", R"({"prompt": [1, 999999]})", 400, "invalid_value", "prompt"},
      {"oversized body", "/v1/completions",
       R"({"prompt": ")" + std::string(kMaxBody + 1000, 'x') + R"("})", 413, "request_too_large", ""},
      {"unknown path", "/v1/embeddings", R"({"input": "x"})", 404, "not_found", ""},
  };
  auto c = client();
  for (const BadRequest& bad : cases) {
    SCOPED_TRACE(bad.name);
    auto res = c->Post(bad.path, bad.body, "application/json");
    ASSERT_TRUE(res) << to_string(res.error());
    EXPECT_EQ(res->status, bad.status) << res->body;
    const Json j = Json::parse(res->body, nullptr, false);
    expect_error_object(j);
    if (!bad.code.empty()) {
      EXPECT_EQ(j["error"]["code"], bad.code) << j;
    }
    if (!bad.param.empty()) {
      EXPECT_EQ(j["error"]["param"], bad.param) << j;
    }
    if (bad.name == "duplicate key") {
      EXPECT_NE(j["error"]["message"].get<std::string>().find("key 'max_tokens' is listed more than once"),
                std::string::npos) << j;
    }
  }

  // Authentication: missing or wrong key -> 401; /health and /metrics stay open.
  auto anonymous = client(10, /*with_key=*/false);
  auto res = anonymous->Post("/v1/completions", completion_body("hi", 1).dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 401);
  expect_error_object(Json::parse(res->body, nullptr, false), "authentication_error");
  anonymous->set_bearer_token_auth("wrong-key");
  res = anonymous->Get("/v1/models");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 401);
  expect_error_object(Json::parse(res->body, nullptr, false), "authentication_error");
  EXPECT_EQ(Json::parse(res->body)["error"]["code"], "invalid_api_key");
  res = anonymous->Get("/health");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);

  // The server still serves.
  int status = 0;
  const Json j = post_json(*c, "/v1/completions", completion_body("still alive?", 3), &status);
  EXPECT_EQ(status, 200) << j;
  EXPECT_EQ(j["usage"]["completion_tokens"], 3);
}

// A second server, configured from environment variables, stopped with SIGTERM while clients
// are streaming, with no grace (--shutdown-timeout 0): each stream is cut short cleanly (an
// error event, then [DONE]), the process exits 0.
TEST(ServerShutdown, EnvironmentFlagsAndSigtermWithActiveStreams) {
  char pattern[] = "/tmp/dsv4_server_test_XXXXXX";
  ASSERT_NE(mkdtemp(pattern), nullptr);
  const std::filesystem::path dir(pattern);
  const std::string model = (dir / "model").string();
  ASSERT_EQ(run_command({DSV4_SERVE_BINARY, "make-model", "--preset", "tiny", "--out", model}, dir / "make.log"), 0);
  setenv("DSV4_API_KEY", "env-key", 1);
  setenv("DSV4_SERVED_MODEL_NAME", "env-model", 1);
  setenv("DSV4_MAX_MODEL_LEN", "300", 1);
  ServerProcess server;
  const bool started = server.start(DSV4_SERVE_BINARY, {"--model", model, "--threads", "1", "--cache-gb", "0.1", "--shutdown-timeout", "0"},
                                    dir / "server.log");
  unsetenv("DSV4_API_KEY");
  unsetenv("DSV4_SERVED_MODEL_NAME");
  unsetenv("DSV4_MAX_MODEL_LEN");
  ASSERT_TRUE(started) << server.log();

  HttpClient c("127.0.0.1", server.port());
  c.set_read_timeout(30);
  auto res = c.Get("/v1/models");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 401);
  c.set_bearer_token_auth("env-key");
  res = c.Get("/v1/models");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const Json models = Json::parse(res->body);
  EXPECT_EQ(models["data"][0]["id"], "env-model");
  EXPECT_EQ(models["data"][0]["max_model_len"], 300);

  constexpr int kClients = 3;
  std::atomic<int> streaming{0};
  std::vector<StreamResult> results(kClients);
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      HttpClient client("127.0.0.1", server.port());
      client.set_read_timeout(30);
      client.set_bearer_token_auth("env-key");
      Json body = {{"prompt", "endless " + std::to_string(i)}, {"max_tokens", 250}, {"ignore_eos", true}, {"stream", true}};
      bool counted = false;
      results[i] = post_stream(client, "/v1/completions", body, [&](const Json&) {
        if (!counted) {
          counted = true;
          ++streaming;
        }
        return true;
      });
    });
  }
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (streaming < kClients && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(streaming.load(), kClients);
  const auto stop_start = std::chrono::steady_clock::now();
  EXPECT_EQ(server.stop(20s), 0) << server.log();
  EXPECT_LT(std::chrono::steady_clock::now() - stop_start, 15s);
  for (auto& t : threads) t.join();
  for (const StreamResult& r : results) {  // cut short, not completed, and ended cleanly
    EXPECT_TRUE(r.done) << r.raw;
    ASSERT_FALSE(r.events.empty());
    EXPECT_EQ(r.events.back()["error"]["code"], "server_shutting_down") << r.raw;
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace
}  // namespace dsv4::test
