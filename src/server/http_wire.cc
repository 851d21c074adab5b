// Response bytes and request-head rules (http_wire.h).
#include "server/http_wire.h"

#include <boost/beast/http/status.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cctype>

namespace dsv4::server {
namespace {

std::string status_line(int status) {
  const auto reason = boost::beast::http::obsolete_reason(static_cast<boost::beast::http::status>(status));
  return fmt::format("HTTP/1.1 {} {}\r\n", status, std::string_view(reason.data(), reason.size()));
}

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

}  // namespace

std::string render_response(int status, std::string_view content_type, std::string_view body, bool keep_alive,
                            const HeaderList& extra, bool head_only) {
  std::string out = status_line(status);
  if (!content_type.empty()) out += fmt::format("Content-Type: {}\r\n", content_type);
  out += fmt::format("Content-Length: {}\r\n", body.size());
  out += keep_alive ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
  for (const auto& [name, value] : extra) out += fmt::format("{}: {}\r\n", name, value);
  out += "\r\n";
  if (!head_only) out.append(body);
  return out;
}

std::string render_stream_head(bool chunked, bool keep_alive) {
  std::string out = status_line(200);
  out += "Content-Type: text/event-stream\r\nCache-Control: no-cache\r\n";
  if (chunked) out += "Transfer-Encoding: chunked\r\n";
  out += keep_alive && chunked ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
  out += "\r\n";
  return out;
}

std::string render_chunk(std::string_view data) {
  if (data.empty()) return {};
  std::string out = fmt::format("{:x}\r\n", data.size());
  out.append(data);
  out += "\r\n";
  return out;
}

Route route_of(std::string_view target) {
  const std::string_view path = target.substr(0, target.find('?'));
  if (path == "/v1/completions") return Route::kCompletions;
  if (path == "/v1/chat/completions") return Route::kChat;
  if (path == "/v1/models") return Route::kModels;
  if (path == "/health") return Route::kHealth;
  if (path == "/metrics") return Route::kMetrics;
  return Route::kNone;
}

std::string_view allowed_methods(Route route) {
  return route == Route::kCompletions || route == Route::kChat ? "POST" : "GET, HEAD";
}

bool method_allowed(Route route, std::string_view method) {
  if (route == Route::kCompletions || route == Route::kChat) return method == "POST";
  return method == "GET" || method == "HEAD";
}

std::optional<HeadRefusal> refuse_body(const BodyFraming& f, std::size_t max_body_bytes) {
  if (f.has_transfer_encoding && !f.chunked) {
    return HeadRefusal{400, "Transfer-Encoding must end in chunked.", "invalid_transfer_encoding"};
  }
  if (f.method == "POST" && !f.chunked && !f.content_length) {
    return HeadRefusal{411, "A POST needs a Content-Length or Transfer-Encoding: chunked.", "length_required"};
  }
  const bool has_body = f.chunked || f.content_length.value_or(0) > 0;
  if (has_body && !f.content_encoding.empty() && !iequals(f.content_encoding, "identity")) {
    return HeadRefusal{415,
                       fmt::format("Content-Encoding '{}' is not supported; send the body uncompressed.",
                                   f.content_encoding),
                       "unsupported_content_encoding"};
  }
  if (f.content_length && *f.content_length > max_body_bytes) {
    return HeadRefusal{413, fmt::format("The request body is larger than the limit of {} bytes.", max_body_bytes),
                       "request_too_large"};
  }
  return std::nullopt;
}

bool constant_time_equal(std::string_view a, std::string_view b) {
  unsigned diff = a.size() == b.size() ? 0u : 1u;
  for (std::size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned>(a[i] ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

}  // namespace dsv4::server
