// The HTTP server: connections on Boost.Beast over Boost.Asio, routes, the engine loop thread,
// per-request channels (server.h).
#include "server/server.h"

#include <fmt/format.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
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
#include "server/byte_budget.h"
#include "server/connection_probe.h"
#include "server/http_wire.h"
#include "server/metrics.h"
#include "server/openai_protocol.h"
#include "server/sigpipe.h"
#include "text/chat_encoding.h"
#include "text/chat_stream.h"
#include "text/text_stream.h"

namespace dsv4::server {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using namespace std::chrono_literals;

constexpr auto kProbeInterval = 50ms;  // how often a connection with a request in flight checks its client
constexpr auto kLingerTime = 1s;       // a refused connection is drained this long before it closes
constexpr auto kFinalFlush = 2s;       // after the shutdown grace: time to write the last bytes

// The outputs of one engine request, from the loop thread to its connection.
struct RequestChannel {
  std::mutex mu;
  std::deque<RequestOutput> outputs;
  std::optional<Clock::time_point> last_token;  // loop thread only: for inter-token latency
  std::atomic<bool> wake_pending{false};
  std::function<void()> wake;  // posts the connection's reader of `outputs` (set before the request is submitted)
};

void log_line(const std::string& text) { fmt::print(stderr, "dsv4 serve: {}\n", text); }

double seconds_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

std::chrono::steady_clock::duration seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(std::max(s, 0.0)));
}

std::int64_t unix_time() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

const char* kJson = "application/json";

// The most file descriptors this process may open: the soft limit raised to the hard one.
std::size_t raise_fd_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return 1024;
  if (limit.rlim_cur < limit.rlim_max) {
    rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
  }
  return static_cast<std::size_t>(limit.rlim_cur);
}

class Session;

}  // namespace

struct Server::Impl {
  ServerOptions options;
  std::function<LoadedModel()> load;
  ServerMetrics metrics;
  std::string id_prefix;

  std::atomic<bool> ready{false};
  std::atomic<bool> stopping{false};
  LoadedModel model;  // written by the loader before `ready`
  ProtocolLimits limits;
  std::size_t max_token_bytes = 1;  // the longest token's text, for refusing prompts by their bytes
  std::string load_error;
  std::mutex state_mu;  // load_error

  std::mutex channels_mu;
  std::unordered_map<RequestId, std::shared_ptr<RequestChannel>> channels;
  std::atomic<std::uint64_t> next_request{0};
  std::atomic<bool> loop_running{false};

  // Connections: counted for the cap, listed for shutdown.
  std::mutex sessions_mu;
  std::unordered_map<std::uint64_t, std::weak_ptr<Session>> sessions;
  std::uint64_t next_session = 0;
  std::size_t max_connections = 4096;
  std::atomic<int> pending_prepares{0};
  ByteBudget body_budget;  // the request bodies held at once (being read, waiting for or in parsing)
  std::atomic<int> lingering{0};  // refused connections being drained

  // Declared last: destroyed first, with the handlers they still hold.
  std::optional<asio::thread_pool> prepare_pool;
  std::optional<asio::io_context> ioc;
  std::optional<asio::strand<asio::io_context::executor_type>> accept_strand;
  std::optional<tcp::acceptor> acceptor;
  std::optional<asio::steady_timer> shutdown_timer;
  bool shutdown_started = false;  // on accept_strand
  bool grace_over = false;        // on accept_strand

