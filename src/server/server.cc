// The HTTP server: routes, the engine loop thread, per-request channels (server.h).
#include "server/server.h"

#include <fmt/format.h>
#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <unordered_map>

#include "common/error.h"
#include "server/connection_probe.h"
#include "server/metrics.h"
#include "server/openai_protocol.h"
#include "server/sigpipe.h"
#include "text/chat_encoding.h"
#include "text/chat_stream.h"
#include "text/text_stream.h"

namespace dsv4::server {
namespace {

using namespace std::chrono_literals;

constexpr auto kPollInterval = 20ms;  // how often a waiting handler checks its client and the server

// The outputs of one engine request, from the loop thread to the handler.
struct RequestChannel {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<RequestOutput> outputs;
  std::optional<Clock::time_point> last_token;  // loop thread only: for inter-token latency
};

// httplib::Server with two fixes. Its constructor sets SIGPIPE to ignored for the whole process:
// the saved disposition (a base constructed before httplib's) is put back (sigpipe.h). And it
// keeps its listening socket protected; a wider backlog than its compiled-in 5 keeps bursts of
// connections from waiting for SYN retransmits. listen() on a listening socket just updates the
// backlog.
class HttpServer : private SavedSigpipeDisposition, public httplib::Server {
 public:
  HttpServer() { restore(); }

