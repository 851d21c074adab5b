// Test helpers: a `dsv4 serve` child process on 127.0.0.1, an SSE client, /metrics parsing.
#pragma once

#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "http_client.h"
#include "text/bpe_trainer.h"

extern char** environ;

namespace dsv4::test {

using Json = nlohmann::json;
using namespace std::chrono_literals;

inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs `argv` with stdout and stderr going to `log`; returns the pid (or -1). The child gets
// SIGTERM if the test process dies first, so a crashed test leaves no server behind.
inline pid_t spawn(const std::vector<std::string>& argv, const std::filesystem::path& log) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const std::string log_path = log.string();
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid != 0) return pid;
  // The child: only async-signal-safe calls until exec.
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() != parent) _exit(127);
  const int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) _exit(127);
  dup2(fd, 1);
  dup2(fd, 2);
  close(fd);
  execve(args[0], args.data(), environ);
  _exit(127);
}

// Waits for `pid` up to `timeout`; returns its exit status, or nullopt if it is still running.
inline std::optional<int> wait_exit(pid_t pid, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    int status = 0;
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (r < 0) return -1;
    if (std::chrono::steady_clock::now() > deadline) return std::nullopt;
    std::this_thread::sleep_for(10ms);
  }
}

inline int run_command(const std::vector<std::string>& argv, const std::filesystem::path& log) {
  const pid_t pid = spawn(argv, log);
  if (pid < 0) return -1;
  auto status = wait_exit(pid, 120s);
  if (!status) {
    kill(pid, SIGKILL);
    wait_exit(pid, 5s);
    return -1;
  }
  return *status;
}

// A fresh directory /tmp/PREFIX_XXXXXX holding the built-in tiny model at DIR/model (made by
// `binary make-model`, with the tiny model's own tokenizer when make-model wrote none); empty
// when that failed (DIR/make.log says why).
inline std::filesystem::path make_tiny_model_dir(const std::string& binary, const std::string& prefix) {
  std::string pattern = "/tmp/" + prefix + "_XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) return {};
  const std::filesystem::path dir(pattern);
  if (run_command({binary, "make-model", "--preset", "tiny", "--out", (dir / "model").string()}, dir / "make.log") != 0) {
    return {};
  }
  if (!std::filesystem::exists(dir / "model" / "tokenizer.json")) write_tiny_tokenizer(dir / "model");
  return dir;
}

// A running `dsv4 serve`: started with --port 0, its port read from its log.
class ServerProcess {
 public:
  bool start(const std::string& binary, std::vector<std::string> args, const std::filesystem::path& log,
             std::chrono::seconds timeout = 90s) {
    log_ = log;
    std::vector<std::string> argv{binary, "serve", "--host", "127.0.0.1", "--port", "0"};
    argv.insert(argv.end(), args.begin(), args.end());
    pid_ = spawn(argv, log);
    if (pid_ < 0) return false;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    const std::string marker = "listening on http://127.0.0.1:";
    while (port_ <= 0) {
      const std::string text = read_file(log);
      if (auto at = text.find(marker); at != std::string::npos) port_ = std::atoi(text.c_str() + at + marker.size());
      if (port_ > 0) break;
      if (wait_exit(pid_, 0ms) || std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(20ms);
    }
    HttpClient client("127.0.0.1", port_);
    client.set_connection_timeout(1);
    client.set_read_timeout(2);
    while (std::chrono::steady_clock::now() < deadline) {
      auto res = client.Get("/health");
      if (res && res->status == 200) return true;
      if (wait_exit(pid_, 0ms)) return false;
      std::this_thread::sleep_for(50ms);
    }
    return false;
  }

  // SIGTERM, then SIGKILL after `grace`; returns the exit status (-1 if it had to be killed).
  int stop(std::chrono::milliseconds grace = 15s) {
    if (pid_ <= 0) return -1;
    kill(pid_, SIGTERM);
    std::optional<int> status = wait_exit(pid_, grace);
    if (!status) {
      kill(pid_, SIGKILL);
      wait_exit(pid_, 5s);
      status = -1;
    }
    pid_ = -1;
    return *status;
  }

  bool alive() const { return pid_ > 0 && kill(pid_, 0) == 0; }
  pid_t pid() const { return pid_; }
  void forget() { pid_ = -1; }  // the caller has reaped the process
  int port() const { return port_; }
  std::string log() const { return read_file(log_); }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  std::filesystem::path log_;
};

struct StreamResult {
  int status = 0;
  HttpError error = HttpError::Success;
  std::vector<Json> events;  // parsed data: lines, [DONE] excluded
  bool done = false;         // saw data: [DONE]
  std::string raw;
};

// POSTs `body` and reads the SSE stream; `on_event` may return false to hang up.
inline StreamResult post_stream(HttpClient& client, const std::string& path, const Json& body,
                                const std::function<bool(const Json&)>& on_event = {}) {
  StreamResult result;
  std::string buffer;
  bool hang_up = false;
  auto receive = [&](const char* data, std::size_t n) {
    result.raw.append(data, n);
    buffer.append(data, n);
    std::size_t end;
    while ((end = buffer.find("\n\n")) != std::string::npos) {
      const std::string event = buffer.substr(0, end);
      buffer.erase(0, end + 2);
      if (event.rfind("data: ", 0) != 0) continue;
      const std::string payload = event.substr(6);
      if (payload == "[DONE]") {
        result.done = true;
        continue;
      }
      Json j = Json::parse(payload, nullptr, false);
      result.events.push_back(j);
      if (on_event && !on_event(j)) hang_up = true;
    }
    return !hang_up;
  };
  HttpResult res = client.send("POST", path, body.dump(), "application/json", {}, receive);
  result.error = res.error();
  if (res) result.status = res->status;
  if (!res && result.error == HttpError::Canceled) result.status = 200;  // hung up mid-stream
  return result;
}

// The value of the sample `name{...}` (first match), or nullopt.
inline std::optional<double> metric_value(const std::string& text, const std::string& name,
                                          const std::string& label_filter = {}) {
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(name + "{", 0) != 0) continue;
    if (!label_filter.empty() && line.find(label_filter) == std::string::npos) continue;
    return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return std::nullopt;
}

}  // namespace dsv4::test
