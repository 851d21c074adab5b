// Writing to sockets without touching the process's SIGPIPE disposition.
//
// A write to a socket whose peer has gone raises SIGPIPE, which ends the process by default.
// cpp-httplib, as Debian builds it, sends without MSG_NOSIGNAL, and its Server constructor sets
// SIGPIPE to ignored for the whole process; a library must not decide for the whole process how
// every other file descriptor behaves. So the server puts SIGPIPE's disposition back right after
// constructing httplib's server (SavedSigpipeDisposition), and keeps SIGPIPE blocked on the
// threads it starts for HTTP work, and only there: a write to a closed peer then fails with
// EPIPE, as httplib expects; the signal stays pending on that thread, blocked, and is never
// delivered.
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

// SIGPIPE's disposition when constructed; restore() sets it again. (Another thread changing it
// in between loses that change: construct and restore close together.)
class SavedSigpipeDisposition {
 public:
  SavedSigpipeDisposition();
  void restore() const;

 private:
  struct sigaction saved_ {};
};

// Calls `start` (which starts threads: a thread pool, a std::thread) with SIGPIPE blocked on
// the calling thread, so that the threads it starts keep it blocked; returns what `start` returns.
template <typename Start>
auto with_sigpipe_blocked(Start&& start) {
  SigpipeBlock block;
  return std::forward<Start>(start)();
}

}  // namespace dsv4::server
