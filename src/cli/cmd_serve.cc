// `dsv4 serve`: the OpenAI-compatible HTTP server (server/server.h) on a model directory, or
// on the built-in tiny model when --model is omitted. Flags are named as vLLM's; each can
// also come from an environment variable (DSV4_HOST, DSV4_PORT, DSV4_API_KEY, ...).
// SIGINT / SIGTERM stop it gracefully: no new connections, requests in flight get
// --shutdown-timeout seconds to finish, the rest are ended cleanly, then it exits 0. A second
// SIGINT / SIGTERM exits at once (status 1).
#include <fmt/format.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <pthread.h>
#include <thread>

#include "cli/commands.h"
#include "cli/model_options.h"
#include "common/error.h"
#include "server/server.h"

namespace dsv4::cli {
namespace {

struct ServeOptions {
  ModelOptions model;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::vector<std::string> served_model_names;
  std::string api_key;
  std::size_t max_request_body_bytes = 4u << 20;
  int http_threads = 0;
  int max_connections = 4096;
  std::size_t max_buffered_body_bytes = 256u << 20;
  double header_timeout = 10;
  double body_timeout = 30;
  double keep_alive_timeout = 5;
  double shutdown_timeout = 10;
  std::int64_t max_logprobs = 20;
  bool log_requests = false;
};

void run_serve(const ServeOptions& o) {
  server::ServerOptions options;
  options.host = o.host;
  options.port = o.port;
  options.served_model_names = o.served_model_names;
  if (options.served_model_names.empty()) options.served_model_names.push_back(o.model.model.empty() ? "dsv4-tiny" : o.model.model);
  options.api_key = o.api_key;
  options.max_body_bytes = o.max_request_body_bytes;
  options.http_threads = o.http_threads;
  options.max_connections = o.max_connections;
  options.max_buffered_body_bytes = o.max_buffered_body_bytes;
  options.header_timeout_s = o.header_timeout;
  options.body_timeout_s = o.body_timeout;
  options.keep_alive_timeout_s = o.keep_alive_timeout;
  options.shutdown_timeout_s = o.shutdown_timeout;
  options.max_logprobs = o.max_logprobs;
  options.log_requests = o.log_requests;

  const ModelOptions model_options = o.model;
  server::Server server(options, [model_options] {
    LoadedEngine loaded = load_engine(model_options);
    server::LoadedModel model;
    const ModelConfig& config = loaded.engine->model_config();
    model.codec = make_text_codec(loaded.model_dir, {.size = config.vocab_size,
                                                     .bos_id = static_cast<std::int32_t>(config.bos_token_id),
                                                     .eos_id = static_cast<std::int32_t>(config.eos_token_id)});
    model.engine = std::move(loaded.engine);
    model.model_path = loaded.model_dir.string();
    return model;
  });

  // SIGINT/SIGTERM go to one watcher thread (blocked everywhere else, so every thread started
  // from here on inherits the mask) which asks the server to stop; a second one exits at once.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::atomic<bool> done{false};
  bool stopping = false;
  std::thread watcher([&] {
    const timespec tick{0, 200'000'000};
    while (!done) {
      const int sig = sigtimedwait(&signals, nullptr, &tick);
      if (sig != SIGINT && sig != SIGTERM) continue;
      if (stopping) {
        fmt::print(stderr, "dsv4 serve: {} received again, exiting now\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
        std::fflush(stderr);
        std::_Exit(1);
      }
      stopping = true;
      fmt::print(stderr, "dsv4 serve: {} received, shutting down (requests in flight get {} s)\n",
                 sig == SIGINT ? "SIGINT" : "SIGTERM", options.shutdown_timeout_s);
      server.stop();
    }
  });
  try {
    server.run([&](int port) {
      fmt::print(stderr, "dsv4 serve: listening on http://{}:{} (model: {}, served as \"{}\"); loading the model\n",
                 options.host, port, o.model.model.empty() ? "built-in tiny" : o.model.model,
                 options.served_model_names.front());
    });
  } catch (...) {
    done = true;
    watcher.join();
    throw;
  }
  done = true;
  watcher.join();
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  CLI::App* cmd = app.add_subcommand(
      "serve", "Serve the OpenAI-compatible API (/v1/completions, /v1/chat/completions, /v1/models, /health, /metrics)");
  add_model_options(cmd, o->model, /*require_model=*/false, /*serving=*/true);
  cmd->add_option("--host", o->host, "address to listen on (default 127.0.0.1)")->envname("DSV4_HOST");
  cmd->add_option("--port", o->port, "port to listen on (default 8000; 0: any free port)")
      ->check(CLI::Range(0, 65535))
      ->envname("DSV4_PORT");
  cmd->add_option("--served-model-name", o->served_model_names,
                  "model name(s) clients use; the first is reported (default: the --model argument, or dsv4-tiny)")
      ->envname("DSV4_SERVED_MODEL_NAME");
  cmd->add_option("--api-key", o->api_key, "require 'Authorization: Bearer <key>' on /v1/ routes")->envname("DSV4_API_KEY");
  cmd->add_option("--max-request-body-bytes", o->max_request_body_bytes, "larger request bodies get 413 (default 4 MiB)")
      ->check(CLI::PositiveNumber)
      ->envname("DSV4_MAX_REQUEST_BODY_BYTES");
  cmd->add_option("--max-buffered-body-bytes", o->max_buffered_body_bytes,
                  "request bodies held at once (being read or parsed), by declared length, chunked ones at the body "
                  "limit; a body beyond it gets 503 (default 256 MiB, at least --max-request-body-bytes)")
      ->check(CLI::PositiveNumber)
      ->envname("DSV4_MAX_BUFFERED_BODY_BYTES");
  cmd->add_option("--http-threads", o->http_threads,
                  "threads running the event-driven HTTP front end; connections cost no thread (default 2)")
      ->check(CLI::NonNegativeNumber)
      ->envname("DSV4_HTTP_THREADS");
  cmd->add_option("--max-connections", o->max_connections,
                  "open connections at most; more are answered 503 and closed (default 4096, at most the "
                  "file-descriptor limit less 64)")
      ->check(CLI::PositiveNumber)
      ->envname("DSV4_MAX_CONNECTIONS");
  cmd->add_option("--http-header-timeout", o->header_timeout,
                  "seconds a new connection has to send its request line and headers (default 10)")
      ->check(CLI::PositiveNumber)
      ->envname("DSV4_HTTP_HEADER_TIMEOUT");
  cmd->add_option("--http-body-timeout", o->body_timeout, "seconds a request body has to arrive in full (default 30)")
      ->check(CLI::PositiveNumber)
      ->envname("DSV4_HTTP_BODY_TIMEOUT");
  cmd->add_option("--timeout-keep-alive", o->keep_alive_timeout,
                  "seconds an idle keep-alive connection stays open (default 5, as vLLM's)")
      ->check(CLI::PositiveNumber)
      ->envname("DSV4_TIMEOUT_KEEP_ALIVE");
  cmd->add_option("--shutdown-timeout", o->shutdown_timeout,
                  "on SIGTERM/SIGINT: seconds requests in flight may still run before each is ended (streams with "
                  "an error event and [DONE]); a second signal exits at once (default 10)")
      ->check(CLI::NonNegativeNumber)
      ->envname("DSV4_SHUTDOWN_TIMEOUT");
  cmd->add_option("--max-logprobs", o->max_logprobs, "most logprobs / top_logprobs a request may ask for (default 20)")
      ->check(CLI::NonNegativeNumber)
      ->envname("DSV4_MAX_LOGPROBS");
  cmd->add_flag("--enable-log-requests,!--disable-log-requests", o->log_requests, "log every HTTP request (default off)")
      ->envname("DSV4_LOG_REQUESTS");
  cmd->callback([o] { run_serve(*o); });
}

}  // namespace dsv4::cli
