// Honest clients served while hostile ones are connected: slow-header tricklers, idle
// connections, gzip bombs, header floods and endless chunked bodies, all at once against a real
// `dsv4 serve` for a bounded time. Prints the honest clients' latency (p50 / p99 / max).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>

#include "server_process.h"

#ifndef DSV4_SERVE_BINARY
#error "DSV4_SERVE_BINARY must name the dsv4 binary"
#endif

namespace dsv4::test {
namespace {

constexpr auto kDuration = std::chrono::seconds(12);
constexpr int kSlow = 200;
constexpr int kIdle = 300;

void raise_fd_limit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
  }
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())))];
}

TEST(ServerLoad, HonestClientsServedAmongHostileOnes) {
  raise_fd_limit();
  const std::filesystem::path dir = make_tiny_model_dir(DSV4_SERVE_BINARY, "dsv4_server_load");
  ASSERT_FALSE(dir.empty()) << "make-model failed";
  const std::string model = (dir / "model").string();
  ServerProcess server;
  ASSERT_TRUE(server.start(DSV4_SERVE_BINARY,
                           {"--model", model, "--served-model-name", "load", "--max-model-len", "512", "--max-num-seqs",
                            "8", "--threads", "1", "--cache-gb", "0.2", "--http-header-timeout", "3",
                            "--timeout-keep-alive", "2", "--max-connections", "2000"},
                           dir / "server.log"))
      << server.log();
  const int port = server.port();
  std::atomic<bool> stop{false};
  std::atomic<long> hostile_requests{0};
  std::vector<std::thread> hostile;

  // Slow headers: a byte a second; reconnect when the server closes one.
  hostile.emplace_back([&] {
    std::vector<RawConnection> conns(kSlow);
    while (!stop) {
      for (RawConnection& c : conns) {
        if (!c.ok() || !c.send("a", 50ms)) {
          c = RawConnection(port);
          c.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ");
          ++hostile_requests;
        }
      }
      for (int i = 0; i < 10 && !stop; ++i) std::this_thread::sleep_for(100ms);
    }
  });
  // Idle connections: opened and left alone; reopened once the server drops them.
  hostile.emplace_back([&] {
    std::vector<RawConnection> conns(kIdle);
    while (!stop) {
      for (RawConnection& c : conns) {
        if (!c.ok() || c.closed_within(0ms)) {
          c = RawConnection(port);
          ++hostile_requests;
        }
      }
      for (int i = 0; i < 5 && !stop; ++i) std::this_thread::sleep_for(100ms);
    }
  });
  // A gzip bomb (510 KB that would inflate to 512 MiB), a 1 MB header flood and an endless
  // chunked body, in turn.
  hostile.emplace_back([&] {
    const std::string bomb(510 * 1024, '\0');
    const std::string flood_field = "X-Flood: " + std::string(1000, 'f') + "\r\n";
    const std::string chunk = fmt::format("{:x}\r\n{}\r\n", 65536, std::string(65536, 'x'));
    for (int round = 0; !stop; ++round) {
      RawConnection c(port);
      if (round % 3 == 0) {
        c.send(fmt::format("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\nContent-Length: {}\r\n\r\n",
                           bomb.size()));
        c.send(bomb, 500ms);
      } else if (round % 3 == 1) {
        c.send("GET /health HTTP/1.1\r\nHost: x\r\n");
        for (int i = 0; i < 1000 && c.send(flood_field, 200ms); ++i) {
        }
      } else {
        c.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
        for (int i = 0; i < 200 && c.send(chunk, 200ms); ++i) {
        }
      }
      c.read_response(1000ms);
      ++hostile_requests;
    }
  });
  std::this_thread::sleep_for(1500ms);  // let the hostile load build up

  std::mutex mu;
  std::vector<double> latencies;
  std::vector<std::string> failures;
  std::vector<std::thread> honest;
  const auto end = std::chrono::steady_clock::now() + kDuration;
  for (int t = 0; t < 4; ++t) {
    honest.emplace_back([&, t] {
      HttpClient c("127.0.0.1", port);
      c.set_read_timeout(20);
      for (int i = 0; std::chrono::steady_clock::now() < end; ++i) {
        const auto start = std::chrono::steady_clock::now();
        HttpResult r = (i % 4 == 3) ? c.Get("/health")
                                    : c.Post("/v1/completions",
                                             Json{{"prompt", fmt::format("honest {} {}", t, i)},
                                                  {"max_tokens", 4},
                                                  {"ignore_eos", true}}
                                                 .dump(),
                                             "application/json");
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::lock_guard lock(mu);
        if (!r || r->status != 200) {
          failures.push_back(r ? fmt::format("status {}: {}", r->status, r->body) : to_string(r.error()));
        } else {
          latencies.push_back(seconds);
        }
      }
    });
  }
  for (auto& t : honest) t.join();
  stop = true;
  for (auto& t : hostile) t.join();

  const double p50 = percentile(latencies, 0.50), p99 = percentile(latencies, 0.99);
  const double max = latencies.empty() ? 0 : *std::max_element(latencies.begin(), latencies.end());
  std::printf("honest requests: %zu ok, %zu failed; latency p50 %.1f ms, p99 %.1f ms, max %.1f ms; "
              "hostile connections/requests: %ld (%d slow-header and %d idle held open)\n",
              latencies.size(), failures.size(), p50 * 1e3, p99 * 1e3, max * 1e3, hostile_requests.load(), kSlow, kIdle);
  EXPECT_TRUE(failures.empty()) << failures.size() << " failed, first: " << failures.front();
  EXPECT_GT(latencies.size(), 20u);
  EXPECT_LT(p99, 5.0);
  EXPECT_TRUE(server.alive()) << server.log();
  EXPECT_EQ(server.stop(), 0) << server.log();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace
}  // namespace dsv4::test
