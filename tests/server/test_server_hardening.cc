// The HTTP front end under hostile and unusual clients, against a real `dsv4 serve` over
// loopback: body limits on decoded bytes (compressed and chunked bodies), deadlines for slow and
// idle connections, the connection cap, header limits, Range ignored, HTTP/1.1 conformance
// (pipelining, framing errors, 405/411), prompts refused by their byte length, a KV cache too
// small for max_model_len refused at startup, and shutdown (drain, then streams ended cleanly;
// a second signal exits at once). Every wait is bounded.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <thread>

#include "server_process.h"

#ifndef DSV4_SERVE_BINARY
#error "DSV4_SERVE_BINARY must name the dsv4 binary"
#endif

namespace dsv4::test {
namespace {

constexpr const char* kModel = "tiny-hard";
constexpr int kMaxModelLen = 512;
constexpr std::size_t kMaxBody = 64 * 1024;
constexpr int kMaxConnections = 200;
constexpr std::size_t kMaxBufferedBodies = 3;  // --max-buffered-body-bytes, in full bodies

std::chrono::milliseconds ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t);
}

std::string completion(int max_tokens, const std::string& prompt = "hello there", bool stream = false) {
  Json b = {{"model", kModel}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"ignore_eos", true}, {"temperature", 0}};
  if (stream) b["stream"] = true;
  return b.dump();
}

std::string post_head(const std::string& path, std::size_t length, const std::string& extra = {}) {
  return fmt::format("POST {} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{}\r\n",
                     path, length, extra);
}

Json body_json(const HttpResult& r) { return r ? Json::parse(r->body, nullptr, false) : Json(); }

