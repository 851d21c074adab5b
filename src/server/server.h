// The OpenAI-compatible HTTP server.
//
//   POST /v1/completions, /v1/chat/completions   streaming (SSE) or not
//   GET  /v1/models                              the served model
//   GET  /health                                 503 while the model loads, 200 when ready
//   GET  /metrics                                Prometheus text (metrics.h)
//
// Threads: cpp-httplib's pool runs the handlers, with SIGPIPE blocked on those threads only (a
// client that hangs up costs a failed write, not the process; the process's SIGPIPE setting is
// left alone: sigpipe.h). One loop thread steps the engine (engine.h) and hands each
// RequestOutput to the handler waiting for that request through a small per-request queue. A
// handler whose client goes away (connection_probe.h, or a failed write) aborts its request,
// which frees its KV cache at the next step. The port is bound first; the model loads on a
// background thread, so /health answers 503 meanwhile.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "text/text_codec.h"

namespace dsv4::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                          // 0: any free port (see Server::port)
  std::vector<std::string> served_model_names;  // the first is reported; empty: "dsv4"
  std::string api_key;                      // empty: no authentication
  std::size_t max_body_bytes = 4u << 20;    // larger request bodies get 413
  int http_threads = 0;                     // HTTP handler threads; 0: 64
  std::int64_t max_logprobs = 20;
  bool log_requests = false;
};

// What the loader returns: the engine and its text codec.
struct LoadedModel {
  std::unique_ptr<Engine> engine;
  std::unique_ptr<TextCodec> codec;
  std::string model_path;  // "root" in /v1/models
};

class Server {
 public:
  Server(ServerOptions options, std::function<LoadedModel()> load);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds the port (throws Error when it cannot), calls `on_bound(port)`, loads the model on a
  // background thread and serves until stop(). Throws Error when loading failed.
  void run(const std::function<void(int port)>& on_bound = {});
  // From any thread (not from a signal handler): aborts running requests and ends run().
  void stop();

  struct Impl;  // public only so that server.cc's helpers can name it

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsv4::server
