// Writing to sockets without touching the process's SIGPIPE disposition.
//
// A write to a socket whose peer has gone raises SIGPIPE, which ends the process by default; a
// library must not decide for the whole process how every other file descriptor behaves. Asio
// sends with MSG_NOSIGNAL, and the server also keeps SIGPIPE blocked on the threads it starts
// for HTTP work, and only there: a write to a closed peer then fails with EPIPE; the signal
// stays pending on that thread, blocked, and is never delivered.
#pragma once

#include <signal.h>

#include <utility>

namespace dsv4::server {

// While alive: SIGPIPE is blocked on the constructing thread (threads it starts inherit the
// mask). The destructor restores the thread's previous mask.
class SigpipeBlock {
 public:
  SigpipeBlock();
  ~SigpipeBlock();
  SigpipeBlock(const SigpipeBlock&) = delete;
  SigpipeBlock& operator=(const SigpipeBlock&) = delete;

 private:
  sigset_t previous_;
};

// Calls `start` (which starts threads: a thread pool, a std::thread) with SIGPIPE blocked on
// the calling thread, so that the threads it starts keep it blocked; returns what `start` returns.
template <typename Start>
auto with_sigpipe_blocked(Start&& start) {
  SigpipeBlock block;
  return std::forward<Start>(start)();
}

}  // namespace dsv4::server
