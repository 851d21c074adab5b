// The OpenAI-compatible HTTP server.
//
//   POST /v1/completions, /v1/chat/completions   streaming (SSE) or not
//   GET  /v1/models                              the served model
//   GET  /health                                 503 while the model loads, 200 when ready
//   GET  /metrics                                Prometheus text (metrics.h)
//
// Threads: one Boost.Asio io_context run by a few threads (ServerOptions::http_threads) owns
// every socket. Connections are event-driven: an idle or slow connection costs no thread, every
// read has a deadline (headers, body, keep-alive), header and body limits apply to the decoded
// bytes, and connections beyond max_connections get a 503 and are closed. Parsing and
// tokenizing a generation request runs on a small fixed pool (prepare_threads) with a bounded
// number of requests admitted at once (max_pending_prepares; beyond it a 503). One loop thread
// steps the engine (engine.h) and hands each RequestOutput to its connection through a small
// per-request queue plus asio::post: it never touches a socket. A connection whose client goes
// away (connection_probe.h, or a failed write) aborts its request, which frees its KV cache at
// the next step. The port is bound first; the model loads on a background thread, so /health
// answers 503 meanwhile.
//
// Shutdown (stop()): the listening socket closes, connections waiting for a request close at
// once, requests in flight get shutdown_timeout seconds to finish; then each remaining stream
// ends with an error event, "data: [DONE]" and the last chunk, and each remaining
// non-streaming request gets a 503.
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
  std::size_t max_body_bytes = 4u << 20;    // larger request bodies get 413 (decoded: chunked counts its data)
  std::size_t max_header_bytes = 64u << 10; // request line + header fields; more gets 431
  std::size_t max_header_fields = 100;      // more header fields get 431
  std::size_t max_buffered_body_bytes = 256u << 20;  // request bodies being read or parsed at once, counted by
                                            // their declared length (a chunked body: max_body_bytes); a body
                                            // that does not fit gets 503; at least max_body_bytes
  int http_threads = 0;                     // threads running the io_context; 0: 2
  int max_connections = 0;                  // open connections; more get 503 and are closed; 0: 4096
                                            // (at most the file-descriptor limit less 64)
  double header_timeout_s = 10;             // a new connection's request line + headers must arrive within
  double body_timeout_s = 30;               // a request body must arrive in full within
  double keep_alive_timeout_s = 5;          // an idle keep-alive connection is closed after
  double write_timeout_s = 30;              // one write to a client must complete within
  double shutdown_timeout_s = 10;           // stop(): how long requests in flight may still run
  int prepare_threads = 2;                  // threads that parse and tokenize generation requests
  int max_pending_prepares = 64;            // generation requests parsed/tokenized or waiting to be; more get 503
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
  // From any thread (not from a signal handler): stops accepting, lets requests in flight run
  // for shutdown_timeout_s, ends the rest (see above) and ends run().
  void stop();

  struct Impl;  // public only so that server.cc's helpers can name it

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsv4::server
