// A small blocking HTTP/1.1 client over raw sockets for the server tests: one connection per
// request (Connection: close), Content-Length, chunked or read-to-close bodies, timeouts, and
// RawConnection for tests that write bytes no well-behaved client would.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dsv4::test {

enum class HttpError { Success, Connection, Write, Read, Timeout, Canceled };

inline std::string to_string(HttpError e) {
  switch (e) {
    case HttpError::Success: return "success";
    case HttpError::Connection: return "connection failed";
    case HttpError::Write: return "write failed";
    case HttpError::Read: return "read failed";
    case HttpError::Timeout: return "timed out";
    case HttpError::Canceled: return "canceled";
  }
  return "?";
}

inline std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

struct HttpResponse {
  int status = 0;
  std::multimap<std::string, std::string> headers;  // names in lower case
  std::string body;
  std::string get_header_value(const std::string& name) const {
    auto it = headers.find(lower(name));
    return it == headers.end() ? std::string() : it->second;
  }
  bool has_header(const std::string& name) const { return headers.count(lower(name)) > 0; }
};

class HttpResult {
 public:
  HttpResult(HttpError e) : error_(e) {}  // NOLINT: implicit
  HttpResult(HttpResponse r) : response_(std::move(r)) {}  // NOLINT
  explicit operator bool() const { return response_.has_value(); }
  const HttpResponse* operator->() const { return &*response_; }
  const HttpResponse& operator*() const { return *response_; }
  HttpError error() const { return error_; }

 private:
  std::optional<HttpResponse> response_;
  HttpError error_ = HttpError::Success;
};

// A TCP connection to 127.0.0.1:port with a read deadline per call.
class RawConnection {
 public:
  RawConnection() = default;
  explicit RawConnection(int port, std::chrono::milliseconds connect_timeout = std::chrono::seconds(5)) {
    connect_to(port, connect_timeout);
  }
  ~RawConnection() { close(); }
  RawConnection(RawConnection&& o) noexcept : fd_(std::exchange(o.fd_, -1)), buffer_(std::move(o.buffer_)) {}
  RawConnection& operator=(RawConnection&& o) noexcept {
    if (this != &o) {
      close();
      fd_ = std::exchange(o.fd_, -1);
      buffer_ = std::move(o.buffer_);
    }
    return *this;
  }

  bool connect_to(int port, std::chrono::milliseconds timeout) {
    close();
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd_ < 0) return false;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<std::uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      if (errno != EINPROGRESS || !wait(POLLOUT, timeout)) return close(), false;
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) return close(), false;
    }
    int yes = 1;
    setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof(yes));
    return true;
  }

  bool ok() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  void shutdown_write() {
    if (fd_ >= 0) ::shutdown(fd_, SHUT_WR);
  }

  // Writes all of `data` (false on error or after `timeout`).
  bool send(std::string_view data, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!data.empty()) {
      const ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
      if (n > 0) {
        data.remove_prefix(static_cast<std::size_t>(n));
        continue;
      }
      if (n < 0 && errno != EAGAIN && errno != EINTR) return false;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0 || !wait(POLLOUT, left)) return false;
    }
    return true;
  }

  // Reads what arrives within `timeout` (at least one byte, unless the peer closed or the time
  // ran out). Returns Success with bytes appended, Read on close/error, Timeout.
  HttpError read_some(std::string& out, std::chrono::milliseconds timeout) {
    if (!buffer_.empty()) {
      out += buffer_;
      buffer_.clear();
      return HttpError::Success;
    }
    if (!wait(POLLIN, timeout)) return HttpError::Timeout;
    char chunk[16384];
    const ssize_t n = ::recv(fd_, chunk, sizeof(chunk), 0);
    if (n <= 0) return HttpError::Read;
    out.append(chunk, static_cast<std::size_t>(n));
    return HttpError::Success;
  }

  // True when the peer has closed the connection (EOF or reset) within `timeout`; data that
  // arrives meanwhile is kept for later reads.
  bool closed_within(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() < 0) return false;
      if (!wait(POLLIN, left)) return false;
      char chunk[16384];
      const ssize_t n = ::recv(fd_, chunk, sizeof(chunk), 0);
      if (n <= 0) return true;
      buffer_.append(chunk, static_cast<std::size_t>(n));
    }
  }

  // Reads one response (head and body); `on_data` gets the decoded body as it arrives and may
  // return false to stop reading.
  HttpResult read_response(std::chrono::milliseconds timeout,
                           const std::function<bool(const char*, std::size_t)>& on_data = {}, bool head_only = false) {
    HttpResponse res;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    auto fill = [&](std::string& buf) -> HttpError {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return HttpError::Timeout;
      return read_some(buf, left);
    };
    std::string buf = std::move(buffer_);
    buffer_.clear();
    std::size_t end;
    while ((end = buf.find("\r\n\r\n")) == std::string::npos) {
      if (HttpError e = fill(buf); e != HttpError::Success) return e;
    }
    const std::string head = buf.substr(0, end);
    buf.erase(0, end + 4);
    if (head.size() < 12 || head.compare(0, 5, "HTTP/") != 0) return HttpError::Read;
    res.status = std::atoi(head.c_str() + 9);
    std::size_t at = head.find("\r\n");
    while (at != std::string::npos && at < head.size()) {
      const std::size_t next = head.find("\r\n", at + 2);
      const std::string line = head.substr(at + 2, next == std::string::npos ? std::string::npos : next - at - 2);
      const std::size_t colon = line.find(':');
      if (colon != std::string::npos) {
        std::string value = line.substr(colon + 1);
        while (!value.empty() && value.front() == ' ') value.erase(0, 1);
        res.headers.emplace(lower(line.substr(0, colon)), value);
      }
      at = next;
    }
    if (res.status == 100) {
      buffer_ = std::move(buf);
      return read_response(timeout, on_data, head_only);
    }
    auto deliver = [&](const char* data, std::size_t n) {
      if (on_data) return on_data(data, n);
      res.body.append(data, n);
      return true;
    };
    if (head_only) {
      buffer_ = std::move(buf);
      return res;
    }
    if (lower(res.get_header_value("transfer-encoding")) == "chunked") {
      while (true) {
        while ((end = buf.find("\r\n")) == std::string::npos) {
          if (HttpError e = fill(buf); e != HttpError::Success) return e;
        }
        const std::size_t size = std::stoul(buf.substr(0, end), nullptr, 16);
        buf.erase(0, end + 2);
        while (buf.size() < size + 2) {
          if (HttpError e = fill(buf); e != HttpError::Success) return e;
        }
        if (size == 0) {
          buf.erase(0, 2);
          break;
        }
        if (!deliver(buf.data(), size)) return HttpError::Canceled;
        buf.erase(0, size + 2);
      }
    } else if (res.has_header("content-length")) {
      const std::size_t size = std::stoul(res.get_header_value("content-length"));
      while (buf.size() < size) {
        if (HttpError e = fill(buf); e != HttpError::Success) return e;
      }
      if (!deliver(buf.data(), size)) return HttpError::Canceled;
      buf.erase(0, size);
    } else {
      while (true) {
        if (!buf.empty() && !deliver(buf.data(), buf.size())) return HttpError::Canceled;
        buf.clear();
        const HttpError e = fill(buf);
        if (e == HttpError::Read) break;
        if (e != HttpError::Success) return e;
      }
    }
    buffer_ = std::move(buf);
    return res;
  }

 private:
  bool wait(short events, std::chrono::milliseconds timeout) {
    pollfd p{fd_, events, 0};
    const int n = ::poll(&p, 1, static_cast<int>(std::max<std::int64_t>(0, timeout.count())));
    return n > 0;
  }

  int fd_ = -1;
  std::string buffer_;  // bytes read past the last response
};