  Impl(ServerOptions o, std::function<LoadedModel()> l)
      : options(std::move(o)),
        load(std::move(l)),
        metrics(served_name()),
        body_budget(std::max(options.max_buffered_body_bytes, options.max_body_bytes)) {
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

  // Queues each output for its connection and wakes the connection; never waits on a socket.
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
      if (!channel->wake_pending.exchange(true) && channel->wake) channel->wake();
    }
  }

  // --- requests ---
  bool serves(const std::string& name) const {
    for (const std::string& n : options.served_model_names) {
      if (n == name) return true;
    }
    return options.served_model_names.empty() && name == served_name();
  }

  // The prompt's token ids. A text prompt that cannot fit max_model_len is refused by its byte
  // length before it is tokenized: no token covers more than max_token_bytes bytes of text (the
  // tokenizer has no normalizer, so the tokens' bytes are the text's bytes), so B bytes are at
  // least ceil(B / max_token_bytes) tokens; BOS or template tokens only add to that.
  std::vector<std::int32_t> tokenize(const ApiRequest& r) const {
    const char* param = r.endpoint == Endpoint::kChat ? "messages" : "prompt";
    try {
      std::string chat_text;
      std::string_view text;
      if (r.endpoint == Endpoint::kChat) {
        chat_text = render_chat_prompt(r.messages, r.tools, chat_options(r));
        text = chat_text;
      } else if (r.prompt_text) {
        text = *r.prompt_text;
      } else {
        return r.prompt_tokens;
      }
      const std::int64_t max_len = model.engine->max_model_len();
      const auto at_least = static_cast<std::int64_t>((text.size() + max_token_bytes - 1) / max_token_bytes);
      if (at_least >= max_len) {
        throw_api_error(400,
                        fmt::format("This model's maximum context length is {} tokens. However, your prompt is {} "
                                    "bytes, so at least {} tokens (no token is longer than {} bytes), which leaves no "
                                    "room for output. Please reduce the length of the input.",
                                    max_len, text.size(), at_least, max_token_bytes),
                        param, "context_length_exceeded");
      }
      return r.endpoint == Endpoint::kChat ? model.codec->encode_chat(text) : model.codec->encode_prompt(text);
    } catch (const Error& e) {
      throw_api_error(400, e.what(), param, "invalid_value");
    }
  }

  Json models_json() const {
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
    return Json{{"object", "list"}, {"data", std::move(data)}};
  }

  ApiError not_ready_error() const {
    if (stopping) return {503, "The server is shutting down.", {}, {}, "server_shutting_down"};
    return {503, "The model is still loading; retry shortly.", {}, {}, "model_not_ready"};
  }

  // --- connections ---
  void start_accept();
  void on_accept(const boost::system::error_code& ec, tcp::socket socket);
  void refuse_connection(tcp::socket socket);
  void begin_shutdown();
  void end_grace();
  void check_drained();
  std::vector<std::shared_ptr<Session>> live_sessions() {
    std::vector<std::shared_ptr<Session>> out;
    std::lock_guard lock(sessions_mu);
    for (auto& [id, weak] : sessions) {
      if (auto s = weak.lock()) out.push_back(std::move(s));
    }
    return out;
  }
  std::size_t session_count() {
    std::lock_guard lock(sessions_mu);
    return sessions.size();
  }
};

namespace {

// One generation request from its parsed body to its last byte. Created on a prepare thread,
// then used only on its connection's strand.
class Job {
 public:
  Job(Server::Impl& server, ApiRequest request, std::vector<std::int32_t> prompt)
      : server_(server),
        request_(std::move(request)),
        prompt_(std::move(prompt)),
        text_(*server.model.codec, request_.stop, request_.include_stop_str_in_output, request_.skip_special_tokens),
        builder_(request_,
                 fmt::format("{}-{}{:x}", request_.endpoint == Endpoint::kChat ? "chatcmpl" : "cmpl", server.id_prefix,
                             server.next_request.fetch_add(1)),
                 request_.model.empty() ? server.served_name() : request_.model, unix_time(), *server.model.codec),
        channel_(std::make_shared<RequestChannel>()) {
    usage_.prompt_tokens = static_cast<std::int64_t>(prompt_.size());
    if (request_.endpoint == Endpoint::kChat) chat_.emplace(request_.thinking, !request_.tools.is_null());
  }
  ~Job() { release(); }
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  // Queues the request with the engine; Error (bad sampling values) becomes a 400. `wake` is
  // called (from the loop thread) when outputs are waiting.
  void submit(std::function<void()> wake) {
    channel_->wake = std::move(wake);
    std::lock_guard lock(server_.channels_mu);
    try {
      id_ = server_.model.engine->add_request(prompt_, request_.sampling);
    } catch (const Error& e) {
      throw_api_error(400, e.what(), {}, "invalid_value");
    }
    submitted_ = true;
    server_.channels.emplace(id_, channel_);
  }

  bool streaming() const { return request_.stream; }
  bool finished() const { return finished_; }

  // Streaming: the first events (chat: the role chunk).
  std::string stream_start() {
    return request_.endpoint == Endpoint::kChat ? sse_event(builder_.role_chunk()) : std::string();
  }

  // The outputs waiting in the channel. Streaming: their SSE events (and, at the end, the
  // usage chunk and [DONE]). Non-streaming: collected; once finished, `response` is set.
  std::string take_outputs(std::optional<std::pair<int, std::string>>& response) {
    std::string events;
    for (RequestOutput& o : drain()) {
      ResponseBuilder::Piece piece = absorb(o);
      if (!request_.stream) {
        whole_.text += piece.text;
        whole_.tokens.insert(whole_.tokens.end(), piece.tokens.begin(), piece.tokens.end());
        whole_.logprobs.insert(whole_.logprobs.end(), piece.logprobs.begin(), piece.logprobs.end());
        whole_.finish_reason = piece.finish_reason;
        whole_.stop_reason = piece.stop_reason;
      } else {
        if (chat_) split_chat(piece);
        if (error_) {
          // Headers are out already: report the error in the stream, as vLLM does.
          events += sse_event(error_json(*error_));
        } else {
          const bool wanted = !piece.text.empty() || !piece.reasoning.empty() || !piece.tool_calls.empty() ||
                              piece.finish_reason ||
                              ((request_.return_token_ids || request_.logprobs) && !piece.tokens.empty());
          if (wanted) {
            std::optional<Usage> usage;
            if (request_.continuous_usage) usage = usage_;
            events += sse_event(builder_.chunk(piece, usage));
          }
        }
      }
      if (finished_) break;
    }
    if (!finished_) return events;
    if (!request_.stream) {
      if (error_) {
        response.emplace(error_->status, json_text(error_json(*error_)));
      } else {
        response.emplace(200, json_text(builder_.response(whole_, usage_, prompt_)));
      }
      return events;
    }
    if (request_.include_usage && !error_) events += sse_event(builder_.usage_chunk(usage_));
    events += kSseDone;
    return events;
  }

