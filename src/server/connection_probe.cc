// Polling a connection's socket for hang-up (connection_probe.h).
#include "server/connection_probe.h"

#include <poll.h>

namespace dsv4::server {

bool ConnectionProbe::closed() const {
  if (fd_ < 0) return false;
  pollfd p{fd_, POLLRDHUP, 0};
  const int n = ::poll(&p, 1, 0);
  return n > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

}  // namespace dsv4::server
