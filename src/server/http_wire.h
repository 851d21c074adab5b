// The bytes of HTTP/1.1 responses the server writes, and the rules it applies to a request's
// head before reading its body. No sockets here: server.cc does the I/O with Boost.Beast.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dsv4::server {

using HeaderList = std::vector<std::pair<std::string, std::string>>;

// A whole response: status line, Content-Type / Content-Length / Connection and `extra`, then
// the body (left out when `head_only`, for HEAD; Content-Length still says its size).
std::string render_response(int status, std::string_view content_type, std::string_view body, bool keep_alive,
                            const HeaderList& extra = {}, bool head_only = false);
// The head of a streamed (SSE) response: chunked for HTTP/1.1, read-to-close for HTTP/1.0.
std::string render_stream_head(bool chunked, bool keep_alive);
// One chunk of a chunked body ("" for empty data: nothing, since a zero-length chunk ends it),
// and the zero-length chunk that ends the body.
std::string render_chunk(std::string_view data);
inline constexpr std::string_view kLastChunk = "0\r\n\r\n";

// The routes and the methods each allows.
enum class Route { kNone, kCompletions, kChat, kModels, kHealth, kMetrics };
Route route_of(std::string_view target);  // the path of `target` (query ignored)
// "POST" for the generation routes, "GET, HEAD" for the others.
std::string_view allowed_methods(Route route);
bool method_allowed(Route route, std::string_view method);

// What the head of a request (already parsed) says about its body, and the status that refuses
// it before any body byte is read: 411 (POST without a length), 400 (a Transfer-Encoding that
// does not end in chunked), 415 (a Content-Encoding other than identity), 413 (a declared
// length over the limit). nullopt: read the body.
struct BodyFraming {
  std::string_view method;
  bool chunked = false;
  std::optional<std::size_t> content_length;
  bool has_transfer_encoding = false;
  std::string_view content_encoding;  // empty when absent
};
struct HeadRefusal {
  int status = 400;
  std::string message;
  std::string code;
};
std::optional<HeadRefusal> refuse_body(const BodyFraming& framing, std::size_t max_body_bytes);

// Constant-time comparison (for API keys): the time depends on the lengths only.
bool constant_time_equal(std::string_view a, std::string_view b);

}  // namespace dsv4::server