  // Ends the request now (shutdown): the engine lets go; a stream gets an error event and [DONE].
  std::string end_with(const ApiError& error) {
    cancel();
    finished_ = true;
    return sse_event(error_json(error)) + std::string(kSseDone);
  }

  // The response is gone (sent, failed or cancelled): make sure the engine lets go too.
  void release() {
    if (submitted_ && !engine_finished_) cancel();
  }

 private:
  std::vector<RequestOutput> drain() {
    channel_->wake_pending = false;
    std::vector<RequestOutput> out;
    std::lock_guard lock(channel_->mu);
    while (!channel_->outputs.empty()) {
      out.push_back(std::move(channel_->outputs.front()));
      channel_->outputs.pop_front();
    }
    return out;
  }

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
    if (submitted_ && !abort_sent_ && !engine_finished_) {
      abort_sent_ = true;
      server_.model.engine->abort(id_);
    }
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
      const bool too_long =
          o.error_kind == RequestErrorKind::kCacheCapacity || o.error_kind == RequestErrorKind::kContextLength;
      error_ = ApiError{too_long ? 400 : 500, o.error, {}, {}, too_long ? "context_length_exceeded" : "engine_error"};
    }
    piece.finish_reason = finish_reason_text(o.finish_reason);
    return piece;
  }

  Server::Impl& server_;
  ApiRequest request_;
  std::vector<std::int32_t> prompt_;
  TextStream text_;
  std::optional<ChatStream> chat_;  // chat endpoint: splits streamed text
  ResponseBuilder builder_;
  std::shared_ptr<RequestChannel> channel_;
  ResponseBuilder::Piece whole_;  // non-streaming: everything so far
  RequestId id_ = -1;
  Usage usage_;
  bool submitted_ = false;
  bool finished_ = false;         // the client's view: nothing more to send
  bool engine_finished_ = false;  // the engine reported the finish
  bool abort_sent_ = false;
  std::optional<ApiError> error_;
};

