// The server in-process: /health is 503 (with an OpenAI error object) until the model has
// loaded, a failed load ends run() with the loader's error, and SIGPIPE is handled on the
// server's own threads without changing the process's disposition.
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <future>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/error.h"
#include "server/server.h"
#include "server/sigpipe.h"
#include "http_client.h"

namespace dsv4::server {
namespace {

using namespace std::chrono_literals;
using test::HttpClient;

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
  HttpClient c("127.0.0.1", port_future.get());
  c.set_read_timeout(5);
  for (const char* path : {"/health", "/v1/models"}) {
    auto res = c.Get(path);
    ASSERT_TRUE(res) << path << ": " << test::to_string(res.error());
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
  // Another listener holds a port (with SO_REUSEADDR, as a server would).
  const int other = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(other, 0);
  int yes = 1;
  setsockopt(other, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(other, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(other, 4), 0);
  socklen_t len = sizeof(addr);
  getsockname(other, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);
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
  close(other);
}

bool sigpipe_blocked_here() {
  sigset_t mask;
  pthread_sigmask(SIG_BLOCK, nullptr, &mask);
  return sigismember(&mask, SIGPIPE) == 1;
}

void (*sigpipe_handler())(int) {
  struct sigaction action {};
  sigaction(SIGPIPE, nullptr, &action);
  return action.sa_handler;
}

// SIGPIPE's default disposition (the process ends) for a test's duration, whatever an earlier
// test in this program left.
class DefaultSigpipe {
 public:
  DefaultSigpipe() {
    struct sigaction action {};
    action.sa_handler = SIG_DFL;
    sigaction(SIGPIPE, &action, &saved_);
  }
  ~DefaultSigpipe() { sigaction(SIGPIPE, &saved_, nullptr); }

 private:
  struct sigaction saved_ {};
};

// A write to a closed peer on a thread started under with_sigpipe_blocked fails with EPIPE; with
// SIGPIPE's default disposition an unblocked thread would end the test program instead. The
// caller's own mask is restored.
TEST(ServerSignals, ThreadsStartedWithSigpipeBlockedSurviveAClosedPeer) {
  DefaultSigpipe default_sigpipe;
  ASSERT_FALSE(sigpipe_blocked_here());
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  ASSERT_EQ(close(fds[1]), 0);
  int write_errno = 0;
  bool blocked_there = false;
  std::thread writer = with_sigpipe_blocked([&] {
    return std::thread([&] {
      blocked_there = sigpipe_blocked_here();
      write_errno = write(fds[0], "x", 1) < 0 ? errno : 0;
    });
  });
  EXPECT_FALSE(sigpipe_blocked_here());
  writer.join();
  close(fds[0]);
  EXPECT_TRUE(blocked_there);
  EXPECT_EQ(write_errno, EPIPE);
}

// Serving does not change what SIGPIPE does to the rest of the process.
TEST(ServerSignals, RunLeavesTheSigpipeDispositionAlone) {
  DefaultSigpipe default_sigpipe;
  ServerOptions options;
  options.port = 0;
  Server server(options, []() -> LoadedModel { fail("no model"); });
  EXPECT_EQ(sigpipe_handler(), SIG_DFL) << "after constructing the server";
  std::promise<int> port;
  std::thread runner([&] {
    try {
      server.run([&](int p) { port.set_value(p); });
    } catch (const Error&) {
    }
  });
  auto port_future = port.get_future();
  ASSERT_EQ(port_future.wait_for(10s), std::future_status::ready);
  HttpClient c("127.0.0.1", port_future.get());
  c.Get("/health");  // served on a handler thread
  runner.join();
  EXPECT_EQ(sigpipe_handler(), SIG_DFL);
  EXPECT_FALSE(sigpipe_blocked_here());
}

}  // namespace
}  // namespace dsv4::server
