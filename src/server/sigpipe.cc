// SIGPIPE blocked per thread (sigpipe.h).
#include "server/sigpipe.h"

#include <pthread.h>

namespace dsv4::server {

// pthread_sigmask fails only for an invalid `how`: no error to report here or below.
SigpipeBlock::SigpipeBlock() {
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, &previous_);
}

SigpipeBlock::~SigpipeBlock() { pthread_sigmask(SIG_SETMASK, &previous_, nullptr); }

}  // namespace dsv4::server