  void widen_backlog(int backlog) {
    const auto sock = svr_sock_.load();
    if (sock != INVALID_SOCKET) ::listen(sock, backlog);
  }
};

void log_line(const std::string& text) { fmt::print(stderr, "dsv4 serve: {}\n", text); }

double seconds_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

std::int64_t unix_time() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void send_error(httplib::Response& res, const ApiError& error) {
  res.status = error.status;
  res.set_content(json_text(error_json(error)), "application/json");
}

void send_json(httplib::Response& res, const Json& value) {
  res.status = 200;
  res.set_content(json_text(value), "application/json");
}

bool constant_time_equal(std::string_view a, std::string_view b) {
  unsigned diff = a.size() == b.size() ? 0u : 1u;
  for (std::size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned>(a[i] ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

}  // namespace

struct Server::Impl {
  ServerOptions options;
  std::function<LoadedModel()> load;
  HttpServer http;
  ServerMetrics metrics;
  std::string id_prefix;

  std::atomic<bool> ready{false};
  std::atomic<bool> stopping{false};
  std::atomic<bool> listening_done{false};
  LoadedModel model;  // written by the loader before `ready`
  ProtocolLimits limits;
  std::string load_error;
  std::mutex state_mu;  // load_error, stop_cv
  std::condition_variable stop_cv;

  std::mutex channels_mu;
  std::unordered_map<RequestId, std::shared_ptr<RequestChannel>> channels;
  std::atomic<std::uint64_t> next_request{0};
  std::atomic<bool> loop_running{false};

  Impl(ServerOptions o, std::function<LoadedModel()> l)
      : options(std::move(o)), load(std::move(l)), metrics(served_name()) {
    std::random_device rd;
    id_prefix = fmt::format("{:08x}", rd());
  }

  const std::string& served_name() const {
    static const std::string fallback = "dsv4";
    return options.served_model_names.empty() ? fallback : options.served_model_names.front();
  }

  // --- the loop thread ---
  void loop_main() {
    Engine& engine = *model.engine;
    while (loop_running.load()) {
      if (!engine.wait_for_work(50ms)) continue;
      std::vector<RequestOutput> outputs;
      try {
        outputs = engine.step();
      } catch (const std::exception& e) {
        // The engine reports request failures as outputs; an exception here is a bug. Fail the
        // requests in flight (their clients get an error, not a hang) and keep serving.
        log_line(fmt::format("engine step failed: {}", e.what()));
        fail_all(fmt::format("engine step failed: {}", e.what()));
        std::this_thread::sleep_for(10ms);
        continue;
      }
      deliver(outputs);
    }
  }

  void fail_all(const std::string& error) {
    std::vector<RequestOutput> outputs;
    {
      std::lock_guard lock(channels_mu);
      for (const auto& [id, channel] : channels) {
        RequestOutput o;
        o.id = id;
        o.finished = true;
        o.finish_reason = FinishReason::kError;
        o.error = error;
        o.times.arrival = Clock::now();
        outputs.push_back(std::move(o));
      }
    }
    deliver(outputs);
    for (const RequestOutput& o : outputs) model.engine->abort(o.id);
  }

  void deliver(std::vector<RequestOutput>& outputs) {
    std::lock_guard lock(channels_mu);
    for (RequestOutput& o : outputs) {
      auto it = channels.find(o.id);
      if (it == channels.end()) continue;
      std::shared_ptr<RequestChannel> channel = it->second;
      if (!o.new_tokens.empty() && o.times.last_token) {
        if (o.num_output_tokens == static_cast<std::int64_t>(o.new_tokens.size())) {
          metrics.observe_time_to_first_token(seconds_between(o.times.arrival, *o.times.first_token));
        } else if (channel->last_token) {
          metrics.observe_inter_token_latency(seconds_between(*channel->last_token, *o.times.last_token));
        }
        channel->last_token = o.times.last_token;
      }
      if (o.finished) {
        metrics.observe_request(o.finish_reason, o.times, o.times.finished.value_or(Clock::now()));
        channels.erase(it);
      }
      {
        std::lock_guard channel_lock(channel->mu);
        channel->outputs.push_back(std::move(o));
      }
      channel->cv.notify_all();
    }
  }

  // --- handlers ---
  void require_ready() const {
    if (!ready.load(std::memory_order_acquire)) {
      throw_api_error(503, stopping ? "The server is shutting down." : "The model is still loading; retry shortly.", {},
                      "model_not_ready");
    }
    if (stopping) throw_api_error(503, "The server is shutting down.", {}, "server_shutting_down");
  }

  bool serves(const std::string& name) const {
    for (const std::string& n : options.served_model_names) {
      if (n == name) return true;
    }
    return options.served_model_names.empty() && name == served_name();
  }

  std::vector<std::int32_t> tokenize(const ApiRequest& r) const {
    try {
      if (r.endpoint == Endpoint::kChat) {
        ChatOptions chat;
        chat.thinking = r.thinking;
        chat.add_generation_prompt = r.add_generation_prompt;
        chat.continue_final_message = r.continue_final_message;
        return model.codec->encode_chat(render_chat_prompt(r.messages, r.tools, chat));
      }
      if (r.prompt_text) return model.codec->encode_prompt(*r.prompt_text);
      return r.prompt_tokens;
    } catch (const Error& e) {
      throw_api_error(400, e.what(), r.endpoint == Endpoint::kChat ? "messages" : "prompt", "invalid_value");
    }
  }

  void handle_generate(const httplib::Request& req, httplib::Response& res, Endpoint endpoint);
  void handle_models(httplib::Response& res) const {
    require_ready();
    Json data = Json::array();
    std::vector<std::string> names = options.served_model_names;
    if (names.empty()) names.push_back(served_name());
    const std::int64_t created = unix_time();
    for (const std::string& name : names) {
      data.push_back({{"id", name},
                      {"object", "model"},
                      {"created", created},
                      {"owned_by", "dsv4"},
                      {"root", model.model_path},
                      {"parent", nullptr},
                      {"max_model_len", model.engine->max_model_len()},
                      {"permission", Json::array()}});
    }
    send_json(res, Json{{"object", "list"}, {"data", std::move(data)}});
  }

  void setup_routes();
  void request_stop() {
    stopping = true;
    stop_cv.notify_all();
  }
};

namespace {

// One generation request from parsing to its last byte. Used by exactly one handler thread
// (the content provider and its releaser run on the handler's thread).
class Job {
 public:
  Job(Server::Impl& server, ApiRequest request, std::vector<std::int32_t> prompt, ConnectionProbe probe)
      : server_(server),
        request_(std::move(request)),
        prompt_(std::move(prompt)),
        probe_(probe),
        text_(*server.model.codec, request_.stop, request_.include_stop_str_in_output, request_.skip_special_tokens),
        builder_(request_,
                 fmt::format("{}-{}{:x}", request_.endpoint == Endpoint::kChat ? "chatcmpl" : "cmpl", server.id_prefix,
                             server.next_request.fetch_add(1)),
                 request_.model.empty() ? server.served_name() : request_.model, unix_time(), *server.model.codec),
        channel_(std::make_shared<RequestChannel>()) {
    usage_.prompt_tokens = static_cast<std::int64_t>(prompt_.size());
    if (request_.endpoint == Endpoint::kChat) chat_.emplace(request_.thinking, !request_.tools.is_null());
  }

  // Queues the request with the engine; Error (bad sampling values) becomes a 400.
  void submit() {
    std::lock_guard lock(server_.channels_mu);
    try {
      id_ = server_.model.engine->add_request(prompt_, request_.sampling);
    } catch (const Error& e) {
      throw_api_error(400, e.what(), {}, "invalid_value");
    }
    server_.channels.emplace(id_, channel_);
  }

  // Non-streaming: waits for the end and answers with the whole response.
  void respond(httplib::Response& res) {
    ResponseBuilder::Piece whole;
    while (!finished_) {
      if (client_gone() || server_.stopping) {
        cancel();
        send_error(res, {503, "The request was cancelled.", {}, {}, "request_cancelled"});
        return;
      }
      for (RequestOutput& o : wait_outputs()) {
        ResponseBuilder::Piece piece = absorb(o);
        whole.text += piece.text;
        whole.tokens.insert(whole.tokens.end(), piece.tokens.begin(), piece.tokens.end());
        whole.logprobs.insert(whole.logprobs.end(), piece.logprobs.begin(), piece.logprobs.end());
        whole.finish_reason = piece.finish_reason;
        whole.stop_reason = piece.stop_reason;
        if (finished_) break;
      }
    }
    if (error_) {
      send_error(res, *error_);
      return;
    }
    send_json(res, builder_.response(whole, usage_, prompt_));
  }

  // Streaming: called by httplib until it returns false (cancel) or the sink is done.
  bool provide(httplib::DataSink& sink) {
    if (!started_) {
      started_ = true;
      if (request_.endpoint == Endpoint::kChat && !write(sink, sse_event(builder_.role_chunk()))) return false;
    }
    if (client_gone() || server_.stopping) {
      cancel();
      return false;
    }
    for (RequestOutput& o : wait_outputs()) {
      ResponseBuilder::Piece piece = absorb(o);
      if (chat_) split_chat(piece);
      if (error_) {
        // Headers are out already: report the error in the stream, as vLLM does.
        if (!write(sink, sse_event(error_json(*error_)))) return false;
        break;
      }
      const bool wanted = !piece.text.empty() || !piece.reasoning.empty() || !piece.tool_calls.empty() || piece.finish_reason ||
                          ((request_.return_token_ids || request_.logprobs) && !piece.tokens.empty());
      if (wanted) {
        std::optional<Usage> usage;
        if (request_.continuous_usage) usage = usage_;
        if (!write(sink, sse_event(builder_.chunk(piece, usage)))) return false;
      }
      if (finished_) break;
    }
    if (finished_) {
      if (request_.include_usage && !error_ && !write(sink, sse_event(builder_.usage_chunk(usage_)))) return false;
      if (!write(sink, std::string(kSseDone))) return false;
      sink.done();
    }
    return true;
  }

  // The response is gone (sent, failed or cancelled): make sure the engine lets go too.
  void release() {
    if (!engine_finished_) cancel();
  }

 private:
  bool write(httplib::DataSink& sink, const std::string& data) {
    if (sink.write(data.data(), data.size())) return true;
    cancel();
    return false;
  }

  bool client_gone() const { return probe_.closed(); }

  // Streaming chat: the raw text of `piece` becomes reasoning / content / tool-call deltas.
  void split_chat(ResponseBuilder::Piece& piece) {
    ChatStream::Delta delta = chat_->push(piece.text);
    if (finished_) {
      ChatStream::Delta last = chat_->finish();
      delta.reasoning += last.reasoning;
      delta.content += last.content;
      delta.tool_calls = std::move(last.tool_calls);
    }
    piece.text = std::move(delta.content);
    piece.reasoning = std::move(delta.reasoning);
    piece.tool_calls = std::move(delta.tool_calls);
  }

  void cancel() {
    if (!abort_sent_ && !engine_finished_) {
      abort_sent_ = true;
      server_.model.engine->abort(id_);
    }
  }

  std::vector<RequestOutput> wait_outputs() {
    std::vector<RequestOutput> out;
    std::unique_lock lock(channel_->mu);
    channel_->cv.wait_for(lock, kPollInterval, [&] { return !channel_->outputs.empty(); });
    while (!channel_->outputs.empty()) {
      out.push_back(std::move(channel_->outputs.front()));
      channel_->outputs.pop_front();
    }
    return out;
  }

  // Turns one engine output into text for the client; decides when the request is finished
  // from the client's point of view (a stop string ends it before the engine knows).
  ResponseBuilder::Piece absorb(const RequestOutput& o) {
    ResponseBuilder::Piece piece;
    if (o.finished) engine_finished_ = true;
    if (finished_) return piece;
    usage_.cached_tokens = o.num_cached_tokens;
    for (std::size_t i = 0; i < o.new_tokens.size() && !text_.stopped(); ++i) {
      piece.text += text_.push(o.new_tokens[i]);
      piece.tokens.push_back(o.new_tokens[i]);
      if (request_.logprobs && i < o.new_logprobs.size()) piece.logprobs.push_back(o.new_logprobs[i]);
      ++usage_.completion_tokens;
    }
    if (text_.stopped()) {
      finished_ = true;
      piece.finish_reason = "stop";
      piece.stop_reason = text_.stop_string();
      cancel();  // the engine does not know about stop strings
      return piece;
    }
    if (!o.finished) return piece;
    finished_ = true;
    piece.text += text_.finish();
    if (o.finish_reason == FinishReason::kError) {
      const bool capacity = o.error.find("cannot hold") != std::string::npos;
      error_ = ApiError{capacity ? 400 : 500, o.error, {}, {}, capacity ? "context_length_exceeded" : "engine_error"};
    }
    piece.finish_reason = finish_reason_text(o.finish_reason);
    return piece;
  }

  Server::Impl& server_;
  ApiRequest request_;
  std::vector<std::int32_t> prompt_;
  ConnectionProbe probe_;
  TextStream text_;
  std::optional<ChatStream> chat_;  // chat endpoint: splits streamed text
  ResponseBuilder builder_;
  std::shared_ptr<RequestChannel> channel_;
  RequestId id_ = -1;
  Usage usage_;
  bool started_ = false;
  bool finished_ = false;         // the client's view: nothing more to send
  bool engine_finished_ = false;  // the engine reported the finish
  bool abort_sent_ = false;
  std::optional<ApiError> error_;
};

}  // namespace

void Server::Impl::handle_generate(const httplib::Request& req, httplib::Response& res, Endpoint endpoint) {
  try {
    require_ready();
    ApiRequest api = parse_api_request(req.body, endpoint, limits);
    if (!api.model.empty() && !serves(api.model)) {
      throw_api_error(404, fmt::format("The model `{}` does not exist.", api.model), "model", "model_not_found");
    }
    std::vector<std::int32_t> prompt = tokenize(api);
    check_context_length(api, static_cast<std::int64_t>(prompt.size()), model.engine->max_model_len());
    const bool stream = api.stream;
    auto job = std::make_shared<Job>(*this, std::move(api), std::move(prompt),
                                     ConnectionProbe(req.remote_addr, req.remote_port, req.local_port));
    job->submit();
    if (!stream) {
      job->respond(res);
      return;
    }
    res.status = 200;
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream", [job](std::size_t, httplib::DataSink& sink) { return job->provide(sink); },
        [job](bool) { job->release(); });
  } catch (const ApiException& e) {
    send_error(res, e.error());
  } catch (const Error& e) {
    send_error(res, {400, e.what(), {}, {}, "invalid_value"});
  } catch (const std::exception& e) {
    send_error(res, {500, fmt::format("Internal error: {}", e.what()), {}, {}, "internal_error"});
  }
}

void Server::Impl::setup_routes() {
  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (options.api_key.empty() || req.path.rfind("/v1/", 0) != 0) return httplib::Server::HandlerResponse::Unhandled;
    const std::string auth = req.get_header_value("Authorization");
    const std::string expected = "Bearer " + options.api_key;
    if (constant_time_equal(auth, expected)) return httplib::Server::HandlerResponse::Unhandled;
    send_error(res, {401, auth.empty() ? "Missing API key: send 'Authorization: Bearer <key>'."
                                       : "Incorrect API key provided.",
                     {}, {}, "invalid_api_key"});
    return httplib::Server::HandlerResponse::Handled;
  });
  http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    handle_generate(req, res, Endpoint::kCompletions);
  });
  http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    handle_generate(req, res, Endpoint::kChat);
  });
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    try {
      handle_models(res);
    } catch (const ApiException& e) {
      send_error(res, e.error());
    }
  });
  http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (ready && !stopping) {
      res.status = 200;
      return;
    }
    send_error(res, {503, stopping ? "The server is shutting down." : "The model is loading.", {}, {}, "model_not_ready"});
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    const EngineStats stats = ready ? model.engine->stats() : EngineStats{};
    res.set_content(metrics.render(stats), "text/plain; version=0.0.4; charset=utf-8");
  });
  http.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    ApiError error{res.status, {}, {}, {}, {}};
    switch (res.status) {
      case 404:
        error.message = fmt::format("Not found: {} {}", req.method, req.path);
        error.code = "not_found";
        break;
      case 413:
        error.message = fmt::format("The request body is larger than the limit of {} bytes.", options.max_body_bytes);
        error.code = "request_too_large";
        break;
      case 400:
        error.message = "Malformed HTTP request.";
        break;
      default:
        error.message = fmt::format("HTTP error {}.", res.status);
        break;
    }
    const int status = res.status;
    send_error(res, error);
    res.status = status;
    return httplib::Server::HandlerResponse::Handled;
  }));
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(res, {500, fmt::format("Internal error: {}", what), {}, {}, "internal_error"});
  });
  if (options.log_requests) {
    http.set_logger([](const httplib::Request& req, const httplib::Response& res) {
      log_line(fmt::format("{} {} {} -> {}", req.remote_addr, req.method, req.path, res.status));
    });
  }
}