// One client connection. Every member is used on the connection's strand only.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(Server::Impl& server, tcp::socket socket)
      : server_(server),
        stream_(std::move(socket)),
        strand_(stream_.get_executor()),
        buffer_(server.options.max_header_bytes + (64u << 10)),
        probe_timer_(strand_),
        deadline_(strand_) {
    boost::system::error_code ec;
    const auto peer = stream_.socket().remote_endpoint(ec);
    if (!ec) peer_ = fmt::format("{}:{}", peer.address().to_string(), peer.port());
    stream_.socket().set_option(tcp::no_delay(true), ec);
  }

  ~Session() {
    std::lock_guard lock(server_.sessions_mu);
    server_.sessions.erase(id_);
  }

  void start(std::uint64_t id) {
    id_ = id;
    asio::dispatch(strand_, [self = shared_from_this()] { self->read_head(); });
  }

  // stop(): a connection without a request in flight closes now; one with a request finishes
  // it (within the grace) and then closes.
  void on_shutdown() {
    asio::dispatch(strand_, [self = shared_from_this()] {
      if (self->state_ == State::kReading) self->close();
    });
  }

  // The grace is over: a request still in flight ends now.
  void on_grace_over() {
    asio::dispatch(strand_, [self = shared_from_this()] { self->end_now(); });
  }

 private:
  enum class State { kReading, kPreparing, kRunning, kWriting, kClosed };

  // --- reading a request ---
  void read_head() {
    if (server_.stopping) return close();
    state_ = State::kReading;
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(std::min<std::size_t>(server_.options.max_header_bytes, UINT32_MAX)));
    parser_->body_limit(server_.options.max_body_bytes);
    const double timeout = requests_ == 0 ? server_.options.header_timeout_s
                                          : std::min(server_.options.keep_alive_timeout_s, server_.options.header_timeout_s);
    arm_deadline(seconds(timeout));
    http::async_read_header(stream_, buffer_, *parser_,
                            asio::bind_executor(strand_, [self = shared_from_this()](beast::error_code ec, std::size_t) {
                              self->on_head(ec);
                            }));
  }

  // The deadline of the read or write about to start: when it passes, the operation is
  // cancelled and completes with timed_out_ set (the socket stays open, so a late request can
  // still be answered 408).
  void arm_deadline(std::chrono::steady_clock::duration d) {
    timed_out_ = false;
    deadline_.expires_after(d);
    deadline_.async_wait(asio::bind_executor(strand_, [self = shared_from_this(), gen = ++deadline_gen_](beast::error_code ec) {
      if (ec || gen != self->deadline_gen_ || self->state_ == State::kClosed) return;
      self->timed_out_ = true;
      beast::error_code ignored;
      self->stream_.socket().cancel(ignored);
    }));
  }
  void disarm_deadline() {
    ++deadline_gen_;
    deadline_.cancel();
  }

  void on_head(beast::error_code ec) {
    if (state_ == State::kClosed) return;
    if (ec) return on_read_error(ec, /*in_body=*/false);
    disarm_deadline();
    ++requests_;
    const auto& req = parser_->get();
    method_ = std::string(req.method_string());
    target_ = std::string(req.target());
    head_only_ = req.method() == http::verb::head;
    keep_alive_ = req.keep_alive();
    http11_ = req.version() >= 11;
    std::size_t fields = 0;
    for (auto it = req.begin(); it != req.end(); ++it) ++fields;
    const bool has_body = parser_->chunked() || parser_->content_length().value_or(0) > 0;
    if (fields > server_.options.max_header_fields) {
      return refuse({431, fmt::format("The request has {} header fields; the limit is {}.", fields,
                                      server_.options.max_header_fields),
                     {}, {}, "request_header_fields_too_large"});
    }
    route_ = route_of(target_);
    // Authentication first on /v1/ (as before routing), so unknown /v1/ paths say 401 too.
    if (!server_.options.api_key.empty() && target_.rfind("/v1/", 0) == 0) {
      const auto auth = req[http::field::authorization];
      if (!constant_time_equal(std::string_view(auth.data(), auth.size()), "Bearer " + server_.options.api_key)) {
        return refuse({401, auth.empty() ? "Missing API key: send 'Authorization: Bearer <key>'."
                                         : "Incorrect API key provided.",
                       {}, {}, "invalid_api_key"}, has_body);
      }
    }
    if (route_ == Route::kNone) {
      return refuse({404, fmt::format("Not found: {} {}", method_, target_.substr(0, 200)), {}, {}, "not_found"},
                    has_body);
    }
    if (!method_allowed(route_, method_)) {
      return refuse({405, fmt::format("Method {} is not allowed on {}; allowed: {}.", method_, target_.substr(0, 200),
                                      allowed_methods(route_)),
                     {}, {}, "method_not_allowed"},
                    has_body, {{"Allow", std::string(allowed_methods(route_))}});
    }
    BodyFraming framing;
    framing.method = method_;
    framing.chunked = parser_->chunked();
    if (const auto length = parser_->content_length()) framing.content_length = static_cast<std::size_t>(*length);
    framing.has_transfer_encoding = req.find(http::field::transfer_encoding) != req.end();
    const auto encoding = req[http::field::content_encoding];
    framing.content_encoding = std::string_view(encoding.data(), encoding.size());
    if (auto refusal = refuse_body(framing, server_.options.max_body_bytes)) {
      // A framing the server does not follow (400) leaves the rest of the stream unreadable.
      return refuse({refusal->status, refusal->message, {}, {}, refusal->code}, has_body || refusal->status == 400);
    }
    if (parser_->is_done()) return dispatch();
    // The body's bytes (a chunked one's at the limit) come out of the server-wide allowance
    // before any is read: many connections each sending a legal body cannot add up to more.
    body_lease_ = server_.body_budget.take(framing.content_length.value_or(server_.options.max_body_bytes));
    if (!body_lease_) {
      return refuse({503, "The server is holding too many request bodies; retry shortly.", {}, {}, "server_busy"},
                    /*unread_body=*/true, {{"Retry-After", "1"}});
    }
    if (beast::iequals(req[http::field::expect], "100-continue")) {
      write_raw("HTTP/1.1 100 Continue\r\n\r\n", [](Session& s) { s.read_body(); });
      return;
    }
    read_body();
  }

  void read_body() {
    arm_deadline(seconds(server_.options.body_timeout_s));
    http::async_read(stream_, buffer_, *parser_,
                     asio::bind_executor(strand_, [self = shared_from_this()](beast::error_code ec, std::size_t) {
                       if (self->state_ == State::kClosed) return;
                       if (ec) return self->on_read_error(ec, /*in_body=*/true);
                       self->disarm_deadline();
                       self->dispatch();
                     }));
  }

  void on_read_error(beast::error_code ec, bool in_body) {
    disarm_deadline();
    if (timed_out_) ec = beast::error::timeout;
    if (ec == http::error::end_of_stream || ec == beast::error::timeout || ec == asio::error::operation_aborted ||
        ec == asio::error::connection_reset || ec == asio::error::eof || ec == asio::error::bad_descriptor) {
      // Gone, idle past its deadline, or closed by shutdown. A request cut off mid-way by its
      // deadline gets a 408 when anything of it arrived.
      // (An incomplete head stays in the buffer, unparsed.)
      if (ec == beast::error::timeout && (in_body || parser_->got_some() || buffer_.size() > 0)) {
        return refuse({408, "The request did not arrive in time.", {}, {}, "request_timeout"});
      }
      return close();
    }
    if (ec == http::error::header_limit) {
      return refuse({431, fmt::format("The request's header is larger than the limit of {} bytes.",
                                      server_.options.max_header_bytes),
                     {}, {}, "request_header_fields_too_large"});
    }
    if (ec == http::error::body_limit) {
      return refuse({413, fmt::format("The request body is larger than the limit of {} bytes.",
                                      server_.options.max_body_bytes),
                     {}, {}, "request_too_large"});
    }
    if (ec == http::error::buffer_overflow) {
      return refuse({431, "A request line, header or chunk header is too long.", {}, {}, "request_header_fields_too_large"});
    }
    refuse({400, fmt::format("Malformed HTTP request: {}.", ec.message()), {}, {}, "bad_request"});
  }

  // --- answering ---
  void dispatch() {
    // Held until the body is parsed (generation routes) or answered (the others).
    ByteBudget::Lease lease = std::move(body_lease_);
    switch (route_) {
      case Route::kHealth:
        if (server_.ready && !server_.stopping) return respond(200, "", "");
        return respond_error(server_.not_ready_error());
      case Route::kMetrics: {
        const EngineStats stats = server_.ready ? server_.model.engine->stats() : EngineStats{};
        return respond(200, "text/plain; version=0.0.4; charset=utf-8", server_.metrics.render(stats));
      }
      case Route::kModels:
        if (!server_.ready || server_.stopping) return respond_error(server_.not_ready_error());
        return respond(200, kJson, json_text(server_.models_json()));
      case Route::kCompletions:
      case Route::kChat:
        break;
      case Route::kNone:
        return respond_error({404, "Not found.", {}, {}, "not_found"});
    }
    if (!server_.ready || server_.stopping) return respond_error(server_.not_ready_error());
    // Parsing and tokenizing run on the prepare pool, a bounded number at once.
    if (server_.pending_prepares.fetch_add(1) >= server_.options.max_pending_prepares) {
      --server_.pending_prepares;
      return respond_error({503, "The server is busy; retry shortly.", {}, {}, "server_busy"}, {{"Retry-After", "1"}});
    }
    state_ = State::kPreparing;
    const Endpoint endpoint = route_ == Route::kChat ? Endpoint::kChat : Endpoint::kCompletions;
    asio::post(*server_.prepare_pool, [self = shared_from_this(), body = std::move(parser_->get().body()), endpoint,
                                       lease = std::move(lease)]() mutable {
      self->prepare(std::move(body), endpoint, std::move(lease));
    });
  }

  // On a prepare thread: the body to a submitted Job, or an error.
  void prepare(std::string body, Endpoint endpoint, ByteBudget::Lease body_lease) {
    std::shared_ptr<Job> job;
    std::optional<ApiError> error;
    try {
      ApiRequest api = parse_api_request(body, endpoint, server_.limits);
      std::string().swap(body);
      body_lease.reset();
      if (!api.model.empty() && !server_.serves(api.model)) {
        throw_api_error(404, fmt::format("The model `{}` does not exist.", api.model), "model", "model_not_found");
      }
      std::vector<std::int32_t> prompt = server_.tokenize(api);
      check_context_length(api, static_cast<std::int64_t>(prompt.size()), server_.model.engine->max_model_len());
      job = std::make_shared<Job>(server_, std::move(api), std::move(prompt));
      std::weak_ptr<Session> weak = weak_from_this();
      job->submit([weak, strand = strand_] {
        if (auto s = weak.lock()) asio::post(strand, [s] { s->on_outputs(); });
      });
    } catch (const ApiException& e) {
      error = e.error();
    } catch (const Error& e) {
      error = ApiError{400, e.what(), {}, {}, "invalid_value"};
    } catch (const std::exception& e) {
      error = ApiError{500, fmt::format("Internal error: {}", e.what()), {}, {}, "internal_error"};
    }
    --server_.pending_prepares;
    asio::post(strand_, [self = shared_from_this(), job = std::move(job), error = std::move(error)]() mutable {
      self->on_prepared(std::move(job), std::move(error));
    });
  }

  void on_prepared(std::shared_ptr<Job> job, std::optional<ApiError> error) {
    if (state_ == State::kClosed) return;  // the job's destructor aborts the request
    if (error) return respond_error(*error);
    job_ = std::move(job);
    state_ = State::kRunning;
    arm_probe();
    if (job_->streaming()) {
      stream_chunked_ = http11_;
      if (!http11_) keep_alive_ = false;
      send(render_stream_head(stream_chunked_, keep_alive_ && !server_.stopping));
      send_stream(job_->stream_start());
    }
    on_outputs();
  }

  // The engine has outputs for this connection's request.
  void on_outputs() {
    if (!job_ || state_ == State::kClosed || job_->finished()) return;
    std::optional<std::pair<int, std::string>> response;
    const std::string events = job_->take_outputs(response);
    if (job_->streaming()) {
      send_stream(events);
      if (job_->finished()) finish_stream();
    } else if (response) {
      const int status = response->first;
      job_.reset();
      respond(status, kJson, response->second);
    }
  }

  void end_now() {
    if (state_ == State::kReading) return close();
    if (!job_ || job_->finished() || state_ == State::kClosed) return;
    const ApiError error{503, "The server is shutting down; the request was cut short.", {}, {}, "server_shutting_down"};
    keep_alive_ = false;
    if (job_->streaming()) {
      send_stream(job_->end_with(error));
      finish_stream();
    } else {
      job_->end_with(error);
      job_.reset();
      respond_error(error);
    }
  }

  void finish_stream() {
    probe_timer_.cancel();
    if (stream_chunked_) send(std::string(kLastChunk));
    log(200);
    job_.reset();
    response_done_ = true;
    state_ = State::kWriting;
    if (!writing_) after_response();
  }

  // While a request runs: the client hanging up aborts it.
  void arm_probe() {
    probe_timer_.expires_after(kProbeInterval);
    probe_timer_.async_wait(asio::bind_executor(strand_, [self = shared_from_this()](beast::error_code ec) {
      if (ec || self->state_ != State::kRunning) return;
      if (ConnectionProbe(self->stream_.socket().native_handle()).closed()) return self->close();
      self->arm_probe();
    }));
  }

  void refuse(const ApiError& error, bool unread_body = true, const HeaderList& extra = {}) {
    // The rest of the request is not read: the connection cannot carry another one.
    if (unread_body) keep_alive_ = false;
    respond_error(error, extra);
  }

  void respond_error(const ApiError& error, const HeaderList& extra = {}) {
    respond(error.status, kJson, json_text(error_json(error)), extra);
  }

  void respond(int status, std::string_view content_type, std::string_view body, const HeaderList& extra = {}) {
    probe_timer_.cancel();
    if (server_.stopping) keep_alive_ = false;
    state_ = State::kWriting;
    response_done_ = true;
    log(status);
    send(render_response(status, content_type, body, keep_alive_, extra, head_only_));
  }

  void log(int status) const {
    if (server_.options.log_requests) log_line(fmt::format("{} {} {} -> {}", peer_, method_, target_.substr(0, 200), status));
  }

  // --- writing ---
  void send_stream(const std::string& events) {
    if (events.empty()) return;
    send(stream_chunked_ ? render_chunk(events) : events);
  }

  void send(std::string bytes) {
    if (state_ == State::kClosed || bytes.empty()) return;
    pending_ += bytes;
    if (!writing_) write_pending();
  }

  void write_pending() {
    writing_ = true;
    out_ = std::move(pending_);
    pending_.clear();
    arm_deadline(seconds(server_.stopping ? std::min(server_.options.write_timeout_s, 2.0)
                                          : server_.options.write_timeout_s));
    asio::async_write(stream_, asio::buffer(out_),
                      asio::bind_executor(strand_, [self = shared_from_this()](beast::error_code ec, std::size_t) {
                        self->writing_ = false;
                        if (self->state_ == State::kClosed) return;
                        if (ec) return self->close();  // the client is gone: the job's release aborts it
                        if (!self->pending_.empty()) return self->write_pending();
                        self->disarm_deadline();
                        if (self->response_done_) self->after_response();
                      }));
  }

  // A write outside the response machinery (100 Continue), then `next`.
  void write_raw(std::string bytes, void (*next)(Session&)) {
    out_ = std::move(bytes);
    writing_ = true;
    arm_deadline(seconds(server_.options.write_timeout_s));
    asio::async_write(stream_, asio::buffer(out_),
                      asio::bind_executor(strand_, [self = shared_from_this(), next](beast::error_code ec, std::size_t) {
                        self->writing_ = false;
                        if (self->state_ == State::kClosed) return;
                        if (ec) return self->close();
                        self->disarm_deadline();
                        next(*self);
                      }));
  }

  void after_response() {
    response_done_ = false;
    if (!keep_alive_ || server_.stopping) return close();
    read_head();  // the next request (pipelined bytes may already be in the buffer)
  }

  void close() {
    if (state_ == State::kClosed) return;
    state_ = State::kClosed;
    probe_timer_.cancel();
    deadline_.cancel();
    job_.reset();  // aborts a request still running
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.socket().close(ec);
  }

  Server::Impl& server_;
  beast::tcp_stream stream_;
  asio::any_io_executor strand_;  // the socket's strand (accepted on one): every handler runs on it
  beast::flat_buffer buffer_;
  asio::steady_timer probe_timer_;
  asio::steady_timer deadline_;
  std::uint64_t deadline_gen_ = 0;
  bool timed_out_ = false;
  std::optional<http::request_parser<http::string_body>> parser_;
  ByteBudget::Lease body_lease_;  // the body being read
  std::uint64_t id_ = 0;
  std::string peer_;
  State state_ = State::kReading;
  int requests_ = 0;
  std::string method_;
  std::string target_;
  Route route_ = Route::kNone;
  bool head_only_ = false;
  bool keep_alive_ = true;
  bool http11_ = true;
  bool stream_chunked_ = false;
  std::shared_ptr<Job> job_;
  std::string out_;      // being written
  std::string pending_;  // to write next
  bool writing_ = false;
  bool response_done_ = false;  // the whole response is queued: after writing it, close or read the next
};

}  // namespace