// A client for one request per connection, with timeouts and bearer authentication.
class HttpClient {
 public:
  HttpClient(std::string host, int port) : host_(std::move(host)), port_(port) {}
  void set_connection_timeout(int s) { connect_timeout_ = std::chrono::seconds(s); }
  void set_read_timeout(int s, int us = 0) { read_timeout_ = std::chrono::seconds(s) + std::chrono::microseconds(us); }
  void set_write_timeout(int s) { write_timeout_ = std::chrono::seconds(s); }
  void set_bearer_token_auth(const std::string& key) { auth_ = "Bearer " + key; }

  using Headers = std::vector<std::pair<std::string, std::string>>;
  HttpResult Get(const std::string& path, const Headers& headers = {}) { return send("GET", path, {}, {}, headers); }
  HttpResult Post(const std::string& path, const std::string& body, const std::string& content_type,
                  const Headers& headers = {}) {
    return send("POST", path, body, content_type, headers);
  }

  // One request; `on_data` as in RawConnection::read_response. The read timeout bounds the
  // whole response.
  HttpResult send(const std::string& method, const std::string& path, const std::string& body,
                  const std::string& content_type, const Headers& headers = {},
                  const std::function<bool(const char*, std::size_t)>& on_data = {}) {
    RawConnection c;
    if (!c.connect_to(port_, connect_timeout_)) return HttpError::Connection;
    std::string req = method + " " + path + " HTTP/1.1\r\nHost: " + host_ + ":" + std::to_string(port_) +
                      "\r\nConnection: close\r\n";
    if (!auth_.empty()) req += "Authorization: " + auth_ + "\r\n";
    if (!content_type.empty()) req += "Content-Type: " + content_type + "\r\n";
    if (method == "POST" || !body.empty()) req += "Content-Length: " + std::to_string(body.size()) + "\r\n";
    for (const auto& [name, value] : headers) req += name + ": " + value + "\r\n";
    req += "\r\n";
    req += body;
    if (!c.send(req, write_timeout_)) return HttpError::Write;
    return c.read_response(std::chrono::duration_cast<std::chrono::milliseconds>(read_timeout_), on_data,
                           method == "HEAD");
  }

 private:
  std::string host_;
  int port_;
  std::chrono::milliseconds connect_timeout_ = std::chrono::seconds(5);
  std::chrono::microseconds read_timeout_ = std::chrono::seconds(30);
  std::chrono::milliseconds write_timeout_ = std::chrono::seconds(10);
  std::string auth_;
};

}  // namespace dsv4::test