class ServerHardening : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::filesystem::path(make_tiny_model_dir(DSV4_SERVE_BINARY, "dsv4_server_hard"));
    ASSERT_FALSE(dir_->empty());
    server_ = new ServerProcess();
    const bool started = server_->start(
        DSV4_SERVE_BINARY,
        {"--model", (*dir_ / "model").string(), "--served-model-name", kModel, "--max-model-len",
         std::to_string(kMaxModelLen), "--max-num-seqs", "4", "--max-num-batched-tokens", "512", "--threads", "1",
         "--cache-gb", "0.1", "--max-request-body-bytes", std::to_string(kMaxBody), "--max-buffered-body-bytes",
         std::to_string(kMaxBufferedBodies * kMaxBody), "--http-header-timeout", "2",
         "--http-body-timeout", "2", "--timeout-keep-alive", "1", "--max-connections",
         std::to_string(kMaxConnections)},
        *dir_ / "server.log");
    ASSERT_TRUE(started) << server_->log();
  }

  static void TearDownTestSuite() {
    if (server_) {
      EXPECT_EQ(server_->stop(), 0) << server_->log();
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

  void SetUp() override { ASSERT_TRUE(server_ && server_->alive()) << "no server is running"; }
  void TearDown() override { ASSERT_TRUE(server_->alive()) << "the server died:\n" << server_->log(); }

  static int port() { return server_->port(); }
  static HttpClient client(int read_timeout_s = 10) {
    HttpClient c("127.0.0.1", port());
    c.set_read_timeout(read_timeout_s);
    return c;
  }
  // Writes `request` on a fresh connection and reads one response.
  static HttpResult exchange(const std::string& request, std::chrono::milliseconds timeout = 5000ms) {
    RawConnection c(port());
    if (!c.ok()) return HttpError::Connection;
    if (!c.send(request)) return HttpError::Write;
    return c.read_response(timeout);
  }
  // /health answers 200 within `limit`.
  static void expect_health_within(std::chrono::milliseconds limit) {
    const auto start = std::chrono::steady_clock::now();
    HttpClient c = client(static_cast<int>(limit.count() / 1000 + 1));
    const HttpResult r = c.Get("/health");
    ASSERT_TRUE(r) << to_string(r.error());
    EXPECT_EQ(r->status, 200);
    EXPECT_LT(ms_since(start), limit);
  }

  static std::filesystem::path* dir_;
  static ServerProcess* server_;
};

std::filesystem::path* ServerHardening::dir_ = nullptr;
ServerProcess* ServerHardening::server_ = nullptr;

// Defect 1: a compressed body is refused (415) before it is read, whatever it would inflate to.
TEST_F(ServerHardening, CompressedBodyIsRefused) {
  const std::string gzip_magic("\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03", 10);
  const HttpResult r = exchange(post_head("/v1/completions", gzip_magic.size(), "Content-Encoding: gzip\r\n") + gzip_magic);
  ASSERT_TRUE(r) << to_string(r.error());
  EXPECT_EQ(r->status, 415) << r->body;
  EXPECT_EQ(body_json(r)["error"]["code"], "unsupported_content_encoding") << r->body;
  // identity is no encoding at all.
  const std::string body = completion(1);
  const HttpResult ok = exchange(post_head("/v1/completions", body.size(), "Content-Encoding: identity\r\n") + body);
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
}

// Defect 1: a chunked body counts its decoded bytes against the limit (413); one under the
// limit is served.
TEST_F(ServerHardening, ChunkedBodyIsCappedOnDecodedBytes) {
  RawConnection c(port());
  ASSERT_TRUE(c.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"));
  const std::string piece(8192, 'x');
  bool refused_early = false;
  for (std::size_t sent = 0; sent < 4 * kMaxBody; sent += piece.size()) {
    if (!c.send(fmt::format("{:x}\r\n{}\r\n", piece.size(), piece), 2000ms)) {
      refused_early = true;  // the server answered and closed
      break;
    }
  }
  (void)refused_early;
  const HttpResult r = c.read_response(5000ms);
  ASSERT_TRUE(r) << to_string(r.error());
  EXPECT_EQ(r->status, 413) << r->body;
  EXPECT_EQ(body_json(r)["error"]["code"], "request_too_large");

  const std::string body = completion(2);
  const std::string half1 = body.substr(0, body.size() / 2), half2 = body.substr(body.size() / 2);
  const HttpResult ok = exchange(fmt::format(
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{}\r\n{:x}\r\n{}\r\n0\r\n\r\n",
      half1.size(), half1, half2.size(), half2));
  ASSERT_TRUE(ok) << to_string(ok.error());
  EXPECT_EQ(ok->status, 200) << ok->body;
}

// Defect 3: the bodies held at once are bounded server-wide (by their declared lengths), so
// many connections each sending a legal body cannot add up: the next body gets 503 before
// any of it is read, and the allowance comes back when the holders go.
TEST_F(ServerHardening, BodiesHeldAtOnceAreBounded) {
  std::vector<RawConnection> holders;
  for (std::size_t i = 0; i < kMaxBufferedBodies; ++i) {
    holders.emplace_back(port());
    ASSERT_TRUE(holders.back().ok());
    // A full-size body announced, a few bytes of it sent: the rest never comes.
    ASSERT_TRUE(holders.back().send(post_head("/v1/completions", kMaxBody) + "{\"pro"));
  }
  std::this_thread::sleep_for(300ms);  // every head read
  const std::string body = completion(1);
  const HttpResult busy = exchange(post_head("/v1/completions", body.size()) + body);
  ASSERT_TRUE(busy) << to_string(busy.error());
  EXPECT_EQ(busy->status, 503) << busy->body;
  EXPECT_EQ(body_json(busy)["error"]["code"], "server_busy") << busy->body;
  // Requests without a body are not held back.
  expect_health_within(1000ms);

  holders.clear();                     // the clients go: their allowance comes back
  std::this_thread::sleep_for(300ms);
  const HttpResult ok = exchange(post_head("/v1/completions", body.size()) + body);
  ASSERT_TRUE(ok) << to_string(ok.error());
  EXPECT_EQ(ok->status, 200) << ok->body;
}

// Defect 2: slow-header connections cost no thread and hit their deadline (408, closed);
// /health stays prompt meanwhile.
TEST_F(ServerHardening, SlowHeadersDoNotStarveOthers) {
  std::vector<RawConnection> slow;
  for (int i = 0; i < 150; ++i) {
    slow.emplace_back(port());
    ASSERT_TRUE(slow.back().ok()) << i;
    ASSERT_TRUE(slow.back().send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: "));
  }
  expect_health_within(1000ms);
  for (int i = 0; i < 3; ++i) {  // trickle: the deadline is for the whole header, not per byte
    for (RawConnection& c : slow) c.send("a");
    std::this_thread::sleep_for(300ms);
  }
  expect_health_within(1000ms);
  // 2 s after connecting, each is answered 408 and closed.
  int timed_out = 0;
  for (RawConnection& c : slow) {
    const HttpResult r = c.read_response(4000ms);
    if (r && r->status == 408 && c.closed_within(1000ms)) ++timed_out;
  }
  EXPECT_EQ(timed_out, 150);
}

// Defect 2: connections past the cap get a clear 503 at once (no queue); idle connections and
// idle keep-alive connections time out, after which new clients are served again.
TEST_F(ServerHardening, ConnectionCapAndIdleTimeouts) {
  std::vector<RawConnection> idle;
  for (int i = 0; i < kMaxConnections; ++i) {
    idle.emplace_back(port());
    ASSERT_TRUE(idle.back().ok()) << i;
  }
  std::this_thread::sleep_for(200ms);  // all accepted
  const auto start = std::chrono::steady_clock::now();
  HttpClient c = client(5);
  const HttpResult refused = c.Get("/health");
  ASSERT_TRUE(refused) << to_string(refused.error());
  EXPECT_EQ(refused->status, 503);
  EXPECT_EQ(body_json(refused)["error"]["code"], "too_many_connections") << refused->body;
  EXPECT_LT(ms_since(start), 1000ms);
  // The header deadline (2 s) closes the idle ones without a response.
  int closed = 0;
  for (RawConnection& conn : idle) closed += conn.closed_within(4000ms) ? 1 : 0;
  EXPECT_EQ(closed, kMaxConnections);
  std::this_thread::sleep_for(100ms);
  expect_health_within(1000ms);

  // Keep-alive: served twice on one connection, then closed after 1 s idle.
  RawConnection keep(port());
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(keep.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n"));
    const HttpResult r = keep.read_response(2000ms);
    ASSERT_TRUE(r) << to_string(r.error());
    EXPECT_EQ(r->status, 200);
  }
  const auto idle_start = std::chrono::steady_clock::now();
  EXPECT_TRUE(keep.closed_within(3000ms));
  EXPECT_GE(ms_since(idle_start), 800ms);
}

// Defect 4: header bytes and header fields are limited (431), not accepted without end.
TEST_F(ServerHardening, HeaderLimits) {
  RawConnection big(port());
  ASSERT_TRUE(big.send("GET /health HTTP/1.1\r\nHost: x\r\n"));
  const std::string field = "X-Filler: " + std::string(1000, 'f') + "\r\n";
  for (int i = 0; i < 200; ++i) {
    if (!big.send(field, 2000ms)) break;  // refused and closed
  }
  const HttpResult r = big.read_response(5000ms);
  ASSERT_TRUE(r) << to_string(r.error());
  EXPECT_EQ(r->status, 431);
  EXPECT_EQ(body_json(r)["error"]["code"], "request_header_fields_too_large") << r->body;

  std::string many = "GET /health HTTP/1.1\r\nHost: x\r\n";
  for (int i = 0; i < 150; ++i) many += fmt::format("X-F{}: 1\r\n", i);
  const HttpResult fields = exchange(many + "\r\n");
  ASSERT_TRUE(fields);
  EXPECT_EQ(fields->status, 431);
}

// Defect 6: Range is ignored: always the full 200.
TEST_F(ServerHardening, RangeIsIgnored) {
  std::string ranges = "bytes=0-0";
  for (int i = 1; i < 1500; ++i) ranges += ",0-0";
  const HttpResult m = client().Get("/metrics", {{"Range", ranges}});
  ASSERT_TRUE(m) << to_string(m.error());
  EXPECT_EQ(m->status, 200);
  EXPECT_FALSE(m->has_header("Content-Range"));
  EXPECT_NE(m->body.find("vllm:num_requests_running"), std::string::npos);
  EXPECT_LT(m->body.size(), 1u << 20);

  HttpClient c = client();
  const HttpResult g = c.send("POST", "/v1/completions", completion(3), "application/json", {{"Range", "bytes=0-9"}});
  ASSERT_TRUE(g);
  EXPECT_EQ(g->status, 200) << g->body;
  EXPECT_EQ(body_json(g)["usage"]["completion_tokens"], 3) << g->body;
}

// Defect 8: pipelined requests are answered in order on one connection.
TEST_F(ServerHardening, PipelinedRequestsAnsweredInOrder) {
  const std::string body = completion(2);
  RawConnection c(port());
  ASSERT_TRUE(c.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n" + post_head("/v1/completions", body.size()) + body +
                     "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n" + "GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n"));
  const HttpResult a = c.read_response(5000ms);
  const HttpResult b = c.read_response(10000ms);
  const HttpResult m = c.read_response(5000ms);
  const HttpResult n = c.read_response(5000ms);
  ASSERT_TRUE(a && b && m && n);
  EXPECT_EQ(a->status, 200);
  EXPECT_EQ(b->status, 200) << b->body;
  EXPECT_EQ(body_json(b)["object"], "text_completion");
  EXPECT_EQ(m->status, 200);
  EXPECT_EQ(body_json(m)["object"], "list");
  EXPECT_EQ(n->status, 404);
}

// Defect 8: framing errors are answered at once and hold nothing.
TEST_F(ServerHardening, FramingErrors) {
  struct Case {
    std::string name, request;
    int status;
    bool closes;
  };
  const std::vector<Case> cases = {
      {"chunked and content-length",
       "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400,
       true},
      {"content-length and chunked",
       "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n", 400,
       true},
      {"post without a length", "POST /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n", 411, false},
      {"negative content-length", "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", 400, true},
      {"negative chunk size",
       "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\nhello\r\n", 400, true},
      {"transfer-encoding not chunked",
       "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 400, true},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    const auto start = std::chrono::steady_clock::now();
    RawConnection c(port());
    ASSERT_TRUE(c.send(k.request));
    const HttpResult r = c.read_response(3000ms);
    ASSERT_TRUE(r) << to_string(r.error());
    EXPECT_EQ(r->status, k.status) << r->body;
    EXPECT_TRUE(body_json(r).contains("error")) << r->body;
    EXPECT_LT(ms_since(start), 1000ms);
    if (k.closes) {
      EXPECT_TRUE(c.closed_within(1000ms));
    }
  }
}

// Defect 8: a wrong method on a known path is 405 with Allow.
TEST_F(ServerHardening, WrongMethodIs405WithAllow) {
  HttpClient c = client();
  const HttpResult get = c.Get("/v1/completions");
  ASSERT_TRUE(get);
  EXPECT_EQ(get->status, 405);
  EXPECT_EQ(get->get_header_value("Allow"), "POST");
  EXPECT_EQ(body_json(get)["error"]["code"], "method_not_allowed");
  const HttpResult del = c.send("DELETE", "/health", {}, {});
  ASSERT_TRUE(del);
  EXPECT_EQ(del->status, 405);
  EXPECT_EQ(del->get_header_value("Allow"), "GET, HEAD");
  const HttpResult post = c.Post("/metrics", "{}", "application/json");
  ASSERT_TRUE(post);
  EXPECT_EQ(post->status, 405);
  const HttpResult head = c.send("HEAD", "/health", {}, {});
  ASSERT_TRUE(head);
  EXPECT_EQ(head->status, 200);
}

// Defect 3: a prompt that cannot fit is refused by its byte length, before tokenizing; one that
// fits is not.
TEST_F(ServerHardening, LongPromptRefusedByBytes) {
  HttpClient c = client();
  const std::string huge(60000, 'z');
  const HttpResult r = c.Post("/v1/completions", completion(1, huge), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  const Json j = body_json(r);
  EXPECT_EQ(j["error"]["code"], "context_length_exceeded") << r->body;
  EXPECT_NE(j["error"]["message"].get<std::string>().find("bytes, so at least"), std::string::npos) << r->body;
  Json chat = {{"model", kModel}, {"messages", {{{"role", "user"}, {"content", huge}}}}, {"max_tokens", 1}};
  const HttpResult rc = c.Post("/v1/chat/completions", chat.dump(), "application/json");
  ASSERT_TRUE(rc);
  EXPECT_EQ(rc->status, 400) << rc->body;
  EXPECT_EQ(body_json(rc)["error"]["param"], "messages") << rc->body;
  // 400 bytes of words: well under max_model_len tokens, served.
  std::string words;
  while (words.size() < 400) words += "tale ";
  const HttpResult ok = c.Post("/v1/completions", completion(1, words), "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
}

// --- servers of their own ---

struct OwnServer {
  std::filesystem::path dir;
  ServerProcess server;
  ~OwnServer() {
    if (server.alive()) server.stop(2000ms);
    std::error_code ec;
    if (!dir.empty()) std::filesystem::remove_all(dir, ec);
  }
  // A server for long streams, with this --shutdown-timeout and `extra` flags.
  bool start(const std::string& shutdown_timeout, std::vector<std::string> extra = {}) {
    dir = make_tiny_model_dir(DSV4_SERVE_BINARY, "dsv4_server_hard");
    if (dir.empty()) return false;
    std::vector<std::string> args{"--model", (dir / "model").string(), "--served-model-name", kModel,
                                  "--max-model-len", "4096", "--threads", "1", "--cache-gb", "0.2",
                                  "--shutdown-timeout", shutdown_timeout};
    args.insert(args.end(), extra.begin(), extra.end());
    return server.start(DSV4_SERVE_BINARY, args, dir / "server.log");
  }
};

// Defect 7: a KV cache that cannot hold one max_model_len sequence is refused at startup, with
// the numbers.
TEST(ServerStartup, KvCacheSmallerThanOneSequenceIsRefused) {
  OwnServer own;
  own.dir = make_tiny_model_dir(DSV4_SERVE_BINARY, "dsv4_server_hard");
  ASSERT_FALSE(own.dir.empty());
  const int status =
      run_command({DSV4_SERVE_BINARY, "serve", "--port", "0", "--model", (own.dir / "model").string(), "--max-model-len",
                   "65536", "--cache-gb", "0.005", "--threads", "1"},
                  own.dir / "serve.log");
  const std::string log = read_file(own.dir / "serve.log");
  EXPECT_NE(status, 0) << log;
  EXPECT_NE(log.find("max_model_len 65536"), std::string::npos) << log;
  EXPECT_NE(log.find("KV cache"), std::string::npos) << log;
}

// Defect 5: on SIGTERM idle and slow connections close at once, a stream still running after
// the grace ends with an error event, [DONE] and the last chunk, and the process exits 0.
TEST(ServerShutdownGrace, StreamsEndCleanlyAndSlowClientsCloseAtOnce) {
  OwnServer own;
  ASSERT_TRUE(own.start("1", {"--http-header-timeout", "60"})) << own.server.log();
  RawConnection slow(own.server.port());
  ASSERT_TRUE(slow.send("GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: "));
  RawConnection idle(own.server.port());

  std::atomic<bool> streaming{false};
  StreamResult result;
  HttpResult raw = HttpError::Success;
  std::thread reader([&] {
    HttpClient c("127.0.0.1", own.server.port());
    c.set_read_timeout(30);
    raw = c.send("POST", "/v1/completions", completion(4000, "endless", true), "application/json", {},
                 [&](const char* data, std::size_t n) {
                   result.raw.append(data, n);
                   streaming = true;
                   return true;
                 });
  });
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (!streaming && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(10ms);
  ASSERT_TRUE(streaming);
  const auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(kill(own.server.pid(), SIGTERM), 0);
  EXPECT_TRUE(slow.closed_within(500ms));
  EXPECT_TRUE(idle.closed_within(500ms));
  reader.join();
  const std::optional<int> status = wait_exit(own.server.pid(), 10s);
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(*status, 0) << own.server.log();
  EXPECT_LT(ms_since(start), 5000ms);
  own.server.forget();
  // The whole chunked body arrived, terminating chunk included (read_response succeeded), and
  // its end is an error event then [DONE].
  ASSERT_TRUE(raw) << to_string(raw.error()) << "\n" << result.raw.substr(result.raw.size() > 500 ? result.raw.size() - 500 : 0);
  const std::string tail = "data: [DONE]\n\n";
  ASSERT_GE(result.raw.size(), tail.size());
  EXPECT_EQ(result.raw.substr(result.raw.size() - tail.size()), tail);
  const std::size_t last_event = result.raw.rfind("data: {", result.raw.size() - tail.size());
  ASSERT_NE(last_event, std::string::npos);
  const Json error = Json::parse(result.raw.substr(last_event + 6, result.raw.size() - tail.size() - last_event - 8),
                                 nullptr, false);
  EXPECT_EQ(error["error"]["code"], "server_shutting_down") << error;
}

// Defect 5: a second SIGTERM exits at once, requests in flight or not.
TEST(ServerShutdownGrace, SecondSignalExitsAtOnce) {
  OwnServer own;
  ASSERT_TRUE(own.start("60")) << own.server.log();
  std::atomic<bool> streaming{false};
  std::thread reader([&] {
    HttpClient c("127.0.0.1", own.server.port());
    c.set_read_timeout(30);
    c.send("POST", "/v1/completions", completion(4000, "endless", true), "application/json", {},
           [&](const char*, std::size_t) {
             streaming = true;
             return true;
           });
  });
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (!streaming && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(10ms);
  ASSERT_TRUE(streaming);
  const pid_t pid = own.server.pid();
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  std::this_thread::sleep_for(300ms);
  EXPECT_FALSE(wait_exit(pid, 0ms).has_value()) << "exited before the grace was over";
  const auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  const std::optional<int> status = wait_exit(pid, 5s);
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(*status, 1);
  EXPECT_LT(ms_since(start), 2000ms);
  own.server.forget();
  reader.join();
}

}  // namespace
}  // namespace dsv4::test
