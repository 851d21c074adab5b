// ConnectionProbe: has the client of an HTTP request hung up?
//
// cpp-httplib does not hand its socket to handlers, and a write to a closed peer only fails
// one or two writes later -- too late for a request that is still queued, prefilling, or not
// streaming at all. So the probe finds the connection's socket by its address pair (local
// port, peer address and port: unique while the handler runs, because the connection stays
// open until the handler returns) through /proc, and asks the kernel whether the peer has
// closed it (poll POLLRDHUP, which consumes no data). Linux only; where the socket cannot be
// found, closed() stays false and write failures are the signal.
#pragma once

#include <string>

namespace dsv4::server {

class ConnectionProbe {
 public:
  ConnectionProbe() = default;
  ConnectionProbe(const std::string& remote_addr, int remote_port, int local_port);

  bool found() const { return fd_ >= 0; }
  // True once the peer has closed or reset the connection.
  bool closed() const;

 private:
  int fd_ = -1;
};

}  // namespace dsv4::server