void Server::Impl::start_accept() {
  acceptor->async_accept(asio::make_strand(*ioc), asio::bind_executor(*accept_strand, [this](const boost::system::error_code& ec,
                                                                                             tcp::socket socket) {
                           on_accept(ec, std::move(socket));
                         }));
}

void Server::Impl::on_accept(const boost::system::error_code& ec, tcp::socket socket) {
  if (shutdown_started || !acceptor->is_open()) return;
  if (ec) {
    // Out of descriptors, or a connection reset before it was accepted: try again shortly
    // rather than spinning.
    auto timer = std::make_shared<asio::steady_timer>(*ioc, 50ms);
    timer->async_wait(asio::bind_executor(*accept_strand, [this, timer](const boost::system::error_code&) {
      if (!shutdown_started) start_accept();
    }));
    return;
  }
  std::shared_ptr<Session> session;
  std::uint64_t id = 0;
  {
    std::lock_guard lock(sessions_mu);
    if (sessions.size() < max_connections) {
      session = std::make_shared<Session>(*this, std::move(socket));
      id = next_session++;
      sessions.emplace(id, session);
    }
  }
  if (session) {
    session->start(id);
  } else {
    refuse_connection(std::move(socket));
  }
  start_accept();
}

// Over the connection cap: a 503 right away, then the connection is drained briefly (so the
// client reads the answer rather than a reset) and closed. Never queued.
void Server::Impl::refuse_connection(tcp::socket socket) {
  static const std::string response = render_response(
      503, kJson,
      json_text(error_json({503, "Too many connections; retry shortly.", {}, {}, "too_many_connections"})), false,
      {{"Retry-After", "1"}});
  boost::system::error_code ec;
  socket.non_blocking(true, ec);
  (void)::send(socket.native_handle(), response.data(), response.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  socket.shutdown(tcp::socket::shutdown_send, ec);
  if (lingering.load() >= static_cast<int>(max_connections)) return;  // closes now
  ++lingering;
  struct Linger {
    tcp::socket socket;
    asio::steady_timer timer;
    char sink[4096];
  };
  asio::steady_timer timer(socket.get_executor(), kLingerTime);  // the socket's strand, like its reads
  auto linger = std::make_shared<Linger>(Linger{std::move(socket), std::move(timer), {}});
  linger->timer.async_wait([linger](const boost::system::error_code&) {
    boost::system::error_code ignored;
    linger->socket.close(ignored);
  });
  struct Drain {
    std::shared_ptr<Linger> linger;
    std::atomic<int>* count;
    void operator()(const boost::system::error_code& e, std::size_t) const {
      if (e) {
        boost::system::error_code ignored;
        linger->timer.cancel();
        linger->socket.close(ignored);
        --*count;
        return;
      }
      linger->socket.async_read_some(asio::buffer(linger->sink), *this);
    }
  };
  linger->socket.async_read_some(asio::buffer(linger->sink), Drain{linger, &lingering});
}

void Server::Impl::begin_shutdown() {
  if (shutdown_started) return;
  shutdown_started = true;
  boost::system::error_code ec;
  acceptor->close(ec);
  for (const auto& s : live_sessions()) s->on_shutdown();
  shutdown_timer.emplace(*ioc, seconds(options.shutdown_timeout_s));
  shutdown_timer->async_wait(asio::bind_executor(*accept_strand, [this](const boost::system::error_code&) { end_grace(); }));
  check_drained();
}

void Server::Impl::end_grace() {
  if (grace_over) return;
  grace_over = true;
  for (const auto& s : live_sessions()) s->on_grace_over();
  shutdown_timer->expires_after(kFinalFlush);
  shutdown_timer->async_wait(asio::bind_executor(*accept_strand, [this](const boost::system::error_code& ec) {
    if (!ec) ioc->stop();  // whatever is still writing is cut off
  }));
}

// During shutdown: ends run() once no connection and no request being prepared is left
// (connections unregister in their destructors, so this looks every 20 ms).
void Server::Impl::check_drained() {
  if (session_count() == 0 && pending_prepares.load() == 0) {
    ioc->stop();
    return;
  }
  auto timer = std::make_shared<asio::steady_timer>(*ioc, 20ms);
  timer->async_wait(asio::bind_executor(*accept_strand, [this, timer](const boost::system::error_code&) { check_drained(); }));
}

Server::Server(ServerOptions options, std::function<LoadedModel()> load)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(load))) {}

