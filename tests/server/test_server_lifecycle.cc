// The server in-process: /health is 503 (with an OpenAI error object) until the model has
// loaded, and a failed load ends run() with the loader's error.
#include <gtest/gtest.h>
#include <httplib.h>

#include <future>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/error.h"
#include "server/server.h"

namespace dsv4::server {
namespace {

using namespace std::chrono_literals;

TEST(ServerLifecycle, Health503WhileLoadingThenLoadFailureEndsRun) {
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  ServerOptions options;
  options.port = 0;
  options.served_model_names = {"m"};
  Server server(options, [released]() -> LoadedModel {
    released.wait();
    fail("no model here");
  });
  std::promise<int> port;
  std::string error;
  std::thread runner([&] {
    try {
      server.run([&](int p) { port.set_value(p); });
    } catch (const Error& e) {
      error = e.what();
    }
  });
  auto port_future = port.get_future();
  ASSERT_EQ(port_future.wait_for(10s), std::future_status::ready);
  httplib::Client c("127.0.0.1", port_future.get());
  c.set_read_timeout(5);
  for (const char* path : {"/health", "/v1/models"}) {
    auto res = c.Get(path);
    ASSERT_TRUE(res) << path;
    EXPECT_EQ(res->status, 503) << path;
    const auto j = nlohmann::json::parse(res->body, nullptr, false);
    EXPECT_TRUE(j.contains("error")) << res->body;
    EXPECT_EQ(j["error"]["type"], "server_error") << res->body;
  }
  auto post = c.Post("/v1/completions", R"({"prompt": "hi"})", "application/json");
  ASSERT_TRUE(post);
  EXPECT_EQ(post->status, 503);
  auto metrics = c.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 200);
  EXPECT_NE(metrics->body.find("vllm:num_requests_running{model_name=\"m\"} 0"), std::string::npos);

  release.set_value();
  runner.join();
  EXPECT_NE(error.find("no model here"), std::string::npos) << error;
}

TEST(ServerLifecycle, StopBeforeReadyReturns) {
  ServerOptions options;
  options.port = 0;
  Server server(options, []() -> LoadedModel { fail("never loads"); });
  std::thread stopper;
  std::string error;
  try {
    server.run([&](int) { stopper = std::thread([&] { server.stop(); }); });
  } catch (const Error& e) {
    error = e.what();
  }
  stopper.join();
  EXPECT_NE(error.find("never loads"), std::string::npos) << error;
}

TEST(ServerLifecycle, PortInUseIsAnError) {
  httplib::Server other;
  const int port = other.bind_to_any_port("127.0.0.1");
  ASSERT_GT(port, 0);
  ServerOptions options;
  options.port = port;
  bool loaded = false;
  Server server(options, [&loaded]() -> LoadedModel {
    loaded = true;
    fail("unused");
  });
  try {
    server.run();
    ADD_FAILURE() << "run() returned";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot bind"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(loaded);
}

}  // namespace
}  // namespace dsv4::server