Server::Server(ServerOptions options, std::function<LoadedModel()> load)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(load))) {}

Server::~Server() { stop(); }

void Server::stop() { impl_->request_stop(); }

void Server::run(const std::function<void(int port)>& on_bound) {
  Impl& s = *impl_;
  const int threads = s.options.http_threads > 0 ? s.options.http_threads : 64;
  // The handler threads write to the clients' sockets: a client that hangs up must not end the
  // process, and the process's SIGPIPE disposition is not ours to change (sigpipe.h).
  s.http.new_task_queue = [threads] {
    return with_sigpipe_blocked([threads] { return new httplib::ThreadPool(static_cast<std::size_t>(threads)); });
  };
  s.http.set_payload_max_length(s.options.max_body_bytes);
  s.http.set_keep_alive_max_count(100000);
  s.http.set_keep_alive_timeout(5);
  s.http.set_read_timeout(30);
  s.http.set_write_timeout(10);
  s.http.set_tcp_nodelay(true);
  // httplib's default also sets SO_REUSEPORT, which would let a second server bind the same
  // port and silently share its connections; a busy port must be an error instead.
  s.http.set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  s.setup_routes();

  int port = s.options.port;
  if (port == 0) {
    port = s.http.bind_to_any_port(s.options.host);
    if (port <= 0) fail("cannot bind {}: no free port", s.options.host);
  } else if (!s.http.bind_to_port(s.options.host, port)) {
    fail("cannot bind {}:{} (in use, or not an address of this machine)", s.options.host, port);
  }
  s.http.widen_backlog(1024);
  if (on_bound) on_bound(port);

  std::thread loop;
  std::thread loader([&s, &loop] {
    try {
      const auto start = Clock::now();
      LoadedModel loaded = s.load();
      if (!loaded.engine || !loaded.codec) fail("the model loader returned no engine or no tokenizer");
      s.model = std::move(loaded);
      s.limits.vocab_size = s.model.engine->model_config().vocab_size;
      s.limits.max_logprobs = std::min(s.options.max_logprobs, s.limits.vocab_size);
      s.loop_running = true;
      loop = std::thread([&s] { s.loop_main(); });
      s.ready.store(true, std::memory_order_release);
      log_line(fmt::format("model loaded in {:.1f} s (tokenizer: {}, max_model_len {}); ready",
                           seconds_between(start, Clock::now()), s.model.codec->kind(), s.model.engine->max_model_len()));
    } catch (const std::exception& e) {
      {
        std::lock_guard lock(s.state_mu);
        s.load_error = e.what();
      }
      log_line(fmt::format("loading the model failed: {}", e.what()));
      s.request_stop();
    }
  });
  // Stops httplib once stop() was asked for; retries because a stop() that lands before
  // listen_after_bind() started would otherwise be lost.
  std::thread supervisor([&s] {
    std::unique_lock lock(s.state_mu);
    while (!s.listening_done) {
      if (s.stopping) {
        lock.unlock();
        s.http.stop();
        std::this_thread::sleep_for(10ms);
        lock.lock();
      } else {
        s.stop_cv.wait_for(lock, 100ms);
      }
    }
  });

  s.http.listen_after_bind();
  {
    std::lock_guard lock(s.state_mu);
    s.listening_done = true;
    s.stopping = true;
  }
  s.stop_cv.notify_all();
  supervisor.join();
  loader.join();
  s.loop_running = false;
  if (loop.joinable()) loop.join();
  std::lock_guard lock(s.state_mu);
  if (!s.load_error.empty()) fail("{}", s.load_error);
}

}  // namespace dsv4::server