Server::~Server() { stop(); }

void Server::stop() {
  Impl& s = *impl_;
  {
    std::lock_guard lock(s.state_mu);
    s.stopping = true;
    if (s.ioc && s.accept_strand) asio::post(*s.accept_strand, [&s] { s.begin_shutdown(); });
  }
}

void Server::run(const std::function<void(int port)>& on_bound) {
  Impl& s = *impl_;
  const std::size_t fd_limit = raise_fd_limit();
  const std::size_t wanted = s.options.max_connections > 0 ? static_cast<std::size_t>(s.options.max_connections) : 4096;
  s.max_connections = std::max<std::size_t>(1, std::min(wanted, fd_limit > 128 ? fd_limit - 64 : fd_limit / 2));
  {
    std::lock_guard lock(s.state_mu);
    // The hint is the number of threads that run it (a hint of 1 would let the scheduler skip
    // waking a thread blocked in epoll when another thread posts work).
    s.ioc.emplace(s.options.http_threads > 0 ? s.options.http_threads : 2);
    s.accept_strand.emplace(asio::make_strand(*s.ioc));
  }
  {
    boost::system::error_code ec;
    const auto address = asio::ip::make_address(s.options.host, ec);
    if (ec) fail("cannot bind {}: not an IP address", s.options.host);
    const tcp::endpoint endpoint(address, static_cast<unsigned short>(s.options.port));
    tcp::acceptor acceptor(*s.accept_strand);
    acceptor.open(endpoint.protocol(), ec);
    // SO_REUSEADDR only (no SO_REUSEPORT): a busy port must be an error, not a shared one.
    if (!ec) acceptor.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor.bind(endpoint, ec);
    if (!ec) acceptor.listen(1024, ec);
    if (ec) {
      if (s.options.port == 0) fail("cannot bind {}: {}", s.options.host, ec.message());
      fail("cannot bind {}:{} (in use, or not an address of this machine): {}", s.options.host, s.options.port,
           ec.message());
    }
    s.acceptor.emplace(std::move(acceptor));
  }
  const int port = s.acceptor->local_endpoint().port();
  if (on_bound) on_bound(port);

  std::thread loop;
  std::thread loader([&s, &loop] {
    try {
      const auto start = Clock::now();
      LoadedModel loaded = s.load();
      if (!loaded.engine || !loaded.codec) fail("the model loader returned no engine or no tokenizer");
      loaded.engine->require_cache_for_max_model_len();
      s.model = std::move(loaded);
      s.limits.vocab_size = s.model.engine->model_config().vocab_size;
      s.limits.max_logprobs = std::min(s.options.max_logprobs, s.limits.vocab_size);
      std::size_t longest = 1;
      for (std::int64_t id = 0; id < s.limits.vocab_size; ++id) {
        longest = std::max(longest, s.model.codec->token_text(static_cast<std::int32_t>(id)).size());
      }
      s.max_token_bytes = longest;
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
      Server::Impl* impl = &s;
      std::lock_guard lock(s.state_mu);
      s.stopping = true;
      asio::post(*s.accept_strand, [impl] { impl->begin_shutdown(); });
    }
  });

  // The threads that touch sockets and the prepare pool start with SIGPIPE blocked (asio
  // sends with MSG_NOSIGNAL; this is belt and braces) and inherit the caller's signal mask.
  // Work from the start: run() must not return before the first handler is queued; only
  // ioc->stop() (shutdown drained, or its final timer) ends it.
  auto work = asio::make_work_guard(*s.ioc);
  asio::post(*s.accept_strand, [&s] {
    if (s.stopping) {
      s.begin_shutdown();
    } else {
      s.start_accept();
    }
  });
  const int threads = s.options.http_threads > 0 ? s.options.http_threads : 2;
  std::vector<std::thread> io_threads = with_sigpipe_blocked([&s, threads] {
    s.prepare_pool.emplace(static_cast<std::size_t>(std::max(1, s.options.prepare_threads)));
    std::vector<std::thread> started;
    for (int i = 0; i < threads; ++i) started.emplace_back([&s] { s.ioc->run(); });
    return started;
  });
  for (std::thread& t : io_threads) t.join();
  work.reset();
  {
    std::lock_guard lock(s.state_mu);
    s.stopping = true;
  }
  s.prepare_pool->join();
  loader.join();
  // The loop thread posts to connections: it ends before the io_context goes.
  s.loop_running = false;
  if (loop.joinable()) loop.join();
  // Handlers still queued hold connections (and their requests): destroying them aborts those.
  s.shutdown_timer.reset();
  s.acceptor.reset();
  {
    std::lock_guard lock(s.state_mu);
    s.accept_strand.reset();
    s.ioc.reset();
  }
  s.prepare_pool.reset();
  std::lock_guard lock(s.state_mu);
  if (!s.load_error.empty()) fail("{}", s.load_error);
}

}  // namespace dsv4::server
